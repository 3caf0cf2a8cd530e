"""``python -m workbench`` as a new user first meets it: ``--help`` in whole sentences, and a
Python without the workbench's environment answered in one line that points at ./wb."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_help_does_not_cut_its_description_mid_list():
    r = subprocess.run([sys.executable, "-m", "workbench", "--help"], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert "zo-workbench: zeroth-order fine-tuning with CPU offloading" in text
    assert "``" not in r.stdout and "export, " not in text.split("positional")[0]
    description = text.split("...", 1)[1].split("positional arguments")[0].strip()
    assert description.endswith("says what each takes."), description


@pytest.mark.parametrize("command", [["demo"], ["run", "--out", "x"], []])
def test_a_python_without_torch_is_told_to_use_wb_in_one_line(command):
    """``-S`` leaves out site-packages: a Python without torch, as the system's python3 is."""
    r = subprocess.run([sys.executable, "-S", "-m", "workbench", *command], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stdout == "" and len(r.stderr.splitlines()) == 1, r.stderr
    assert r.stderr.startswith("error: torch is not installed in this Python (")
    assert "run the workbench through ./wb" in r.stderr and "Traceback" not in r.stderr
