"""Sweeps and auto-tune through the CLI (as a user runs them) and the recipe API: grids, the
planner's refusals, reused and protected folders, stopping, the TOML a tune writes."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.cli import main
from workbench.config import RunConfig, load_config
from workbench.recipes.sweep import Sweep, SweepError, folder_name, parse_sweeps
from workbench.recipes.tune import config_toml, propose
from workbench.telemetry.record import RunRecord

REPO = Path(__file__).resolve().parents[2]
TINY = dict(model="tiny-opt", method="zo-offload", steps=3, batch_size=4, seq_len=32,
            eval_samples=8, sample_hz=0.0)
SETS = [a for k, v in TINY.items() for a in ("--set", f"{k}={v}")]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def cli_sweep(tmp_path_factory):
    """``python -m workbench sweep`` on tiny-opt, 2 knobs x 2 values, as a user runs it."""
    out = tmp_path_factory.mktemp("sweep") / "grid"
    proc = subprocess.run(
        [sys.executable, "-m", "workbench", "sweep", *SETS, "--sweep", "overlap=true,false",
         "--sweep", "prefetch_depth=1,2", "--out", str(out), "--quiet"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"})  # a 64-wide model is fastest on one thread
    return proc, out


def test_cli_sweep_runs_the_grid_and_writes_the_report(cli_sweep):
    proc, out = cli_sweep
    assert proc.returncode == 0, proc.stderr
    dirs = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert dirs == ["overlap-false_prefetch_depth-1", "overlap-false_prefetch_depth-2",
                    "overlap-true_prefetch_depth-1", "overlap-true_prefetch_depth-2"]
    manifest = json.loads((out / "sweep.json").read_text())
    assert manifest["status"] == "done" and manifest["axes"] == {
        "overlap": [True, False], "prefetch_depth": [1, 2]}
    for p in manifest["points"]:
        rec = RunRecord.load(out / p["dir"])  # each point is a normal run directory
        assert p["status"] == rec.status == "done" and len(rec.steps) == 3
        assert rec.config["overlap"] == p["changes"]["overlap"]
        assert rec.config["prefetch_depth"] == p["changes"]["prefetch_depth"]
        assert p["measured"]["tokens_per_s"] == pytest.approx(rec.summary["tokens_per_s"])
        assert p["predicted"]["tokens_per_s"] > 0 and p["measured"]["bound"]
    # the printed table: fastest first, by steady tokens/s
    lines = [ln for ln in proc.stdout.splitlines() if re.match(r"(overlap=\S+ ){1}prefetch", ln)]
    speeds = [float(re.search(r"\s([\d,]+) \(", ln).group(1).replace(",", "")) for ln in lines]
    assert len(speeds) == 4 and speeds == sorted(speeds, reverse=True)
    assert "report: " in proc.stdout
    page = (out / "report.html").read_text(encoding="utf-8")
    # a dashboard per run, then bars, losses, the dev metric by steps / seconds / passes and
    # timelines (CPU runs: no GPU memory figure)
    assert "<table class=sweep>" in page and page.count("Plotly.newPlot(") == 4 + 4
    ranked = [json.loads(json.dumps(p)) for p in manifest["points"]]
    ranked.sort(key=lambda p: -p["measured"]["tokens_per_s"])
    first_rows = re.findall(r"<tr><td>(\d)</td><td>(true|false)</td><td>(\d)</td>", page)
    assert [(o, d) for _, o, d in first_rows] == [
        (str(p["changes"]["overlap"]).lower(), str(p["changes"]["prefetch_depth"]))
        for p in ranked]


def test_a_second_sweep_into_the_folder_is_refused_resumed_or_overwritten(cli_sweep, tmp_path):
    _, out = cli_sweep
    base = RunConfig(**TINY)
    axes = {"overlap": [True, False], "prefetch_depth": [1, 2]}
    before = (out / "sweep.json").read_bytes()
    with pytest.raises(SweepError, match="holds a sweep .*--resume .* --overwrite"):
        Sweep.grid(base, axes, out)  # a folder holding a sweep: never replaced unasked
    again = Sweep.grid(base, axes, out, resume=True)
    assert [p.status for p in again.points] == ["reused"] * 4 and not again.runnable
    # a reused point keeps the bound its first sweep found (from its events, not "unknown")
    first = {p["name"]: p["measured"]["bound"] for p in json.loads(before)["points"]}
    assert {p.name: p.measured["bound"] for p in again.points} == first
    assert "unknown" not in first.values()
    with pytest.raises(SweepError, match="other settings \\(base, axes, points differ\\)"):
        Sweep.grid(base.replace(steps=4), {"overlap": [True], "prefetch_depth": [1]}, out,
                   resume=True)
    assert (out / "sweep.json").read_bytes() == before
    other = tmp_path / "other"  # no manifest: a point's folder holding someone's files
    stray = other / folder_name({"seed": 7})
    stray.mkdir(parents=True)
    (stray / "notes.txt").write_text("mine")
    with pytest.raises(SweepError, match="holds other files, not a sweep; give a new or empty"):
        Sweep(base, [{"seed": 7}], other, fits=lambda c: None)
    assert (stray / "notes.txt").read_text() == "mine"


def test_a_resumed_sweep_ranks_as_it_was_started_unless_told(cli_sweep, capsys):
    """``--resume`` reads the manifest's rank_by; ``--rank-by`` beside it ranks otherwise."""
    from workbench.telemetry import ranking

    _, out = cli_sweep
    kept = {name: (out / name).read_bytes() for name in ("sweep.json", "report.html")}
    started = json.loads(kept["sweep.json"])["rank_by"]
    try:
        assert main(["sweep", "--resume", str(out), "--quiet"]) == 0
        assert f"ranked by {ranking.parse_rank_by(started).label}" in capsys.readouterr().out
        other = "loss" if started != "loss" else "tokens_per_s"
        assert main(["sweep", "--resume", str(out), "--rank-by", other, "--quiet"]) == 0
        assert f"ranked by {ranking.parse_rank_by(other).label}" in capsys.readouterr().out
        assert json.loads((out / "sweep.json").read_text())["rank_by"] == other
    finally:  # the module's other tests read the sweep as the fixture left it
        for name, data in kept.items():
            (out / name).write_bytes(data)


