import subprocess
import sys

import pytest

from workbench.config import ConfigError, RunConfig, knob_info, load_config, parse_sets


def test_defaults_are_valid():
    cfg = RunConfig()
    assert cfg.method == "mezo" and cfg.steps > 0


@pytest.mark.parametrize("changes, field", [
    ({"lr": -1.0}, "lr"),
    ({"method": "sgd"}, "method"),
    ({"model": "gpt-17"}, "model"),
    ({"steps": 0}, "steps"),
    ({"amp": "fp64"}, "amp"),
    ({"batch_size": 2.5}, "batch_size"),
    ({"data": "nowhere"}, "data"),
    ({"estimator": "forward"}, "estimator"),  # these three went unchecked (2026-11-28)
    ({"zo_optimizer": "adamw"}, "zo_optimizer"),
    ({"slot_dtype": "fp8", "method": "zo-offload"}, "slot_dtype"),
])
def test_bad_values_name_the_field(changes, field):
    with pytest.raises(ConfigError) as err:
        RunConfig(**changes)
    assert any(p.startswith(f"{field}:") for p in err.value.problems)


def test_all_errors_reported_at_once():
    with pytest.raises(ConfigError) as err:
        RunConfig(lr=-1.0, steps=0)
    assert {p.split(":")[0] for p in err.value.problems} == {"lr", "steps"}


def test_toml_and_overrides(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text('[run]\nmethod = "zo-offload"\nsteps = 7\nlr = 1e-5\n')
    cfg = load_config(f, parse_sets(["steps=9", "overlap=false", "eps=1e-2"]))
    assert (cfg.method, cfg.steps, cfg.lr, cfg.overlap, cfg.eps) == ("zo-offload", 9, 1e-5, False, 1e-2)


def test_unknown_setting_is_named():
    with pytest.raises(ConfigError, match="colour: unknown setting"):
        load_config(None, {"colour": "red"})


def test_knob_info_has_choices_and_ranges():
    assert "zo-offload" in knob_info("method")["choices"]
    assert knob_info("steps")["lo"] == 1


def test_every_knob_of_a_fixed_set_of_values_offers_its_choices():
    """Each field's annotation resolves to a type (an unknown one is an error, not a knob
    without checks), and every Literal knob lists its choices: the panel's dropdown, the sweep
    widget and the checks read them (estimator, zo_optimizer and slot_dtype had none)."""
    from dataclasses import fields
    from typing import Literal, get_origin

    from workbench.config.kinds import resolve_type

    for f in fields(RunConfig):
        t = resolve_type(f.type)
        assert not isinstance(t, str), f.name
        if get_origin(t) is Literal:
            assert knob_info(f.name)["choices"] == t.__args__, f.name
    assert knob_info("zo_optimizer")["choices"] == ("sgd", "sign", "momentum", "adam", "hizoo")
    assert knob_info("directions")["choices"] == ("gaussian", "rademacher")
    with pytest.raises(TypeError, match="Nope"):
        resolve_type("Nope")


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "workbench", *args], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("setting, field", [
    ("lr=-1", "lr"), ("method=sgd", "method"), ("model=gpt-17", "model"), ("steps=0", "steps"),
    ("zo_optimizer=adamw", "zo_optimizer"),  # was a KeyError traceback
])
def test_cli_bad_value_exits_nonzero_with_one_line(setting, field, tmp_path):
    r = _cli("run", "--set", setting, "--out", str(tmp_path / "r"), "--quiet")
    assert r.returncode == 2
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}:")
    assert not (tmp_path / "r").exists()  # nothing was built or written


