"""Run names (folder and differing settings), timing noise, rankings with their noise, and the
one summary table the CLI and the report share."""
from __future__ import annotations

import html
import math
import re
import statistics

import pytest

from workbench.config import ConfigError
from workbench.telemetry import noise, ranking
from workbench.telemetry.naming import differing, run_labels, short_number, value_text
from workbench.telemetry.record import RunRecord
from workbench.telemetry.summary import table, text_table


def _rec(path="", **cfg) -> RunRecord:
    return RunRecord(config={"method": "mezo", "model": "tiny-opt", "lr": 1e-3, "seed": 0, **cfg},
                     path=path)


# --- naming -------------------------------------------------------------------------------
def test_runs_are_named_by_folder_and_the_settings_that_differ():
    a, b = _rec("runs/lr4", lr=1e-4), _rec("runs/lr3", lr=1e-3)
    assert run_labels([a, b]) == ["lr4: mezo lr=1e-4", "lr3: mezo lr=1e-3"]
    # a folder that only repeats the settings is not said twice (the demo, sweeps)
    demo = [_rec("runs/demo/mezo"), _rec("runs/demo/zo-offload", method="zo-offload")]
    assert run_labels(demo) == ["mezo", "zo-offload"]
    sweep = [_rec("s/lr-1e-4", lr=1e-4), _rec("s/lr-2e-3", lr=2e-3)]
    assert run_labels(sweep) == ["mezo lr=1e-4", "mezo lr=2e-3"]
    # alike runs: folder, method and model; the same folder name twice: numbered
    assert run_labels([_rec("x/a"), _rec("y/b")]) == ["a: mezo tiny-opt", "b: mezo tiny-opt"]
    assert run_labels([_rec("x/a"), _rec("y/a")]) == ["a: mezo tiny-opt #1", "a: mezo tiny-opt #2"]
    # a model that differs is named by itself; a sweep's point keeps its name
    assert run_labels([_rec(), _rec(model="opt-125m")]) == ["mezo tiny-opt", "mezo opt-125m"]
    named = _rec()
    named.info["name"] = "overlap=true"
    assert run_labels([named, _rec(lr=0.5)]) == ["overlap=true", "mezo lr=0.5"]


def test_a_record_without_its_config_is_unknown_not_different():
    """A run.json whose config is null: named by its folder and said to have no config, and
    the others' differing settings are theirs alone (it made all 55 differ before)."""
    hole = RunRecord(config={}, path="runs/holed")
    a, b = _rec("runs/lr4", lr=1e-4), _rec("runs/lr3", lr=1e-3)
    assert differing([a.config, hole.config, b.config]) == ["lr"]
    assert run_labels([a, hole, b]) == ["lr4: mezo lr=1e-4", "holed (no config recorded)",
                                        "lr3: mezo lr=1e-3"]


def test_many_differences_are_counted_and_files_named_not_pathed():
    a = _rec(lr=1e-4, seed=1, steps=10, eps=1e-3, data="/data/a/train.jsonl", batch_size=4)
    b = _rec(lr=1e-3, seed=2, steps=20, eps=1e-2, data="/data/b/train.jsonl", batch_size=8)
    assert differing([a.config, b.config]) == ["lr", "seed", "steps", "eps", "data",
                                               "batch_size"]
    assert run_labels([a, b])[0] == "mezo lr=1e-4 seed=1 steps=10 eps=1e-3 +2 more"
    assert value_text("/data/a/train.jsonl") == "train.jsonl" and value_text(True) == "true"
    assert [short_number(x) for x in (1e-4, 2.5e-3, 3.333e-4, 0.5, 16.0, 1e-9)] == [
        "1e-4", "2.5e-3", "3.3e-4", "0.5", "16", "1e-9"]


# --- noise --------------------------------------------------------------------------------
def _steps(seconds):
    return [{"step": i, "seconds": s, "tokens": 100} for i, s in enumerate(seconds)]


def test_step_spread_is_the_steady_steps_iqr_over_their_median():
    secs = [5.0] + [1.0, 1.2, 0.9, 1.1, 1.0, 1.4, 0.95, 1.05]  # a warm-up step, then steady
    spread, n = noise.step_spread(_steps(secs))
    steady = secs[1:]
    q = statistics.quantiles(steady, n=4, method="inclusive")
    assert n == 8 and spread == pytest.approx((q[2] - q[0]) / statistics.median(steady))
    assert math.isnan(noise.step_spread(_steps([1.0]))[0])


def test_other_processes_cpu_is_the_host_less_this_process():
    samples = [{"host cpu (%)": 80.0, "process cpu (%)": 50.0},
               {"host cpu (%)": 60.0, "process cpu (%)": 50.0},
               {"host cpu (%)": 40.0}]  # an old sample without the process's share: skipped
    assert noise.other_cpu(samples) == pytest.approx(20.0)
    assert math.isnan(noise.other_cpu([]))