def test_parse_sweeps_reads_values_and_lists_every_problem():
    assert parse_sweeps(["overlap=true,false", "prefetch_depth = 1, 2", "codec=bf16"]) == {
        "overlap": [True, False], "prefetch_depth": [1, 2], "codec": ["bf16"]}
    with pytest.raises(SweepError) as err:
        parse_sweeps(["nosuch=1,2", "steps=1,x", "overlap", "seed=1,1", "lr=", "seed=2"])
    text = "\n".join(err.value.problems)
    for want in ("nosuch: unknown setting", "steps: 'x' is not a whole number",
                 "'overlap': expected KNOB=V1,V2", "seed: a value is listed twice",
                 "lr: no values"):
        assert want in text, text


def test_refused_points_carry_the_config_or_planner_reason(tmp_path):
    base = RunConfig(**{**TINY, "device": "cpu"})
    s = Sweep.grid(base, {"codec": ["fp32", "bf16"], "master": ["fp32", "compressed-sr"]},
                   tmp_path / "codecs")
    status = {p.name: (p.status, p.reason) for p in s.points}
    assert status["codec=fp32 master=compressed-sr"][0] == "refused"
    assert "compressed-sr needs a compressed codec" in status["codec=fp32 master=compressed-sr"][1]
    assert sum(st == "pending" for st, _ in status.values()) == 3
    # the planner: opt-175b's host masters do not fit this machine's memory
    big = Sweep.grid(base, {"model": ["tiny-opt", "opt-175b"]}, tmp_path / "big")
    refused = [p for p in big.points if p.status == "refused"]
    assert [p.name for p in refused] == ["model=opt-175b"]
    assert "host memory" in refused[0].reason and "short by" in refused[0].reason
    assert not (tmp_path / "big").exists()  # checks write nothing


