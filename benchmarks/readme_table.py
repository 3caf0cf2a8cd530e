"""The fresh-process table of ``docs/measurements.md``, from ``benchmarks/results/fresh*.json``
(issue 16: the table is regenerated from the committed results, never typed in).

    python benchmarks/readme_table.py [--gpu H100]     # prints Markdown rows to paste
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
HEAD = ("| model | batch | precision | MeZO tok/s | zo-offload tok/s | ratio | MeZO peak GB "
        "| offload peak GB | step / lower bound | MeZO step / lower bound |\n"
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")


def rows(gpu: str) -> list[dict]:
    """The newest row per (model, shape, precision) of the fresh-process results whose file
    name names ``gpu`` (a file's date is the end of its name: ``...-YYYY-MM-DD.json``)."""
    newest: dict[tuple, dict] = {}
    paths = sorted(RESULTS.glob(f"fresh*{gpu}*.json"), key=lambda p: (p.stem[-10:], p.name))
    for path in paths:  # oldest first: a later measurement replaces an earlier one
        for r in json.loads(path.read_text())["rows"]:
            if not r.get("error"):
                newest[r["model"], r["shape"], r["precision"]] = r
    size = lambda r: float(r["model"].split("-")[1].rstrip("b"))  # noqa: E731  opt-1.3b -> 1.3
    return sorted(newest.values(), key=lambda r: (size(r), r["shape"], r["precision"]))


def markdown(gpu: str) -> str:
    lines = [HEAD]
    for r in rows(gpu):
        b, t = r["shape"].split("x")
        mezo_step = int(b) * int(t) / r["mezo_tps"]  # seconds: every token of the batch is real
        lines.append(f"| {r['model']} | {b} x {t} | {r['precision']} | {r['mezo_tps']:,.0f} | "
                     f"{r['offload_tps']:,.0f} | {r['ratio']:.3f} | {r['mezo_peak_gb']:.2f} | "
                     f"{r['offload_peak_gb']:.2f} | {r['vs_bound']:.2f} | "
                     f"{mezo_step / r['bound_s']:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpu", default="H100")
    print(markdown(p.parse_args().gpu))