def test_a_ratio_is_within_noise_by_spread_busy_host_or_too_few_steps():
    quiet = {"step_spread": 0.04, "steady_steps": 30, "other_cpu_pct": 5.0}
    shaky = {"step_spread": 0.20, "steady_steps": 30, "other_cpu_pct": 5.0}
    busy = {"step_spread": 0.04, "steady_steps": 30, "other_cpu_pct": 60.0}
    short = {"step_spread": 0.01, "steady_steps": 3}
    assert noise.margin(quiet, quiet) == pytest.approx(0.04)
    assert noise.ratio_text(0.31, quiet, quiet) == "0.31x"
    assert noise.ratio_text(0.97, quiet, quiet) == "0.97x, within noise ±4%"
    assert noise.within(0.85, quiet, shaky) and not noise.within(0.75, quiet, shaky)
    assert noise.within(0.57, quiet, busy)  # the 0.57x on a loaded host
    assert noise.ratio_text(0.5, quiet, short) == "0.50x, within noise: under 5 steady steps"
    assert noise.within(1.01, {}, {}) and noise.margin({"steady_steps": 9}, quiet) >= noise.FLOOR
    line = noise.describe({**busy, "load_start": 1.5, "load_end": 3.0, "threads": 1})
    assert line == ("step spread 4% (IQR/median, 30 steady steps); other processes 60% of host "
                    "CPU (busy host); load 1.5 -> 3.0; torch threads 1")


# --- ranking ------------------------------------------------------------------------------
def test_rank_by_names_and_defaults():
    assert ranking.parse_rank_by("loss").higher is False
    assert ranking.parse_rank_by("dev.accuracy").higher is True
    assert ranking.parse_rank_by("dev.perplexity").higher is False
    with pytest.raises(ConfigError, match="--rank-by: 'dev.nosuch' is not tokens_per_s, loss"):
        ranking.parse_rank_by("dev.nosuch")
    assert ranking.default_rank_by({"data": "embedded"}) == "dev.accuracy"
    assert ranking.default_rank_by({"data": "x.jsonl", "objective": "lm"}) == "dev.loss"
    assert ranking.default_rank_by({"data": "synthetic"}) == "tokens_per_s"


def test_ranking_order_ties_and_noise():
    m = lambda **kw: {"tokens_per_s": 100.0, "noise": {"step_spread": 0.05, "steady_steps": 20},
                      "dev_examples": 400, **kw}  # noqa: E731
    runs = {"a": m(final_loss=2.0, final_loss_se=0.05, dev={"accuracy": 0.80, "loss": 0.50}),
            "b": m(final_loss=1.9, final_loss_se=0.05, dev={"accuracy": 0.81, "loss": 0.45},
                   tokens_per_s=150.0),
            "c": m(final_loss=1.0, final_loss_se=0.05, dev={"accuracy": 0.60, "loss": 0.70}),
            "d": m(final_loss=None, dev={})}
    order = lambda by: ranking.ranked(list(runs), ranking.parse_rank_by(by), runs.get)  # noqa
    assert order("loss") == ["c", "b", "a", "d"]
    assert order("dev.accuracy") == ["b", "a", "c", "d"]
    assert order("dev.loss") == ["b", "a", "c", "d"]
    assert order("tokens_per_s") == ["b", "a", "c", "d"]  # a tie (a, c, d at 100): stable
    acc, loss = ranking.parse_rank_by("dev.accuracy"), ranking.parse_rank_by("loss")
    assert acc.within(runs["b"], runs["a"]) and not acc.within(runs["b"], runs["c"])
    assert loss.within(runs["b"], runs["a"]) and not loss.within(runs["c"], runs["b"])
    dev_loss = ranking.parse_rank_by("dev.loss")  # one dev set: 1% apart is a tie
    assert dev_loss.within({"dev": {"loss": 0.500}}, {"dev": {"loss": 0.504}})
    assert not dev_loss.within(runs["b"], runs["a"])


