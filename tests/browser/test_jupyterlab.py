"""The UI in a real browser: JupyterLab running the quickstart and sweep notebooks, and an
offline report, in a 1,400 x 900 window.

Drives Debian's chromium (``/usr/bin/chromium``, installed by ``./wb test`` when root) through
Playwright's Python API; no browser is ever downloaded. Skipped, with the reason, when chromium
or playwright is missing. Screenshots go to ``test-artifacts/`` (git-ignored) for a human look.
"""
from __future__ import annotations

import importlib.util
import re
import shutil
from contextlib import contextmanager
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
_spec = importlib.util.spec_from_file_location("lab_bench", REPO / "benchmarks" / "lab.py")
lab_tools = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lab_tools)  # the lab server and the user's steps, shared with screenshots
WIDGET_ERRORS = ("Error displaying widget", "Failed to load model class")
WIDGET_OUTPUT = ".jp-OutputArea-output .jupyter-widgets"  # an ipywidgets view in an output
RUN_ALL_S = 150


@pytest.fixture(scope="module")
def browser():
    if not lab_tools.CHROMIUM.exists():
        pytest.skip(f"{lab_tools.CHROMIUM} not found: install Debian's chromium (apt-get install "
                    "chromium; ./wb test does it when run as root)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(lab_tools.CHROMIUM),
                              args=lab_tools.CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on 127.0.0.1 serving a copy of notebooks/; yields (url, token, root)."""
    root = tmp_path_factory.mktemp("lab-root")
    for nb in (REPO / "notebooks").glob("*.ipynb"):
        shutil.copy(nb, root / nb.name)
    with lab_tools.lab_server(root, tmp_path_factory.mktemp("lab-home")) as (url, token):
        yield url, token, root


#: Every visible SVG text of each plotly figure (axis and subplot titles, tick labels, legend
#: entries, notes, slider labels) whose box overlaps another's by more than a pixel each way.
TEXT_OVERLAPS_JS = """() => {
    const pairs = [];
    for (const plot of document.querySelectorAll('.js-plotly-plot')) {
        const texts = [...plot.querySelectorAll('svg text')].filter(t => {
            if (!t.textContent.trim() || t.closest('.hoverlayer')) return false;
            const s = getComputedStyle(t);
            if (s.display === 'none' || s.visibility === 'hidden' || +s.opacity === 0) return false;
            const r = t.getBoundingClientRect();
            return r.width > 0 && r.height > 0;
        }).map(t => [t.textContent.trim(), t.getBoundingClientRect()]);
        for (let i = 0; i < texts.length; i++)
            for (let j = i + 1; j < texts.length; j++) {
                const [ta, a] = texts[i], [tb, b] = texts[j];
                const dx = Math.min(a.right, b.right) - Math.max(a.left, b.left);
                const dy = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
                if (dx > 1 && dy > 1) pairs.push([ta, tb]);
            }
    }
    return pairs;
}"""


def _text_overlaps(page) -> list[list[str]]:
    return page.evaluate(TEXT_OVERLAPS_JS)


#: Legends (``g.legend``, ``g.legend2``, ...) whose box overlaps a subplot's plot area (its
#: drag rectangle) by more than a pixel each way: a legend drawn over the data.
LEGENDS_ON_DATA_JS = """() => {
    const hits = [];
    for (const plot of document.querySelectorAll('.js-plotly-plot')) {
        const areas = [...plot.querySelectorAll('.draglayer .nsewdrag')]
            .map(r => r.getBoundingClientRect()).filter(r => r.width > 0 && r.height > 0);
        for (const g of plot.querySelectorAll('.infolayer > g[class^="legend"]')) {
            const a = g.getBoundingClientRect();
            if (!a.width || !a.height) continue;
            for (const b of areas) {
                const dx = Math.min(a.right, b.right) - Math.max(a.left, b.left);
                const dy = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
                if (dx > 1 && dy > 1) hits.push([g.getAttribute('class'), g.textContent]);
            }
        }
    }
    return hits;
}"""


def _legends_on_data(page) -> list[list[str]]:
    return page.evaluate(LEGENDS_ON_DATA_JS)


def _in_viewport(page, locator) -> bool:
    box, view = locator.bounding_box(), page.viewport_size
    return (box is not None and box["x"] >= 0 and box["y"] >= 0
            and box["x"] + box["width"] <= view["width"]
            and box["y"] + box["height"] <= view["height"])


def _open_and_run_all(page, url: str, token: str, notebook: str) -> None:
    lab_tools.open_and_run_all(page, url, token, notebook, RUN_ALL_S)


def _note_overlaps(page) -> list[list[str]]:
    """Pairs of "no ... data" notes drawn on top of each other within one figure (a CPU run's
    empty GPU panels each carry one; they must sit in their own panels)."""
    return page.evaluate(
        """() => {
            const pairs = [];
            for (const plot of document.querySelectorAll('.js-plotly-plot')) {
                const notes = [...plot.querySelectorAll('g.annotation')]
                    .filter(g => g.textContent.startsWith('no '))
                    .map(g => [g.textContent, g.getBoundingClientRect()]);
                for (let i = 0; i < notes.length; i++)
                    for (let j = i + 1; j < notes.length; j++) {
                        const [ta, a] = notes[i], [tb, b] = notes[j];
                        if (a.left < b.right && b.left < a.right && a.top < b.bottom
                            && b.top < a.bottom) pairs.push([ta, tb]);
                    }
            }
            return pairs;
        }""")


def _collect_errors(page) -> list[str]:
    """The page's uncaught JavaScript errors and the messages its console logs as errors
    (plotly's complaints about a figure's layout land there), as they happen."""
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(f"uncaught: {e}"))
    page.on("console", lambda m: errors.append(f"console: {m.text}") if m.type == "error"
            else None)
    return errors


@contextmanager
def _lab_page(browser, name: str):
    """A page in the issue's 1,400 x 900 window (knobs and dashboard must both fit it); yields
    the page and the list its JavaScript errors go to; a failure leaves ``name-failed.png``."""
    ARTIFACTS.mkdir(exist_ok=True)
    context = browser.new_context(viewport=lab_tools.WINDOW)
    page = context.new_page()
    page_errors = _collect_errors(page)
    try:
        yield page, page_errors
    except BaseException:
        page.screenshot(path=str(ARTIFACTS / f"{name}-failed.png"))
        raise
    finally:
        context.close()


def test_quickstart_runs_in_jupyterlab(browser, lab):
    url, token, root = lab
    with _lab_page(browser, "jupyterlab-quickstart") as (page, page_errors):
        _open_and_run_all(page, url, token, "01_quickstart.ipynb")
        last_code = page.locator(".jp-Notebook .jp-CodeCell").last
        last_code.locator(".jp-OutputArea-output").first.wait_for(timeout=30_000)
        assert "report:" in last_code.inner_text()

        # The live dashboard: plotly figures inside widget outputs (the panel's view and the
        # standalone one), with the final state drawn: timeline bars and the status line.
        dashboards = page.locator(f"{WIDGET_OUTPUT} .js-plotly-plot")
        dashboards.first.wait_for(timeout=30_000)
        page.wait_for_function(
            f"""() => document.querySelectorAll(
                '{WIDGET_OUTPUT} .js-plotly-plot .barlayer .point').length > 0""",
            timeout=30_000)
        text = page.locator(".jp-Notebook").inner_text()
        for message in WIDGET_ERRORS:
            assert message not in text, message
        assert "Traceback (most recent call last)" not in text
        assert "failed:" not in text  # the panel's message line after a failed run
        assert "done · step 60 of 60" in text  # the dashboard's status line, final refresh
        assert "next knob: " in text and "-bound" in text  # the verdict in the header
        assert "GPU metrics" not in text or text.count("GPU metrics off") == 2  # once each
        assert dashboards.count() >= 2, dashboards.count()
        assert page.locator(".jp-RenderedPlotly .barlayer .point").count()  # saved timeline
        assert not _note_overlaps(page)

        # The knob panel and its dashboard side by side, both inside the window, and no axis
        # title, tick label or legend entry of any figure on top of another.
        panel_cell = page.locator(".jp-Notebook .jp-CodeCell", has=page.locator(".wb-knobs"))
        panel_cell.locator(".jp-OutputArea").evaluate("el => el.scrollIntoView({block: 'start'})")
        page.wait_for_timeout(500)
        knobs = panel_cell.locator(".wb-knobs").first
        # No group name, knob label or input cut, on any group's page (the page of each group
        # is shown in turn, as a click on its button does)
        column = knobs.locator("..")
        groups = knobs.locator(".widget-toggle-button")
        assert groups.count() >= 6, groups.count()
        for i, name in enumerate(groups.all_inner_texts()):
            groups.nth(i).click()
            knobs.locator(f".wb-group-{name.strip()}").wait_for(state="visible", timeout=10_000)
            assert not lab_tools.clipped(column), (name, lab_tools.clipped(column)[:5])
        groups.first.click()
        knobs.locator(".wb-group-run").wait_for(state="visible", timeout=10_000)
        dashboard = panel_cell.locator(".js-plotly-plot").first
        assert _in_viewport(page, knobs), knobs.bounding_box()
        assert _in_viewport(page, dashboard), dashboard.bounding_box()
        kb, db = knobs.bounding_box(), dashboard.bounding_box()
        assert kb["x"] + kb["width"] <= db["x"]  # beside it
        # drawn at its container's width, not at plotly's 700 px default
        drawn = dashboard.locator(".main-svg").first.bounding_box()
        assert db["width"] >= 560 and abs(drawn["width"] - db["width"]) <= 2, (drawn, db)
        assert not _text_overlaps(page), _text_overlaps(page)[:5]
        page.screenshot(path=str(ARTIFACTS / "jupyterlab-quickstart.png"))
        assert any((root / "runs" / "01_quickstart").glob("*/report.html"))
        assert not page_errors, page_errors  # after the clicks above too


def test_sweep_notebook_runs_in_jupyterlab(browser, lab):
    url, token, root = lab
    with _lab_page(browser, "jupyterlab-sweeps") as (page, page_errors):
        _open_and_run_all(page, url, token, "09_sweeps.ipynb")
        text = page.locator(".jp-Notebook").inner_text()
        assert "Traceback (most recent call last)" not in text
        for message in WIDGET_ERRORS:
            assert message not in text, message
        assert "4 point(s): 4 to run" in text  # the widget's grid line, printed
        table = page.locator(".jp-Notebook .jp-CodeCell", has_text="sweep_obj.table()")
        assert table.inner_text().count("  done  ") == 4  # the sweep's table, printed
        assert "tune: needs a CUDA GPU" in text  # Tune on a CPU: why it cannot, in one line
        widget = page.locator(".jp-Notebook .jp-CodeCell", has=page.locator(".widget-select-multiple"))
        assert widget.locator("table.sweep tbody tr").count() >= 2  # the live table
        widget.locator(f"{WIDGET_OUTPUT} .js-plotly-plot .barlayer .point").first.wait_for(
            state="attached", timeout=30_000)  # the comparison, drawn (CPU: memory bars 0 wide)
        loss = page.locator(".jp-Notebook .jp-CodeCell", has_text="figures.compare_loss(")
        assert loss.locator(".js-plotly-plot .scatterlayer .trace").count() >= 8  # raw + EMA
        assert loss.locator(".js-plotly-plot .slider-container").count() == 1  # smoothing
        assert "(identical to " in loss.inner_text()  # runs whose losses coincide say so
        assert not _text_overlaps(page), _text_overlaps(page)[:5]
        assert not page_errors, page_errors
        widget.evaluate("el => el.scrollIntoView({block: 'start'})")
        page.wait_for_timeout(500)
        page.screenshot(path=str(ARTIFACTS / "jupyterlab-sweeps.png"))
        assert any((root / "runs" / "09_sweeps").glob("*-sweep/report.html"))


def test_report_renders_offline(browser, tmp_path):
    """Two CPU runs' report, read as a newcomer at 1,400 x 900: what happened at the top, no
    empty panel (no GPU ones on CPU runs), legends beside the data, the smoothing slider right
    above the loss chart, no console error, and not 10,000 px tall."""
    from workbench.config import RunConfig
    from workbench.recipes.train import run
    from workbench.ui.report import write_report

    ARTIFACTS.mkdir(exist_ok=True)
    tiny = dict(model="tiny-opt", steps=3, batch_size=4, seq_len=32, eval_samples=8)
    dirs = [tmp_path / m for m in ("mezo", "zo-offload")]
    for method, d in zip(("mezo", "zo-offload"), dirs):
        run(RunConfig(method=method, **tiny), d, progress=False)
    report = write_report(dirs, tmp_path / "report.html")

    context = browser.new_context(viewport={"width": 1400, "height": 900})
    blocked: list[str] = []

    def only_files(route):
        if route.request.url.startswith("file:"):
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    context.route("**/*", only_files)
    page = context.new_page()
    page_errors: list[str] = []
    page.on("pageerror", lambda e: page_errors.append(str(e)))
    page.on("console", lambda m: page_errors.append(f"console {m.type}: {m.text}")
            if m.type in ("error", "warning") else None)
    try:
        page.goto(report.resolve().as_uri(), timeout=60_000)
        page.wait_for_selector(".js-plotly-plot .main-svg", timeout=60_000)
        n_figures = page.locator(".js-plotly-plot").count()
        # one dashboard per run + bars, losses, dev metric by cost and timelines of the
        # comparison (no GPU memory)
        assert n_figures == len(dirs) + 4, n_figures
        assert page.locator(".js-plotly-plot .barlayer .point").count() > 0
        assert page.locator(".js-plotly-plot .scatterlayer .trace").count() > 0
        notes = page.locator(".js-plotly-plot g.annotation", has_text=re.compile(r"^no "))
        assert notes.count() == 0, notes.all_inner_texts()  # panels only for data they have
        assert page.locator("#story").bounding_box()["y"] < 900  # on the first screen
        assert page.locator("ul.story li").count() == len(dirs)
        assert not _legends_on_data(page), _legends_on_data(page)
        # the smoothing slider sits right above each loss chart, not a figure away
        for fig in page.locator(".js-plotly-plot", has=page.locator(".slider-container")).all():
            slider = fig.locator(".slider-container").bounding_box()
            title = fig.locator(".infolayer g.annotation",
                                has_text=re.compile(r"^(training )?loss")).first.bounding_box()
            assert 0 <= title["y"] - (slider["y"] + slider["height"]) < 60, (slider, title)
            assert slider["x"] < title["x"] + 600 or slider["x"] + slider["width"] > title["x"]
        height = page.evaluate("document.documentElement.scrollHeight")
        assert height < 5500, height  # 4,600 px before the dev metric by cost's 330 px
        assert not _note_overlaps(page)
        assert not _text_overlaps(page), _text_overlaps(page)[:5]
        assert not blocked, f"the report asked the network for {blocked[:3]}"
        assert not page_errors, page_errors
        page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)
        page.screenshot(path=str(ARTIFACTS / "report-top.png"))
    finally:
        context.close()
