"""``./wb``'s first-time setup as a user sees it: a line per stage, pip's output (and the
setuptools deprecation warnings some packages' builds print) in a log, with one line saying
what those warnings are. Run against a throwaway environment whose ``python`` only records what
it was asked (WB_VENV): no package is installed."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

FAKE_PYTHON = """#!/usr/bin/env bash
echo "$*" >> "$(dirname "$0")/../calls"
case "$*" in
  *"install -e"*)
    echo "  SetuptoolsDeprecationWarning: License classifiers are deprecated." >&2
    echo "  !! ******************************************************************" >&2 ;;
esac
exit 0
"""


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("sha256sum") is None,
                    reason="needs bash and sha256sum")
def test_first_time_setup_says_each_stage_and_explains_the_setuptools_warning(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    py = venv / "bin" / "python"
    py.write_text(FAKE_PYTHON)
    py.chmod(0o755)
    path = ":".join(p for p in os.environ["PATH"].split(":")
                    if not (Path(p) / "nvidia-smi").exists())  # the CPU path of the setup
    env = {**os.environ, "WB_VENV": str(venv), "PATH": path}
    r = subprocess.run(["bash", str(REPO / "wb"), "setup"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    said = r.stdout + r.stderr
    stages = [line for line in said.splitlines() if line.startswith("wb: [")]
    assert [s[:9] for s in stages] == ["wb: [1/4]", "wb: [2/4]", "wb: [3/4]", "wb: [4/4]"], said
    assert "SetuptoolsDeprecationWarning" not in said and "!! ***" not in said
    assert "wb: note: setuptools warned of deprecated settings" in said
    assert said.rstrip().endswith("wb: environment ready")
    log = (venv / ".wb-setup.log").read_text()
    assert "SetuptoolsDeprecationWarning" in log
    calls = (venv / "calls").read_text()
    assert "-m pip install -e .[all]" in calls
    # set up already: nothing more is installed, and nothing is said
    r = subprocess.run(["bash", str(REPO / "wb"), "setup"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout + r.stderr == ""
    assert (venv / "calls").read_text() == calls
