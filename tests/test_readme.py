"""The README's command-line examples run as pasted, so they cannot drift from the code.

The block after the README's ``tests/test_readme.py runs the next block`` comment is run line
by line in a fresh folder (its ``runs/`` land there), ``./wb py`` standing for this
interpreter (``./wb`` would set up its environment first). A line passes when it exits 0, or
the status its comment names ("exit N"), and prints every "quoted" text of its comment. The
links the README gives to other files and to their sections resolve.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MARK = "<!-- tests/test_readme.py runs the next block"


def readme_block(text: str) -> list[str]:
    """The commands of the marked block: continuation lines joined, blank lines dropped."""
    after = text[text.index(MARK):]
    block = re.search(r"```bash\n(.*?)```", after, re.S).group(1)
    return [line for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def expectation(line: str) -> tuple[list[str], int, list[str]]:
    """(argv, exit status, texts the output must hold) of one README line."""
    command, _, comment = line.partition("  #")
    status = re.search(r"\bexit (\d+)", comment)
    argv = shlex.split(command)
    assert argv[:2] == ["./wb", "py"], f"a README example outside ./wb py: {line}"
    return ([sys.executable, *argv[2:]], int(status.group(1)) if status else 0,
            re.findall(r'"([^"]+)"', comment))


def test_the_block_is_there_and_sized_for_a_cpu():
    lines = readme_block(README.read_text(encoding="utf-8"))
    commands = {shlex.split(line)[4] for line in lines}  # ./wb py -m workbench COMMAND
    assert {"run", "compare", "report", "sweep", "plan", "validate"} <= commands, commands
    assert not any("device=cuda" in line for line in lines)
    assert len(README.read_text(encoding="utf-8").splitlines()) < 220  # a page to start from


def test_readme_examples_run_as_pasted(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "WORKBENCH_CACHE": str(tmp_path / "cache"),  # no calibration of this machine's own
        "OMP_NUM_THREADS": "1"}  # tiny-opt runs fastest on one thread, on a busy machine too
    for line in readme_block(README.read_text(encoding="utf-8")):
        argv, status, texts = expectation(line)
        t = time.perf_counter()
        r = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=600)
        print(f"{time.perf_counter() - t:6.1f} s  {line}")
        out = r.stdout + r.stderr
        assert r.returncode == status, f"{line}\n-> exit {r.returncode}\n{out[-3000:]}"
        for text in texts:
            assert text in out, f"{line}\n-> no {text!r} in\n{out[-3000:]}"
    assert (tmp_path / "runs" / "lr-report.html").is_file()
    assert (tmp_path / "runs" / "lr-sweep" / "sweep.json").is_file()


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


@pytest.mark.parametrize("page", ["README.md", "docs/reference.md", "docs/measurements.md"])
def test_links_resolve(page):
    path = ROOT / page
    text = path.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if target.startswith(("http://", "https://")):
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        assert dest.exists(), f"{page}: link to {target}: no such file"
        if anchor and dest.suffix == ".md":
            headings = re.findall(r"^#+ (.*)$", dest.read_text(encoding="utf-8"), re.M)
            assert anchor in {_anchor(h) for h in headings}, f"{page}: no section #{anchor}"
