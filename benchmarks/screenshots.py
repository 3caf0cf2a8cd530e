"""Screenshots of the dashboard, a comparison and the report, from saved run directories, for
the README (``assets/``). Renders with Playwright and Debian's chromium (no browser download),
through the same code the notebook and the report use:

    dashboard.png   the live view of one run: ``Dashboard(record)``'s header (state, verdict,
                    next knob) and its figure, at the width the knob panel leaves it
    comparison.png  ``compare(*runs)``: the side-by-side table, the verdicts, the bars and
                    the smoothed losses
    report.png      the top of ``write_report(runs)`` (or of a sweep's report with --sweep)
    knob-panel.png  (--panel) the knob panel beside its live dashboard in JupyterLab, at
                    1400 x 900: notebooks/01_quickstart.ipynb run as a user runs it

    python benchmarks/screenshots.py --dashboard runs/shots/zo-offload \\
        --compare runs/shots/mezo runs/shots/zo-offload [--sweep runs/shots/sweep] --out assets
    python benchmarks/screenshots.py --panel --out assets

Writes ``assets/screenshots.json`` (``knob-panel.json`` for --panel) beside the PNGs: the run
directories, their device and GPU, and the date, so a caption can say where the pictures come
from.
"""
from __future__ import annotations

import argparse
import datetime as dt
import html
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from plotly.offline import get_plotlyjs  # noqa: E402

from workbench.telemetry.record import RunRecord  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run"]
PAGE_CSS = """body { font: 14px/1.45 system-ui, sans-serif; margin: 16px; color: #222; }
table { border-collapse: collapse; margin: 8px 0; } th, td { border: 1px solid #ddd;
padding: 3px 8px; text-align: left; } th { background: #f6f6f6; }"""


def _page(body: str, figures: list[dict]) -> str:
    plots = "".join(
        f"<div id='fig{i}' style='width:100%'></div><script>Plotly.newPlot('fig{i}', "
        f"{json.dumps(f['data'])}, {json.dumps(f['layout'])}, "
        "{responsive: true, displaylogo: false});</script>" for i, f in enumerate(figures))
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'>"
            f"<script>{get_plotlyjs()}</script><style>{PAGE_CSS}</style></head><body>"
            f"{body}{plots}</body></html>")


def _json(fig) -> dict:
    return json.loads(fig.to_json())


def dashboard_page(run_dir: Path) -> str:
    """The live view of a saved run: the widget's own header and figure."""
    from workbench.ui.dashboard import Dashboard

    rec = RunRecord.load(run_dir)
    d = Dashboard(rec, min_interval_s=0.0)
    d.refresh(force=True)
    return _page(f"<div style='max-width:1060px'>{d.status.value}", [_json(d.figure)]) \
        .replace("</body>", "</div></body>")


def comparison_page(run_dirs: list[Path]) -> str:
    """``compare(*runs)``: its table and verdicts, then its figures."""
    from workbench.ui.compare import compare

    box = compare(*run_dirs)
    table, *figs = box.children
    keep = figs[:2]  # the bars and the smoothed losses (memory and timelines below the fold)
    return _page(table.value, [json.loads(f.to_json()) for f in keep])


def shoot(pages: dict[str, tuple[str | Path, int, int]], out: Path) -> list[Path]:
    """Each page (HTML text, or a file) at (width, height) px, to ``out/<name>.png``."""
    from playwright.sync_api import sync_playwright

    written = []
    with sync_playwright() as p, tempfile.TemporaryDirectory() as tmp:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            for name, (source, width, height) in pages.items():
                if isinstance(source, Path):
                    url = source.resolve().as_uri()
                else:
                    path = Path(tmp) / f"{name}.html"
                    path.write_text(source, encoding="utf-8")
                    url = path.as_uri()
                context = browser.new_context(viewport={"width": width, "height": height},
                                              device_scale_factor=1)
                page = context.new_page()
                page.goto(url, timeout=60_000)
                page.wait_for_selector(".js-plotly-plot .main-svg", timeout=60_000)
                page.wait_for_timeout(800)  # plotly's responsive relayout
                target = out / f"{name}.png"
                page.screenshot(path=str(target), clip={"x": 0, "y": 0, "width": width,
                                                        "height": height})
                written.append(target)
                context.close()
        finally:
            browser.close()
    return written


PANEL_NOTEBOOK = "01_quickstart.ipynb"


