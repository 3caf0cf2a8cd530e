"""The UI in a real browser: JupyterLab running the quickstart notebook, and an offline report.

Drives Debian's chromium (``/usr/bin/chromium``, installed by ``./wb test`` when root) through
Playwright's Python API; no browser is ever downloaded. Skipped, with the reason, when chromium
or playwright is missing. Screenshots go to ``test-artifacts/`` (git-ignored) for a human look.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
WIDGET_ERRORS = ("Error displaying widget", "Failed to load model class")
WIDGET_OUTPUT = ".jp-OutputArea-output .jupyter-widgets"  # an ipywidgets view in an output
SERVER_START_S = 90
KERNEL_START_S = 90
RUN_ALL_S = 150


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} not found: install Debian's chromium (apt-get install chromium; "
                    "./wb test does it when run as root)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_lab_settings(settings_dir: Path) -> None:
    """User settings for a quiet, deterministic lab: every cell attached to the DOM (so plots
    below the fold render), no news or update checks (no network, no pop-ups)."""
    for plugin, values in {
        "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
        "@jupyterlab/apputils-extension/notification": {
            "fetchNews": "false", "checkForUpdates": False, "doNotDisturbMode": True},
    }.items():
        path = settings_dir / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on 127.0.0.1 serving a copy of notebooks/; yields (url, token, root)."""
    root = tmp_path_factory.mktemp("lab-root")
    for nb in (REPO / "notebooks").glob("*.ipynb"):
        shutil.copy(nb, root / nb.name)
    home = tmp_path_factory.mktemp("lab-home")
    _write_lab_settings(home / "settings")
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ,
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
               OMP_NUM_THREADS="1",  # the tiny model is fastest on one thread
               PYTHONWARNINGS="ignore::RuntimeWarning",
               JUPYTERLAB_SETTINGS_DIR=str(home / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"),
               JUPYTER_RUNTIME_DIR=str(home / "runtime"),
               JUPYTER_CONFIG_DIR=str(home / "config"))
    log_path = home / "server.log"
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1",
           f"--port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
           f"--ServerApp.root_dir={root}", "--ServerApp.disable_check_xsrf=True",
           "--LabApp.news_url=", "--allow-root"]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for_server(proc, f"{url}/api/status", token, log_path)
        yield url, token, root
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _wait_for_server(proc: subprocess.Popen, status_url: str, token: str, log: Path) -> None:
    deadline = time.monotonic() + SERVER_START_S
    request = urllib.request.Request(status_url, headers={"Authorization": f"token {token}"})
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"JupyterLab exited with {proc.returncode}:\n"
                               f"{log.read_text(errors='replace')[-3000:]}")
        try:
            with urllib.request.urlopen(request, timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"JupyterLab did not answer {status_url} within {SERVER_START_S} s:\n"
                       f"{log.read_text(errors='replace')[-3000:]}")


def _wait_for_kernel(page, timeout_s: float) -> None:
    """The notebook's kernel has started and is idle. The indicator reads "idle" before a
    kernel exists too (with "No Kernel" beside it), so both are checked."""
    page.wait_for_function(
        """() => {
            const name = document.querySelector('.jp-NotebookPanel .jp-Toolbar-kernelName');
            const ind = document.querySelector('.jp-NotebookPanel .jp-Notebook-ExecutionIndicator');
            return name && /python/i.test(name.textContent)
                && ind && ind.dataset.status === 'idle';
        }""", timeout=timeout_s * 1e3, polling=250)


def _accept_kernel_dialog(page) -> None:
    """Should lab still ask which kernel to use, take the one it proposes (python3)."""
    dialog = page.locator(".jp-Dialog")
    try:
        dialog.wait_for(timeout=2_000)
    except Exception:  # no dialog: the usual case
        return
    dialog.get_by_role("button", name="Select").click()


def _run_all_cells(page) -> None:
    """Run > Run All Cells, through the menu bar as a user would."""
    page.locator("#jp-MainMenu .lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-item:visible .lm-Menu-itemLabel",
                 has_text=re.compile(r"^Run All Cells$")).click()


def _wait_until_executed(page, timeout_s: float) -> None:
    """Every code cell shows an execution count and the kernel is idle again."""
    page.wait_for_function(
        """() => {
            const prompts = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt')];
            if (!prompts.length) return false;
            const done = prompts.every(p => /\\[\\d+\\]/.test(p.textContent));
            const busy = document.querySelector('.jp-Notebook-ExecutionIndicator[data-status="busy"]');
            return done && !busy;
        }""", timeout=timeout_s * 1e3, polling=500)


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


def test_quickstart_runs_in_jupyterlab(browser, lab):
    url, token, root = lab
    ARTIFACTS.mkdir(exist_ok=True)
    context = browser.new_context(viewport={"width": 1500, "height": 1300})
    page = context.new_page()
    page_errors: list[str] = []
    page.on("pageerror", lambda e: page_errors.append(str(e)))
    try:
        page.goto(f"{url}/lab/tree/01_quickstart.ipynb?token={token}", timeout=90_000)
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
        _wait_for_kernel(page, KERNEL_START_S)
        _run_all_cells(page)
        _accept_kernel_dialog(page)
        _wait_until_executed(page, RUN_ALL_S)
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
        assert "done · step 8 of 8" in text  # the dashboard's status line, final refresh
        assert dashboards.count() >= 2, dashboards.count()
        assert page.locator(".jp-RenderedPlotly .barlayer .point").count()  # saved timeline
        assert not _note_overlaps(page)
        assert not page_errors, page_errors

        # Screenshot with the standalone dashboard at the top of the notebook's viewport.
        dashboards.nth(1).evaluate("el => el.closest('.jp-Cell').scrollIntoView({block: 'start'})")
        page.wait_for_timeout(500)
        page.screenshot(path=str(ARTIFACTS / "jupyterlab-quickstart.png"))
        assert any((root / "runs" / "01_quickstart").glob("*/report.html"))
    except BaseException:
        page.screenshot(path=str(ARTIFACTS / "jupyterlab-quickstart-failed.png"))
        raise
    finally:
        context.close()


@pytest.mark.filterwarnings("ignore:GPU metrics are off")  # CPU machines have no NVML
def test_report_renders_offline(browser, tmp_path):
    from workbench.config import RunConfig
    from workbench.recipes.train import run
    from workbench.ui.report import write_report

    ARTIFACTS.mkdir(exist_ok=True)
    tiny = dict(model="tiny-opt", steps=3, batch_size=4, seq_len=32, eval_samples=8)
    dirs = [tmp_path / m for m in ("mezo", "zo-offload")]
    for method, d in zip(("mezo", "zo-offload"), dirs):
        run(RunConfig(method=method, **tiny), d, progress=False)
    report = write_report(dirs, tmp_path / "report.html")

    context = browser.new_context(viewport={"width": 1400, "height": 1000})
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
    try:
        page.goto(report.resolve().as_uri(), timeout=60_000)
        page.wait_for_selector(".js-plotly-plot .main-svg", timeout=60_000)
        n_figures = page.locator(".js-plotly-plot").count()
        # one dashboard per run + bars, loss, memory and timelines of the comparison
        assert n_figures == len(dirs) + 4, n_figures
        assert page.locator(".js-plotly-plot .barlayer .point").count() > 0
        assert page.locator(".js-plotly-plot .scatterlayer .trace").count() > 0
        assert page.locator(".js-plotly-plot g.annotation", has_text="no GPU memory").count()
        assert not _note_overlaps(page)
        assert not blocked, f"the report asked the network for {blocked[:3]}"
        assert not page_errors, page_errors
        page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)
    finally:
        context.close()
