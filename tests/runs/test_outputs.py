"""Nothing a user names as an output destroys what is there (``runs/outputs.py``), through the
real CLI: export --out, report -o and run --overwrite write only over their own kind of output,
and a refusal changes nothing on disk."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

TINY = ["model=tiny-opt", "data=synthetic", "steps=2", "batch_size=2", "seq_len=8",
        "sample_hz=0", "eval_samples=0"]


def _cli(*args: str, ok: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "workbench", *map(str, args)],
                       capture_output=True, text=True, timeout=300)
    if ok:
        assert r.returncode == 0, r.stderr[-3000:]
    return r


def _run(out: Path, *more: str) -> None:
    _cli("run", *[x for kv in TINY for x in ("--set", kv)], *more, "--out", out, "--quiet")


def _tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its bytes (a refusal must leave it as it was)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "r"
    _run(out, "--set", "checkpoint_every=1")
    return out


def _refused(r: subprocess.CompletedProcess, *words: str) -> str:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-3000:]
    assert lines[0].startswith("error: ") and all(w in lines[0] for w in words), lines[0]
    return lines[0]


@pytest.mark.parametrize("where", ["user_files", "other_run", "own_weights", "parent"])
def test_export_overwrite_never_deletes_what_is_not_an_export(where, run_dir, tmp_path):
    """export --overwrite used to delete whatever folder --out named (exit 0)."""
    root = run_dir.parent
    out = {"user_files": tmp_path / "mine", "other_run": tmp_path / "other",
           "own_weights": run_dir / "weights", "parent": root}[where]
    if where == "user_files":
        out.mkdir()
        (out / "notes.txt").write_text("my notes")
    if where == "other_run":
        _run(out)
    before = _tree(root), _tree(tmp_path)
    r = _cli("export", run_dir, "--out", out, "--overwrite", "--quiet", ok=False)
    line = _refused(r, "--out:", "not even with --overwrite")
    if where == "own_weights":
        assert f"is one of the files of the run in {run_dir.resolve()}" in line
    assert (_tree(root), _tree(tmp_path)) == before, line


def test_export_overwrite_replaces_an_export_and_keeps_the_users_files(run_dir, tmp_path):
    out = tmp_path / "e"
    _cli("export", run_dir, "--out", out, "--quiet")
    marker = json.loads((out / "workbench_export.json").read_text())
    assert "workbench_export.json" in marker["files"] and "config.json" in marker["files"]
    (out / "eval-notes.txt").write_text("kept")
    r = _cli("export", run_dir, "--out", out, "--quiet", ok=False)
    _refused(r, "already holds an export", "--overwrite")
    _cli("export", run_dir, "--out", out, "--overwrite", "--quiet")
    assert (out / "eval-notes.txt").read_text() == "kept"
    assert set(p.name for p in out.iterdir()) == set(marker["files"]) | {"eval-notes.txt"}
    assert not list(tmp_path.glob(".e.*"))  # no temporary folder left beside it


@pytest.mark.parametrize("target", ["run.json", "history.jsonl", "checkpoints/steps.jsonl"])
@pytest.mark.parametrize("overwrite", [False, True])
def test_report_never_writes_over_a_runs_files(target, overwrite, run_dir):
    """report R -o R/run.json turned the record into HTML (exit 0)."""
    path = run_dir / target
    if not path.exists():
        path.parent.mkdir(exist_ok=True)
        path.write_text("{}\n")  # history.jsonl exists while a run is running
    before = _tree(run_dir)
    r = _cli("report", run_dir, "-o", path, *(["--overwrite"] if overwrite else []), ok=False)
    _refused(r, "is a file of the run in", "not even with --overwrite")
    assert _tree(run_dir) == before


def test_report_replaces_only_its_own_reports_unless_overwrite(run_dir, tmp_path):
    mine = tmp_path / "notes.html"
    mine.write_text("<html>my page</html>")
    _refused(_cli("report", run_dir, "-o", mine, ok=False), "not a report this tool wrote",
             "--overwrite")
    assert mine.read_text() == "<html>my page</html>"
    report = tmp_path / "report.html"
    _cli("report", run_dir, "-o", report)
    _cli("report", run_dir, "-o", report)  # a report it wrote: replaced without asking
    assert "zo-workbench report" in report.read_text()[:2000]
    _cli("report", run_dir, "-o", mine, "--overwrite")
    assert "my page" not in mine.read_text()


def test_run_overwrite_keeps_a_report_the_user_saved(tmp_path):
    """run --out R --overwrite deleted R/report.html (a run never writes one)."""
    out = tmp_path / "r"
    _run(out)
    _cli("report", out, "-o", out / "report.html")
    saved = (out / "report.html").read_bytes()
    (out / "notes.txt").write_text("mine")
    _run(out, "--overwrite")
    assert (out / "report.html").read_bytes() == saved
    assert (out / "notes.txt").read_text() == "mine"
    assert json.loads((out / "run.json").read_text())["status"] == "done"
