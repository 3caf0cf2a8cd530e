"""JupyterLab driven by Debian's chromium through Playwright: a server on 127.0.0.1 serving a
folder of notebooks, and the steps a user takes in it (open a notebook, Run All, wait). Shared
by the browser test (``tests/browser``) and the README's panel screenshot (``screenshots.py``).
No browser is ever downloaded.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
SERVER_START_S = 90
KERNEL_START_S = 90
#: The window the issue reads the UI in: knobs and dashboard must both fit it.
WINDOW = {"width": 1400, "height": 900}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_lab_settings(settings_dir: Path) -> None:
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


@contextmanager
def lab_server(root: Path, home: Path) -> Iterator[tuple[str, str]]:
    """JupyterLab serving ``root`` (its settings and runtime files under ``home``); yields
    (url, token) once it answers, and stops it afterwards."""
    write_lab_settings(home / "settings")
    port, token = free_port(), secrets.token_hex(16)
    env = dict(os.environ,
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
               OMP_NUM_THREADS="1",  # the tiny model is fastest on one thread
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
        yield url, token
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


def wait_for_kernel(page, timeout_s: float = KERNEL_START_S) -> None:
    """The notebook's kernel has started and is idle. The indicator reads "idle" before a
    kernel exists too (with "No Kernel" beside it), so both are checked."""
    page.wait_for_function(
        """() => {
            const name = document.querySelector('.jp-NotebookPanel .jp-Toolbar-kernelName');
            const ind = document.querySelector('.jp-NotebookPanel .jp-Notebook-ExecutionIndicator');
            return name && /python/i.test(name.textContent)
                && ind && ind.dataset.status === 'idle';
        }""", timeout=timeout_s * 1e3, polling=250)


def run_all_cells(page) -> None:
    """Run > Run All Cells, through the menu bar as a user would."""
    page.locator("#jp-MainMenu .lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-item:visible .lm-Menu-itemLabel",
                 has_text=re.compile(r"^Run All Cells$")).click()


def wait_until_executed(page, timeout_s: float) -> None:
    """Every code cell shows an execution count and the kernel is idle again."""
    page.wait_for_function(
        """() => {
            const prompts = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt')];
            if (!prompts.length) return false;
            const done = prompts.every(p => /\\[\\d+\\]/.test(p.textContent));
            const busy = document.querySelector('.jp-Notebook-ExecutionIndicator[data-status="busy"]');
            return done && !busy;
        }""", timeout=timeout_s * 1e3, polling=500)


def open_and_run_all(page, url: str, token: str, notebook: str, timeout_s: float) -> None:
    """Open a notebook, check it starts its own kernel (no "Select Kernel" dialog), run all
    cells through the menu and wait until every cell has run."""
    # A workspace of its own: lab restores a workspace's open tabs, and another notebook
    # opened in the same page would answer for this one.
    workspace = notebook.split(".")[0].replace("_", "-")
    page.goto(f"{url}/lab/workspaces/{workspace}/tree/{notebook}?token={token}&reset",
              timeout=90_000)
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
    wait_for_kernel(page)
    assert page.locator(".jp-Dialog").count() == 0, page.locator(".jp-Dialog").inner_text()
    run_all_cells(page)
    wait_until_executed(page, timeout_s)


#: Every element of the knob column (``column``) whose text is wider than its box (a cut tab,
#: label, button or readout), or whose box reaches past the column or past an ancestor that
#: clips its overflow (an input cut off). Elements of a page not shown have no box: skipped.
CLIPPED_JS = """(column) => {
    const out = [];
    const named = el => (el.textContent || el.value || el.className).trim().slice(0, 40);
    const ownText = el => [...el.childNodes].some(n => n.nodeType === 3 && n.textContent.trim());
    for (const el of column.querySelectorAll('*')) {
        const control = ['INPUT', 'SELECT', 'TEXTAREA'].includes(el.tagName);
        if (!control && !ownText(el)) continue;
        const r = el.getBoundingClientRect();
        if (r.width === 0 || r.height === 0) continue;
        if (!control && el.scrollWidth > el.clientWidth + 1 && el.clientWidth > 0)
            out.push(['cut', el.tagName, named(el), el.scrollWidth, el.clientWidth]);
        for (let a = el.parentElement; a; a = a.parentElement) {
            const clips = a === column || getComputedStyle(a).overflowX !== 'visible';
            const e = a.getBoundingClientRect();
            if (clips && (r.right > e.right + 1 || r.left < e.left - 1)) {
                out.push(['outside', el.tagName, named(el), Math.round(r.left),
                          Math.round(r.right), Math.round(e.left), Math.round(e.right)]);
                break;
            }
            if (a === column) break;
        }
    }
    return out;
}"""


def clipped(column_locator) -> list:
    """What ``CLIPPED_JS`` finds in the knob column ``column_locator`` (empty: nothing cut)."""
    return column_locator.evaluate(CLIPPED_JS)