def test_cli_sweep_errors_before_any_work(tmp_path, capsys):
    assert main(["sweep", *SETS, "--sweep", "nosuch=1,2", "--out", str(tmp_path / "a")]) == 2
    assert "error: --sweep nosuch: unknown setting" in capsys.readouterr().err
    assert main(["sweep", *SETS, "--sweep", "steps=2,3", "--out", str(tmp_path / "b")]) == 2
    assert "steps: given with --set and --sweep" in capsys.readouterr().err
    no_model = [a for a in SETS if not a.startswith("model=")]
    no_model = [a for i, a in enumerate(no_model) if not (a == "--set" and i + 1 < len(no_model)
                                                          and no_model[i + 1] == "--set")]
    code = main(["sweep", *no_model, "--set", "device=cpu", "--sweep",
                 "model=opt-175b,opt-66b", "--out", str(tmp_path / "c")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("refused: model=") == 2 and "nothing ran" in err
    assert not any((tmp_path / "c").glob("*/run.json"))
    # a ranking it cannot do: one line, nothing written
    assert main(["sweep", *SETS, "--sweep", "seed=1,2", "--rank-by", "dev.speed",
                 "--out", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --rank-by: 'dev.speed' is not ")
    assert main(["sweep", *SETS, "--set", "data=synthetic", "--set", "eval_samples=0",
                 "--sweep", "seed=1,2", "--rank-by", "dev.accuracy",
                 "--out", str(tmp_path / "e")]) == 2
    assert "data=synthetic has no dev split" in capsys.readouterr().err
    assert not (tmp_path / "d").exists() and not (tmp_path / "e").exists()


def test_stop_ends_the_current_run_and_skips_the_rest(tmp_path):
    s = Sweep.grid(RunConfig(**{**TINY, "steps": 500}), {"seed": [1, 2, 3]}, tmp_path / "s")
    s.run(on_step=lambda p, e: s.stop() if e.step >= 1 else None)
    assert [p.status for p in s.points] == ["stopped", "skipped", "skipped"]
    rec = RunRecord.load(s.points[0].dir)
    assert rec.status == "stopped" and 2 <= len(rec.steps) <= 5
    manifest = json.loads((tmp_path / "s" / "sweep.json").read_text())
    assert manifest["status"] == "stopped"
    assert [p["status"] for p in manifest["points"]] == ["stopped", "skipped", "skipped"]
    assert not s.points[1].dir.exists()


def test_cli_tune_on_a_cpu_refuses_in_one_line(tmp_path):
    """Tune ranks settings by measured speed: on a CPU that ranks the host's load, so it
    refuses, before anything is planned or written."""
    out = tmp_path / "tune"
    proc = subprocess.run([sys.executable, "-m", "workbench", "tune", *SETS, "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: tune: needs a CUDA GPU ("), lines
    assert not out.exists()


def _trials(tmp_path, speeds, spreads):
    """A tune's trials as measured (no runs): candidates in the planner's order."""
    from workbench.recipes.tune import pick

    s = Sweep(RunConfig(**TINY), [{"seed": i} for i in range(len(speeds))], tmp_path / "t",
              fits=lambda c: None, rank_by="tokens_per_s")
    for p, tps, spread in zip(s.points, speeds, spreads):
        p.status = "done"
        p.measured = {"tokens_per_s": tps, "noise": {"step_spread": spread, "steady_steps": 20}}
    return pick(s, s.finished()), s


def test_tune_keeps_the_planners_choice_among_trials_within_noise(tmp_path):
    # the second candidate measured 3% faster, inside a 10% step spread: no winner
    (best, tied), s = _trials(tmp_path / "a", [1000.0, 1030.0, 600.0], [0.10, 0.10, 0.10])
    assert best is s.points[0] and tied == [s.points[1], s.points[0]]
    # 30% faster, beyond the spread: it wins
    (best, tied), s = _trials(tmp_path / "b", [1000.0, 1300.0, 600.0], [0.10, 0.10, 0.10])
    assert best is s.points[1] and tied == [s.points[1]]


@pytest.mark.gpu
def test_cli_tune_writes_the_fastest_as_a_loadable_toml(tmp_path, capsys):
    out = tmp_path / "tune"
    code = main(["tune", *SETS, "--set", "device=cuda", "--set", "steps=40", "--top", "2",
                 "--trial-steps", "3", "--out", str(out), "--quiet"])
    text = capsys.readouterr().out
    assert code == 0, text
    manifest = json.loads((out / "sweep.json").read_text())
    assert manifest["kind"] == "tune" and len(manifest["points"]) == 2
    done = [p for p in manifest["points"] if p["status"] == "done"]
    fastest = max(done, key=lambda p: p["measured"]["tokens_per_s"])
    if not manifest["extra"]["within_noise"]:  # else the planner's first choice of the tied
        assert manifest["extra"]["best"] == fastest["name"]
    cfg = load_config(out / "best.toml")  # what --config reads
    assert cfg.steps == 40 and cfg.method == "zo-offload"  # the user's length, not the trial's
    best = next(p for p in done if p["name"] == manifest["extra"]["best"])  # what it wrote
    assert {k: getattr(cfg, k) for k in best["changes"]} == best["changes"]
    for p in manifest["points"]:  # trials: short, one dev example
        rec = RunRecord.load(out / p["dir"])
        assert rec.config["steps"] == 3 and rec.config["eval_samples"] == 1
    if importlib.util.find_spec("plotly") is not None:  # the report needs the UI packages
        page = (out / "report.html").read_text(encoding="utf-8")
        assert "measured / predicted" in page and "best.toml" in page
    assert (f"fastest: {fastest['name']}" in text if not manifest["extra"]["within_noise"]
            else "no winner: " in text)


def test_propose_ranks_what_fits_and_drops_moot_codecs():
    from workbench.plan.planner import plan

    cands = propose(RunConfig(**{**TINY, "device": "cpu"}), top=50)
    assert len({json.dumps(c, sort_keys=True) for c in cands}) == len(cands)
    # all 4 blocks resident: nothing streams, so one transfer format stands for all
    assert [c for c in cands if c["resident_blocks"] == 4] == [
        {"codec": "fp32", "master": "fp32", "resident_blocks": 4}]
    # a GPU run: a 1.5 GiB budget leaves room for some resident blocks of opt-350m, not all
    gpu = RunConfig(model="opt-350m", method="zo-offload", device="cuda", amp="bf16",
                    batch_size=16, seq_len=128, data="synthetic")
    budget = int(1.5 * 2**30)
    picks = propose(gpu, gpu="24gb", budget=budget, top=3)
    assert len(picks) == 3 and all(c["resident_blocks"] < 24 for c in picks)
    predicted = [plan(gpu.replace(**c), "24gb") for c in picks]
    assert all(p.nvml_gpu_mem_bytes <= budget for p in predicted)  # each fits the budget
    speeds = [p.tokens_per_s for p in predicted]
    assert speeds == sorted(speeds, reverse=True)  # best predicted first


def test_config_toml_round_trips_every_field(tmp_path):
    # a knob that applies to one method only is set with that method (others refuse it)
    for cfg in (RunConfig(model="tiny-opt", method="zo-offload", lr=2.5e-7, eps=1e-3, steps=12,
                          overlap=False, data_dir='we"ird\\path', gpu_mem_limit_gb=24.0,
                          device="cuda"),
                RunConfig(model="tiny-opt", method="fo-offload", update_stride="-3")):
        path = tmp_path / "c.toml"
        path.write_text(config_toml(cfg, ["a comment"]))
        assert load_config(path) == cfg
