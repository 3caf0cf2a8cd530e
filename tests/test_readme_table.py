"""The measurements page's fresh-process table is the one the committed results generate
(issue 16); it lives in ``docs/measurements.md``, the README links to it."""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_measurements_page_holds_the_table_generated_from_the_results(load_benchmark):
    mod = load_benchmark(ROOT / "benchmarks" / "readme_table.py")
    table = mod.markdown("H100")
    assert table.count("\n") >= 4  # header, rule and rows: the results are committed
    assert table in (ROOT / "docs" / "measurements.md").read_text(encoding="utf-8")


def test_a_newer_measurement_of_a_row_replaces_the_older(tmp_path, monkeypatch, load_benchmark):
    mod = load_benchmark(ROOT / "benchmarks" / "readme_table.py")
    import json

    def row(model, ratio):
        return {"model": model, "shape": "16x128", "precision": "fp32", "ratio": ratio}

    # the later date wins whatever the names sort as; rows only the older file has stay
    (tmp_path / "fresh-zz-H100-2026-11-22.json").write_text(
        json.dumps({"rows": [row("opt-1.3b", 0.5), row("opt-6.7b", 0.6)]}))
    (tmp_path / "fresh-H100-2026-11-23.json").write_text(
        json.dumps({"rows": [row("opt-1.3b", 0.9), dict(row("opt-6.7b", 0.1), error="x")]}))
    monkeypatch.setattr(mod, "RESULTS", tmp_path)
    assert [(r["model"], r["ratio"]) for r in mod.rows("H100")] == [("opt-1.3b", 0.9),
                                                                    ("opt-6.7b", 0.6)]
