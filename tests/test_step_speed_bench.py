"""benchmarks/step_speed.py: a tree entry's own settings reach its runs (two settings of one tree
compared), rows labelled by them; bad entries are refused in one line."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "step_speed.py"


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark(SCRIPT)


def test_a_tree_entry_parses_into_root_and_typed_settings(bench):
    assert bench.parse_tree(".") == (Path(".").resolve(), {})
    root, sets = bench.parse_tree("/x/y:prefetch_depth=2,overlap=false,codec=bf16")
    assert root == Path("/x/y") and sets == {"prefetch_depth": 2, "overlap": False,
                                            "codec": "bf16"}
    with pytest.raises(SystemExit, match="not knob=value"):
        bench.parse_tree("/x:prefetch_depth")


def test_each_tree_runs_with_its_own_settings_in_turn(bench, monkeypatch):
    calls, saved = [], {}

    def fake_run(tree, cfg, warmup):
        calls.append((tree, cfg))
        return {"step_seconds": 0.2 if cfg.get("prefetch_depth") == 2 else 0.25, "peak": 1e9}

    monkeypatch.setattr(bench, "one_run", fake_run)
    monkeypatch.setattr(bench, "save", lambda name, payload: saved.update(payload) or name)
    monkeypatch.setattr(sys, "argv", ["step_speed.py", "--trees", "/a;/a:prefetch_depth=2",
                                      "--repeats", "2", "--model", "opt-6.7b"])
    bench.main()
    assert [c["prefetch_depth"] if "prefetch_depth" in c else None for _, c in calls] == [
        None, 2, None, 2]  # interleaved A B A B
    assert all(t == Path("/a") and c["model"] == "opt-6.7b" for t, c in calls)
    rows = saved["rows"]
    assert [r["tree"] for r in rows] == ["/a", "/a prefetch_depth=2"]
    assert rows[1]["ratio"] == pytest.approx(0.25 / 0.2)
