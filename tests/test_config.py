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


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "workbench", *args], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("setting, field", [
    ("lr=-1", "lr"), ("method=sgd", "method"), ("model=gpt-17", "model"), ("steps=0", "steps"),
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
