"""The notebooks in ``notebooks/``: well-formed, and each runs top to bottom on a CPU.

Every notebook is executed headless with nbclient in its ``cpu-demo`` size, with a temporary
directory as its working directory (so its ``runs/`` folders land there, not in the repo). A
notebook passes when no cell raised and it produced at least one plotly figure whose data is
embedded in the output (what an exported notebook needs to show its charts).
"""
from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
PLOTLY_MIME = "application/vnd.plotly.v1+json"
SIZE_LINE = re.compile(r'^SIZE = "cpu-demo"\s+# or "gpu-full"', re.M)
CELL_TIMEOUT_S = 300


def test_there_are_notebooks():
    names = [p.name for p in NOTEBOOKS]
    assert names == sorted(names) and len(names) >= 7, names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_clean_and_has_one_settings_cell(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.nbformat == 4
    # the kernel it runs on, so JupyterLab starts it without a "Select Kernel" dialog
    assert nb.metadata.kernelspec == {"display_name": "Python 3 (ipykernel)",
                                      "language": "python", "name": "python3"}
    assert nb.metadata.language_info.name == "python"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), \
        f"{path.name}: clear the outputs before committing"
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")
    # The size switch is the first code cell, and no other cell mentions a size.
    assert SIZE_LINE.search(code[0].source), f"{path.name}: first code cell must set SIZE"
    assert not any("SIZE =" in c.source for c in code[1:])
    assert sum(c.cell_type == "markdown" for c in nb.cells) >= 4, "a story needs prose"


@pytest.fixture
def kernel_env(monkeypatch):
    """Kernels see this checkout (installed or not) and run torch on one thread: the tiny
    models are fastest that way, and a loaded CI machine does not thrash."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_headless(path, tmp_path, kernel_env):
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", allow_errors=False,
        resources={"metadata": {"path": str(tmp_path)}})  # cwd: runs/ go to tmp_path
    t = time.perf_counter()
    client.execute()  # raises CellExecutionError, with the cell's traceback, on any error
    seconds = time.perf_counter() - t
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    errors = [o for o in outputs if o.output_type == "error"]
    assert not errors, f"{path.name}: {errors[0].ename}: {errors[0].evalue}"
    # A machine without NVML is said once, in a dashboard's status line, not per cell
    stderr = "".join(o.text for o in outputs if o.output_type == "stream" and o.name == "stderr")
    assert "NVML" not in stderr and "GPU metrics" not in stderr, stderr[:500]
    figures = [o for o in outputs if PLOTLY_MIME in o.get("data", {})]
    assert figures, f"{path.name}: no plotly figure output with embedded data"
    for fig in figures:
        spec = fig.data[PLOTLY_MIME]
        assert spec.get("data"), f"{path.name}: a plotly figure without traces"
    # The notebook renderer embeds plotly.js once, so classic viewers draw offline too.
    html = "".join(o.get("data", {}).get("text/html", "") for o in outputs)
    assert "plotly.js v" in html or "Plotly.newPlot" in html
    assert (tmp_path / "runs").is_dir(), "runs should be written under the working directory"
    print(f"{path.name}: {seconds:.1f} s, {len(figures)} plotly figures")