# --- the one summary table ----------------------------------------------------------------
def test_the_cli_and_the_report_show_one_table():
    from workbench.ui.report import summary_table_html

    recs = []
    for path, lr, secs in (("r/a", 1e-4, 0.10), ("r/b", 1e-3, 0.05)):
        rec = _rec(path, lr=lr)
        rec.steps = [{"step": i, "loss": 3.0 - 0.01 * i, "seconds": secs, "tokens": 64,
                      "projected_grad": 1.0} for i in range(12)]
        recs.append(rec)
    labels = run_labels(recs)
    text = text_table(recs, labels)
    page = summary_table_html(recs)
    rows = table(recs)
    html_rows = [[html.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", tr)]
                 for tr in re.findall(r"<tr>(.*?)</tr>", page) if "<td" in tr]
    assert [r[0] for r in html_rows] == [label for label, _ in rows]
    for (label, cells), shown in zip(rows, html_rows):
        assert shown[1:] == cells
        line = next(ln for ln in text.splitlines() if ln.startswith(label + "  "))
        assert all(c in line for c in cells)
    assert "tokens/s (steady)" in text and "within noise" not in text  # 11 steady steps
    assert "1,280 (2.00x)" in page
    assert text.splitlines()[0].split() == ["run", "a:", "mezo", "lr=1e-4", "b:", "mezo",
                                            "lr=1e-3"]


def test_the_update_schedule_row_is_the_trials_choice_even_if_it_never_ran():
    """A run that ends with its trial last ran (and published) the last candidate tried; its
    summary row names the schedule the trial kept (CI, 2026-11-28: it read "downcast on cpu"
    beside a kept "downcast on gpu")."""
    from workbench.plan.placement import NO_GPU
    from workbench.telemetry.summary import schedule_text

    tried = [{"stride": NO_GPU, "downcast": "gpu", "subgroup_size": 5000},
             {"stride": 3, "downcast": "cpu", "subgroup_size": 8000}]
    last = {"fo_stride": 3, "fo_perf_inputs": {"downcast": "cpu", "subgroup_size": 8000}}
    assert schedule_text(last) == "stride 3, downcast on cpu, subgroups of 8,000"
    done = {**last, "fo_trial": {"candidates": tried, "chosen": 0}}
    assert schedule_text(done) == ("all on the CPU, downcast on gpu, subgroups of 5,000, "
                                   "best of 2 tried (the run ended before it ran)")
    ran = {**done, "fo_stride": NO_GPU,
           "fo_perf_inputs": {"downcast": "gpu", "subgroup_size": 5000}}  # the winner placed
    assert schedule_text(ran) == ("all on the CPU, downcast on gpu, subgroups of 5,000, "
                                  "best of 2 tried")
    tried[0]["gpu_resident_ratio"] = 0.2  # the winner keeps a resident share; the last ran none
    ran["fo_perf_inputs"]["gpu_resident_ratio"] = 0.0
    assert schedule_text(ran).endswith("best of 2 tried (the run ended before it ran)")
    assert schedule_text({"fo_stride": 2, "fo_perf_inputs": {"downcast": "none"}}) == "stride 2"
    assert schedule_text({}) is None


def test_a_ratio_timed_while_the_load_changed_is_within_noise():
    """One run on a quiet host, the other beside a hog (or on fewer threads, as the free cores
    decided): their 6.24x says as much about the load as about the methods."""
    quiet = {"step_spread": 0.04, "steady_steps": 30, "other_cpu_pct": 5.0, "threads": 2}
    loaded = {**quiet, "other_cpu_pct": 80.0}
    fewer = {**quiet, "threads": 1}
    assert noise.ratio_text(6.24, quiet, loaded) == (
        "6.24x, within noise: the load changed between the runs (other processes 5% / 80% of "
        "host CPU)")
    assert noise.ratio_text(0.16, quiet, fewer) == (
        "0.16x, within noise: the load changed between the runs (torch threads 2 / 1)")
    assert noise.ratio_text(6.24, quiet, {**quiet, "other_cpu_pct": 20.0}) == "6.24x"


def test_labels_keep_each_setting_whole_and_short():
    """Words of a value that the folder name also has are not dropped from it
    ("template={text} Category B): label_words= B" before), and labels of long values stay
    short enough for a chart's legend while telling the runs apart."""
    a = _rec("runs/category-b-task", template="{text} Category B", label_words=" A, B")
    b = _rec("runs/other", template="{text} Category C", label_words=" C, D")
    assert run_labels([a, b]) == [
        "category-b-task: mezo template='{text} Category B' label_words=' A, B'",
        "other: mezo template='{text} Category C' label_words=' C, D'"]
    long = "Classify the following customer review into one of the categories. Review: {text}"
    runs = [_rec(f"runs/r{i}", template=f"{long} Category {c}", data=f"/d/long_file_{c}.csv",
                 label_words=f" alpha, beta, gamma, {c}", lr=10.0 ** -i, seed=i, eps=0.01 * i)
            for i, c in enumerate("AB")]
    labels = run_labels(runs)
    assert len(set(labels)) == 2 and all(len(x) <= 90 for x in labels), labels
    assert labels[0] == "r0: mezo lr=1 seed=0 template='…view: {text} Category A' +3 more"
    assert labels[0].endswith(" more") and "Category B'" in labels[1]