def test_cli_cuda_without_gpu(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    r = _cli("run", "--set", "device=cuda", "--out", str(tmp_path / "r"), "--quiet")
    assert r.returncode == 2 and "device:" in r.stderr


@pytest.mark.parametrize("changes, line", [
    ({"lr": float("nan")}, "lr: nan is not a finite number"),
    ({"eps": float("inf")}, "eps: inf is not a finite number"),
    ({"seq_len": 513}, "seq_len: 513 exceeds the 512 positions of tiny-opt"),
    ({"codec": "bf16"}, "codec: bf16 with master=fp32 leaves mezo's weights in fp32"),
    ({"method": "forward-grad", "adam_beta1": 0.8}, "adam_beta1: 0.8 does not apply"),
    ({"method": "zo-offload", "adam_beta1": 0.8},
     "adam_beta1: applies only with zo_optimizer=adam (this run has zo_optimizer=sgd)"),
    ({"method": "fo", "subgroup_size": 4096}, "subgroup_size: 4096 does not apply to method=fo"),
    ({"method": "fo", "update_threads": 4}, "update_threads: 4 does not apply to method=fo"),
    ({"method": "fo-offload", "update_threads": -1}, "update_threads: -1"),
    ({"data": "synthetic", "eval_every": 5}, "eval_every: data=synthetic has no dev split"),
])
def test_values_that_cannot_work_are_refused(changes, line):
    with pytest.raises(ConfigError) as err:
        RunConfig(**changes)
    assert any(p.startswith(line) for p in err.value.problems), err.value.problems


def test_knobs_of_another_method_at_their_defaults_are_fine():
    assert RunConfig(method="fo", eps=1e-3, codec="fp32").method == "fo"


@pytest.mark.parametrize("text, line", [
    ("[run]\nsteps = 3\n[optim]\nlr = 1.0\n", "table [optim] is not read"),
    ("steps = 3\n[run]\nlr = 1e-3\n", "key 'steps' is outside [run]"),
    ("[other]\nsteps = 3\n", "table [other] is not read"),
    ("run = 3\n", "'run' must be a table"),
    ("[run]\nlr = nan\n", "lr: nan is not a finite number"),
])
def test_toml_outside_run_is_refused_not_ignored(tmp_path, text, line):
    (tmp_path / "c.toml").write_text(text)
    with pytest.raises(ConfigError, match=line.replace("[", r"\[").replace("]", r"\]")):
        load_config(tmp_path / "c.toml")


def test_a_config_that_is_a_folder_or_binary_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="is a folder, not a TOML file"):
        load_config(tmp_path)
    (tmp_path / "b.toml").write_bytes(bytes(range(128, 256)))
    with pytest.raises(ConfigError, match="is not a text file"):
        load_config(tmp_path / "b.toml")


def test_local_model_folders_are_checked_before_anything_loads(tmp_path):
    import json

    def problems(conf, weights=True):
        d = tmp_path / str(len(list(tmp_path.iterdir())))
        d.mkdir()
        if conf is not None:
            (d / "config.json").write_text(conf if isinstance(conf, str) else json.dumps(conf))
        if weights:
            (d / "model.safetensors").write_bytes(b"")
        with pytest.raises(ConfigError) as err:
            RunConfig(model=str(d), seq_len=64)
        return " ".join(err.value.problems)

    assert "has no config.json" in problems(None)
    assert "not readable JSON" in problems("{not json")
    assert "trust_remote_code=False" in problems({"model_type": "opt", "auto_map": {}})
    assert "no *.safetensors weights" in problems({"model_type": "opt"}, weights=False)
    assert "seq_len: 64 exceeds the 32 positions" in problems(
        {"model_type": "opt", "max_position_embeddings": 32})


def test_resume_rules_name_each_fixed_knob():
    from workbench.config import check_resume

    start = RunConfig(steps=10).to_dict()
    assert check_resume(start, RunConfig(steps=50, lr=1e-4, checkpoint_every=5)) == []
    problems = check_resume(start, RunConfig(seed=1, batch_size=4))
    assert [p.split(":")[0] for p in problems] == ["batch_size", "seed"]
    assert "fixed for a resumed run (it was 0, now 1)" in problems[1]


def test_task_settings_are_checked_together(tmp_path):
    with pytest.raises(ConfigError) as err:
        RunConfig(label_words=" good", template="{sentence} was", objective="lm",
                  data=str(tmp_path / "train.txt"), label_field="y")
    problems = err.value.problems
    assert {p.split(":")[0] for p in problems} == {"label_words", "template", "data", "label_field"}
    assert "label_field: does not apply to objective=lm (it applies to classify)" in problems
    assert any("k >= 2" in p for p in problems)
    for ok in ({"label_words": " bad, fine, good"}, {"objective": "completion", "data": "embedded",
               "prompt_field": "q", "completion_field": "a"}, {"data": "hf:glue:sst2"},
               {"template": "Review: {text}\nSentiment:"}):
        RunConfig(**ok)
    with pytest.raises(ConfigError, match="label_words: ' a, a' repeats a word"):
        RunConfig(label_words=" a, a")
    with pytest.raises(ConfigError, match="data: sst2 is a classify data set"):
        RunConfig(data="sst2", objective="lm")


