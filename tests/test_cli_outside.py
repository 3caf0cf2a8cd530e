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


@pytest.mark.parametrize("content, says", [
    ("text,label\nhello,1\n", "1 example(s); a source without a dev split needs at least 2"),
    ("sentence,score\n" + "".join(f"s{i},1\n" for i in range(20)), "data:"),
])
def test_validate_refuses_the_data_run_refuses_with_the_same_line(tmp_path, content, says):
    data = tmp_path / "mine.csv"
    data.write_text(content)
    lines = {}
    for cmd in (["validate"], ["run", "--quiet", "--out", str(tmp_path / "run")]):
        r = subprocess.run([sys.executable, "-m", "workbench", *cmd, "--set", f"data={data}"],
                           cwd=REPO, capture_output=True, text=True, timeout=300)
        assert r.returncode == 2, (cmd, r.stdout, r.stderr)
        lines[cmd[0]] = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert lines["validate"] == lines["run"] and says in lines["run"][0], lines
    assert not (tmp_path / "run").exists()


def test_validate_says_the_data_sizes():
    r = subprocess.run([sys.executable, "-m", "workbench", "validate", "--set", "data=embedded"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("; data embedded: 240 train / 80 dev examples")
