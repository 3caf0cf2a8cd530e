"""Where a notebook's runs go: the command line's ``runs/`` at the checkout's root when it runs
from the checkout's ``notebooks/`` folder, else under its working directory."""
from pathlib import Path

from workbench.ui.notebook import runs_dir

ROOT = Path(__file__).resolve().parents[2]


def test_a_notebook_of_the_checkout_writes_to_the_checkouts_runs():
    assert runs_dir("01_quickstart", ROOT / "notebooks") == ROOT / "runs" / "01_quickstart"


def test_elsewhere_runs_go_under_the_working_directory(tmp_path):
    assert runs_dir("01_quickstart", tmp_path) == tmp_path / "runs" / "01_quickstart"
    (tmp_path / "notebooks").mkdir()  # a folder of that name, not in a checkout
    assert runs_dir("x", tmp_path / "notebooks") == tmp_path / "notebooks" / "runs" / "x"