def test_update_stride_is_auto_or_a_whole_number_read_once():
    """update_stride is typed ("auto" or an int != 0): a text box's or an older run.json's
    "3" is read into 3 when the config is built, the CLI spelling parses to the same, and
    everything else is refused naming the knob."""
    fo = dict(method="fo-offload")
    assert RunConfig(**fo).update_stride == "auto"
    assert RunConfig(**fo, update_stride="3").update_stride == 3
    assert RunConfig(**fo, update_stride=-2).update_stride == -2
    assert load_config(overrides={**fo, "update_stride": "-7"}).update_stride == -7
    assert load_config(overrides={**fo, "update_stride": "auto"}).update_stride == "auto"
    assert RunConfig(**fo, update_stride=3).to_dict()["update_stride"] == 3
    for bad, shown in ((0, "0"), ("0", "0"), ("x", "'x'"), (2.5, "2.5"), (True, "True"),
                       ("", "''"), (None, "None")):
        with pytest.raises(ConfigError) as err:
            RunConfig(**fo, update_stride=bad)
        assert err.value.problems == [f"update_stride: {shown} is not 'auto' or a non-zero whole "
                                      "number"]
    with pytest.raises(ConfigError, match="update_stride: 'x' is not 'auto' or a non-zero"):
        load_config(overrides={**fo, "update_stride": "x"})


def test_a_stride_recorded_as_text_resumes_as_the_same_stride():
    from workbench.config import check_resume

    old = {**RunConfig(method="fo-offload").to_dict(), "update_stride": "3"}  # an older run.json
    assert check_resume(old, RunConfig(method="fo-offload", update_stride=3)) == []
    assert check_resume(old, RunConfig(method="fo-offload", update_stride=4)) != []


@pytest.mark.parametrize("changes, line", [
    ({"codec": "bf16"}, "codec: bf16 with master=fp32 leaves mezo's weights in fp32"),
    ({"codec": "bf16", "master": "compressed"},
     "amp: mezo's bf16 weights (master=compressed) compute in bf16; set amp=bf16"),
    ({"codec": "fp16", "master": "compressed-sr", "amp": "bf16"}, "amp: mezo's fp16 weights"),
    ({"codec": "fp8-e4m3", "master": "compressed"},
     "master: compressed holds mezo's weights in bf16/fp16; with an fp8 codec use master=fp32"),
    ({"master": "compressed"}, "master: compressed needs a compressed codec"),
    ({"codec": "bf16", "master": "compressed", "amp": "bf16", "zo_optimizer": "adam"},
     "zo_optimizer: adam keeps per-weight state that mezo's bf16 weights do not carry"),
    ({"method": "zo-offload", "codec": "fp8-e5m2", "master": "compressed"},
     "master: compressed stores bf16/fp16 on the host"),
    ({"method": "fo", "codec": "bf16", "master": "compressed"}, "codec: 'bf16' does not apply"),
])
def test_half_weights_refusals_each_one_line(changes, line):
    """mezo's half weights (``zo/half.py``): each wrong setting is refused in one line, all at
    once."""
    with pytest.raises(ConfigError) as err:
        RunConfig(**changes)
    assert sum(p.startswith(line) for p in err.value.problems) == 1, err.value.problems


def test_half_weights_and_nearest_master_are_accepted():
    for codec in ("bf16", "fp16"):
        for master in ("compressed", "compressed-sr"):
            assert RunConfig(codec=codec, master=master, amp=codec).master == master
    assert RunConfig(method="zo-offload", codec="bf16", master="compressed").codec == "bf16"
    with pytest.raises(ConfigError) as err:  # every problem at once
        RunConfig(codec="fp16", master="compressed", amp="off", zo_optimizer="momentum")
    assert [p.split(":")[0] for p in err.value.problems] == ["amp", "zo_optimizer"]
