"""The notebooks in ``notebooks/``: well-formed, and each runs top to bottom on a CPU.

Every notebook is executed headless with nbclient in its ``cpu-demo`` size, with a temporary
directory as its working directory (so its ``runs/`` folders land there, not in the repo). A
notebook passes when no cell raised (its cells that check what its prose says included),
nothing went to stderr, and it produced at least one plotly figure whose data is embedded in
the output (what an exported notebook needs to show its charts).
"""
from __future__ import annotations

import os
import re
import subprocess
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
#: Notebooks that train for minutes on a CPU: they print progress lines as they go.
TRAIN_FOR_MINUTES = ("11_export", "12_zo_rules")


def test_there_are_notebooks():
    names = [p.name for p in NOTEBOOKS]
    assert names == sorted(names) and len(names) >= 7, names


def unclean(nb) -> bool:
    """Whether some code cell holds outputs or an execution count (a notebook saved after
    running it, e.g. from ./wb lab)."""
    return any(c.outputs or c.execution_count is not None
               for c in nb.cells if c.cell_type == "code")


def clear_command(path: Path) -> str:
    """The command that clears ``path``'s outputs in place, from the repository's root."""
    return ("./wb py -m jupyter nbconvert --clear-output --inplace "
            f"{Path(os.path.relpath(path, REPO)).as_posix()}")


def unclean_message(path: Path) -> str:
    return (f"{path.name} was saved with its outputs (run in ./wb lab?); the tracked notebooks "
            f"are kept without them. Clear them with: {clear_command(path)} (or drop your "
            f"changes: git checkout {Path(os.path.relpath(path, REPO)).as_posix()})")


def test_a_notebook_saved_with_outputs_is_answered_with_the_command_that_clears_it(tmp_path):
    """The message names a command, and that command (run here with this Python) makes the
    notebook pass again."""
    src = NOTEBOOKS[0]
    nb = nbformat.read(src, as_version=4)
    cell = next(c for c in nb.cells if c.cell_type == "code")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="saved in the lab\n")]
    cell.execution_count = 1
    copy = tmp_path / src.name
    nbformat.write(nb, copy)
    assert unclean(nbformat.read(copy, as_version=4))
    message = unclean_message(copy)
    command = clear_command(copy)
    assert command in message and command.startswith("./wb py -m jupyter nbconvert")
    args = command.split()[2:]  # ./wb py ARGS... is the environment's python ARGS...
    r = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert not unclean(nbformat.read(copy, as_version=4))


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
    assert not unclean(nb), unclean_message(path)
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")
    # The size switch is the first code cell, and no other cell mentions a size.
    assert SIZE_LINE.search(code[0].source), f"{path.name}: first code cell must set SIZE"
    assert not any("SIZE =" in c.source for c in code[1:])
    assert sum(c.cell_type == "markdown" for c in nb.cells) >= 4, "a story needs prose"
    # What the prose says of the notebook's own results is checked by its code, so text and
    # output cannot disagree: every notebook asserts something of its runs
    assert any(re.search(r"^\s*assert ", c.source, re.M) for c in code[2:]), \
        f"{path.name}: no cell checks what the prose says of the results"


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
    # Nothing on stderr: no warning that is not the reader's business (a FutureWarning from a
    # library once showed as a pink box in every notebook), no progress bar, no log line; a
    # machine without NVML is said once, in a dashboard's status line
    stderr = "".join(o.text for o in outputs if o.output_type == "stream" and o.name == "stderr")
    assert not stderr, f"{path.name} wrote to stderr:\n{stderr[:1500]}"
    figures = [o for o in outputs if PLOTLY_MIME in o.get("data", {})]
    assert figures, f"{path.name}: no plotly figure output with embedded data"
    for fig in figures:
        spec = fig.data[PLOTLY_MIME]
        assert spec.get("data"), f"{path.name}: a plotly figure without traces"
    # The notebook renderer embeds plotly.js once, so classic viewers draw offline too.
    html = "".join(o.get("data", {}).get("text/html", "") for o in outputs)
    assert "plotly.js v" in html or "Plotly.newPlot" in html
    assert (tmp_path / "runs").is_dir(), "runs should be written under the working directory"
    if path.stem in TRAIN_FOR_MINUTES:  # a line every few seconds while they train
        stdout = "".join(o.text for o in outputs if o.output_type == "stream")
        assert re.search(r": step \d+ of \d+, loss ", stdout), f"{path.name}: no progress"
    print(f"{path.name}: {seconds:.1f} s, {len(figures)} plotly figures")