def panel_shot(out: Path) -> tuple[Path, Path]:
    """The knob panel beside its live dashboard: ``PANEL_NOTEBOOK`` run in JupyterLab (Run
    All, as a user does) in a 1400 x 900 window, its panel's cell at the top of the window.
    Returns the PNG and the run directory the panel wrote."""
    from playwright.sync_api import sync_playwright

    import lab

    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        root, home = Path(tmp) / "root", Path(tmp) / "home"
        root.mkdir()
        shutil.copy(lab.REPO / "notebooks" / PANEL_NOTEBOOK, root)
        with lab.lab_server(root, home) as (url, token):
            browser = p.chromium.launch(executable_path=str(lab.CHROMIUM),
                                        args=lab.CHROMIUM_ARGS)
            try:
                page = browser.new_context(viewport=lab.WINDOW).new_page()
                lab.open_and_run_all(page, url, token, PANEL_NOTEBOOK, timeout_s=900)
                cell = page.locator(".jp-Notebook .jp-CodeCell", has=page.locator(".wb-knobs"))
                cell.locator(".js-plotly-plot .main-svg").first.wait_for(timeout=60_000)
                cell.locator(".jp-OutputArea").evaluate(
                    "el => el.scrollIntoView({block: 'start'})")
                page.wait_for_timeout(1000)  # plotly's responsive relayout
                target = out / "knob-panel.png"
                page.screenshot(path=str(target))
            finally:
                browser.close()
        run_dir = next((root / "runs" / Path(PANEL_NOTEBOOK).stem).glob("*/run.json")).parent
        kept = out / "knob-panel-run"  # the run the picture shows, for describe()
        shutil.rmtree(kept, ignore_errors=True)
        shutil.copytree(run_dir, kept)
    return target, kept


def describe(run_dirs: list[Path]) -> list[dict]:
    out = []
    for d in run_dirs:
        rec = RunRecord.load(d)
        out.append({"run_dir": str(d), "name": rec.name, "device": rec.config.get("device"),
                    "model": rec.config.get("model"), "method": rec.config.get("method"),
                    "gpu": rec.environment.get("gpu name") or rec.environment.get("device"),
                    "steps": len(rec.steps), "date": rec.environment.get("date")})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dashboard", type=Path, help="run directory to show live")
    p.add_argument("--compare", type=Path, nargs="+", help="runs to compare")
    p.add_argument("--sweep", type=Path, help="a sweep folder: its report is report.png")
    p.add_argument("--panel", action="store_true", help="only the knob panel in JupyterLab")
    p.add_argument("--out", type=Path, default=Path("assets"))
    p.add_argument("--report-height", type=int, default=1100,
                   help="px of the report's top to show (its tables grow with the runs)")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.panel:
        png, run_dir = panel_shot(args.out)
        run = describe([run_dir])[0]
        run.pop("run_dir")  # a temporary folder of the lab's
        shutil.rmtree(run_dir)
        meta = {"date": dt.date.today().isoformat(), "notebook": f"notebooks/{PANEL_NOTEBOOK}",
                "window": "1400 x 900, JupyterLab in Debian's chromium", "run": run}
        (args.out / "knob-panel.json").write_text(json.dumps(meta, indent=1))
        print(f"{png}  ({png.stat().st_size / 1e3:.0f} kB)")
        return
    if not (args.dashboard and args.compare):
        p.error("--dashboard and --compare are required (or --panel alone)")
    with tempfile.TemporaryDirectory() as tmp:
        if args.sweep:
            from workbench.ui.sweep_view import write_sweep_report

            report = write_sweep_report(args.sweep, Path(tmp) / "report.html")
        else:
            from workbench.ui.report import write_report

            report = write_report(args.compare, Path(tmp) / "report.html")
        written = shoot({"dashboard": (dashboard_page(args.dashboard), 1100, 780),
                         "comparison": (comparison_page(args.compare), 1100, 900),
                         "report": (report, 1280, args.report_height)}, args.out)
    meta = {"date": dt.date.today().isoformat(), "dashboard": describe([args.dashboard]),
            "compare": describe(args.compare), "sweep": str(args.sweep) if args.sweep else None,
            "files": [w.name for w in written]}
    (args.out / "screenshots.json").write_text(json.dumps(meta, indent=1))
    for w in written:
        print(f"{w}  ({w.stat().st_size / 1e3:.0f} kB)")
    devices = {m["gpu"] for m in meta["dashboard"] + meta["compare"]}
    print(f"from: {', '.join(html.unescape(str(d)) for d in devices)}")


if __name__ == "__main__":
    main()
