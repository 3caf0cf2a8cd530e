"""Fault injection through the real CLI, in subprocesses: kill -9 at seeded random moments,
Ctrl-C and SIGTERM, a full disk, two runs on one directory, a reused directory, corrupted
checkpoints and records, malformed data and settings, a diverging loss, a run that cannot fit.

Each asserts the exit status, one line on stderr (warnings aside) and no traceback, and, where
the run can go on, that its final param_digest equals a straight run's.
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from workbench.runs import lockfile

REPO = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, OMP_NUM_THREADS="1",  # every run alike, and a loaded machine stays calm
           PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
RUN = ["model=tiny-opt", "method=mezo", "data=synthetic", "batch_size=4", "seq_len=16",
       "lr=2e-3", "steps=40", "checkpoint_every=2", "keep_last=2", "sample_hz=0"]
STEPS = 40


def sets(*items: str) -> list[str]:
    return [x for kv in items for x in ("--set", kv)]


def cli(*args: str, prefix: list[str] | None = None, timeout: float = 300):
    cmd = (prefix or [sys.executable, "-m", "workbench"]) + [*args] + (
        ["--quiet"] if args[0] == "run" else [])
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=timeout)


def start(*args: str, log: Path, prefix: list[str] | None = None) -> subprocess.Popen:
    """The CLI in the background, as from a terminal: Ctrl-C (SIGINT) at its default even when
    this process was started with it ignored (a background job of a shell)."""
    cmd = (prefix or [sys.executable, "-m", "workbench"]) + [*args, "--quiet"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(log, "w"), env=ENV,
                            text=True, preexec_fn=_default_sigint)


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def one_line(stderr: str, prefix: str = "error:") -> str:
    """The single line starting with ``prefix``; anything else may only be a warning."""
    assert "Traceback" not in stderr, stderr
    lines = [l for l in stderr.splitlines() if l.strip()]
    main = [l for l in lines if not l.startswith("warning:")]
    assert len(main) == 1 and main[0].startswith(prefix), stderr
    return main[0]


def record(run_dir: Path) -> dict:
    """run.json, parsed strictly: NaN or Infinity would fail (JSON has neither)."""
    def bad(token):
        raise AssertionError(f"run.json holds {token}")
    return json.loads((run_dir / "run.json").read_text(), parse_constant=bad)


def history_steps(run_dir: Path) -> int:
    try:
        return (run_dir / "history.jsonl").read_text().count('{"step"')
    except FileNotFoundError:
        return 0


def wait_for(predicate, proc: subprocess.Popen | None = None, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc is None or proc.poll() is None, f"the run ended early ({proc.returncode})"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def assert_clean(run_dir: Path, root: Path | None = None) -> None:
    """A finished run leaves no lock, no journal, no temp file and no partial checkpoint."""
    root = root or run_dir / "checkpoints"
    left = [p.name for p in run_dir.iterdir() if p.suffix == ".tmp" or p.name in
            ("run.lock", "history.jsonl")] + [p.name for p in root.glob("*.partial")]
    assert not left, left


def assert_same_as_straight(run_dir: Path, straight: dict) -> None:
    rec = record(run_dir)
    assert rec["status"] == "done"
    assert [s["step"] for s in rec["steps"]] == list(range(STEPS))  # no gap, no step twice
    assert rec["param_digest"] == straight["param_digest"]
    assert_clean(run_dir)


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("straight") / "run"
    r = cli("run", *sets(*RUN), "--out", str(out))
    assert r.returncode == 0, r.stderr
    return {"dir": out, **record(out)}


# --- kill -9, Ctrl-C, SIGTERM ---------------------------------------------------------------
def test_sigkill_at_five_random_moments_then_resume_equals_a_straight_run(straight, tmp_path):
    rng = random.Random(15)
    # The moments: right after the lock is taken (before any step), then at random steps.
    targets = [0] + sorted(rng.sample(range(3, STEPS - 6), 4))
    out, stderr = tmp_path / "run", []
    for i, target in enumerate(targets):
        args = ["run", *sets(*RUN), "--out", str(out)] if i == 0 else ["run", "--resume", str(out)]
        proc = start(*args, log=tmp_path / f"{i}.log")
        wait_for(lambda: (out / "run.json").is_file() and (out / "run.lock").is_file()
                 and (out / "run.lock").read_text().strip() == str(proc.pid), proc)
        assert record(out)["status"] == "running"  # run.json from the first second
        wait_for(lambda: history_steps(out) >= target, proc)
        time.sleep(rng.uniform(0, 0.05))
        assert proc.poll() is None, "the run finished before it could be killed"
        proc.kill()
        assert proc.wait() == -signal.SIGKILL
        stderr.append((tmp_path / f"{i}.log").read_text())
    r = cli("run", "--resume", str(out))
    assert r.returncode == 0, r.stderr
    assert "taking over the lock of pid" in "".join(stderr[1:]) + r.stderr
    assert_same_as_straight(out, straight)


def test_sigint_then_sigterm_stop_cleanly_and_resume_exactly(straight, tmp_path):
    out = tmp_path / "run"
    proc = start("run", *sets(*RUN), "--out", str(out), log=tmp_path / "int.log")
    for sig, status, args in ((signal.SIGINT, 130, None),
                              (signal.SIGTERM, 143, ["run", "--resume", str(out)])):
        before = len(record(out)["steps"]) if args else 0
        if args:
            proc = start(*args, log=tmp_path / "term.log")
        wait_for(lambda: history_steps(out) >= before + 5, proc)
        proc.send_signal(sig)
        assert proc.wait(timeout=120) == status
        log = tmp_path / ("int.log" if sig == signal.SIGINT else "term.log")
        line = one_line(log.read_text(), prefix=f"stopped by {sig.name} after step")
        rec = record(out)
        step = len(rec["steps"])
        assert rec["status"] == "stopped" and [s["step"] for s in rec["steps"]] == list(range(step))
        assert f"checkpoint step-{step:08d} kept" in line  # taken at the stop
        assert (out / "checkpoints" / f"step-{step:08d}" / "manifest.json").is_file()
        assert_clean(out)
    r = cli("run", "--resume", str(out))
    assert r.returncode == 0, r.stderr
    assert_same_as_straight(out, straight)


# --- disks --------------------------------------------------------------------------------
FAULT_CLI = [sys.executable, str(Path(__file__).with_name("fault_cli.py"))]


@contextlib.contextmanager
def failing_disk(tmp_path: Path, kind: str = "full"):
    """(checkpoint_dir, CLI prefix, fail, heal): a 4 MiB tmpfs, filled up to ~100 KiB or made
    read-only, when this process may mount one (root); else the CLI with shard writes failing
    ENOSPC / EROFS while a flag file exists (``fault_cli.py``)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    mounted = os.geteuid() == 0 and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)],
        capture_output=True).returncode == 0
    try:
        if mounted:
            (mnt / "ck").mkdir()
            filler = mnt / "filler"

            def fail():
                if kind == "full":
                    filler.write_bytes(b"\0" * (shutil.disk_usage(mnt).free - 100 * 1024))
                else:
                    subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)

            def heal():
                if kind == "full":
                    filler.unlink()
                else:
                    subprocess.run(["mount", "-o", "remount,rw", str(mnt)], check=True)
            yield mnt / "ck", None, fail, heal
        else:
            flag = tmp_path / "disk-fails"
            yield (mnt / "ck", [*FAULT_CLI, "disk", str(flag)],
                   lambda: flag.write_text("read-only" if kind == "read-only" else "full"),
                   flag.unlink)
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(mnt)], check=True)


@pytest.mark.parametrize("kind, says", [("full", "No space left on device"),
                                        ("read-only", "Read-only file system")])
def test_failing_checkpoint_writes_are_reported_and_after_three_the_run_fails(straight, tmp_path,
                                                                              kind, says):
    with failing_disk(tmp_path, kind) as (root, prefix, fail, heal):
        fail()
        out = tmp_path / "run"
        r = cli("run", *sets(*RUN, f"checkpoint_dir={root}"), "--out", str(out), prefix=prefix)
        if prefix is None and kind == "read-only":  # a real read-only mount: not even its
            assert r.returncode == 2  # checkpoint.lock can be made, so the start is refused
            assert f"checkpoint_dir: cannot write the lock {root / 'checkpoint.lock'} (" \
                f"{says})" in one_line(r.stderr)
            assert not (out / "run.json").exists() and not (out / "run.lock").exists()
            return
        assert r.returncode == 1
        line = one_line(r.stderr)
        assert line.startswith("error: checkpoint_dir: 3 checkpoint writes failed in a row")
        assert says in line
        assert r.stderr.count("warning: checkpoint_dir: a checkpoint write failed") == 3
        rec = record(out)  # written before and after the failures, never lost
        assert rec["status"] == "failed" and rec["error"].startswith("checkpoint_dir: 3")
        assert 6 <= len(rec["steps"]) < STEPS
        assert not list(root.glob("step-*"))  # no partial checkpoint left behind
        assert_clean(out, root)
        if kind == "read-only":
            return
        # The advice works: the run goes on, writing its checkpoints elsewhere (issue 37)
        advice = line.split("resume writing elsewhere: ")[1]
        assert advice == "--resume RUN_DIR --set checkpoint_dir=FOLDER"
        elsewhere = tmp_path / "elsewhere"
        r = cli("run", "--resume", str(out), *sets(f"checkpoint_dir={elsewhere}"), prefix=prefix)
        assert r.returncode == 0, r.stderr
        assert "no complete checkpoint yet" in r.stderr  # none was written: from step 0
        assert_same_as_straight(out, straight)
        assert (elsewhere / f"step-{STEPS:08d}").is_dir() and not list(root.glob("step-*"))


def fs_fault(mode: str, root: Path, flag: Path) -> list[str]:
    """The CLI with every write under ``root`` failing while ``flag`` exists (fault_cli.py)."""
    return [*FAULT_CLI, "fs", mode, str(root), str(flag)]


def test_a_full_run_directory_ends_consistent_and_the_advice_works(straight, tmp_path):
    """--out fills up mid-run: history, run.json and checkpoint writes fail; the run ends in one
    line saying run.json could not be written and how to go on; no lock stays; once space is
    back, that advice finishes the run exactly (issue 37, class 8)."""
    disk, flag, out = tmp_path / "disk", tmp_path / "full", tmp_path / "disk" / "run"
    disk.mkdir()
    proc = start("run", *sets(*RUN), "--out", str(out), log=tmp_path / "full.log",
                 prefix=fs_fault("full", disk, flag))
    wait_for(lambda: history_steps(out) >= 8, proc)
    flag.touch()
    assert proc.wait(timeout=300) == 1
    line = one_line((tmp_path / "full.log").read_text())
    assert "No space left on device" in line
    assert line.endswith(f"{out / 'run.json'} could not be written either and still says running; "
                         f"free space, then continue with: python -m workbench run --resume {out})")
    assert record(out)["status"] == "running"  # the last good run.json: valid, never torn
    assert not (out / "run.lock").exists()
    flag.unlink()
    r = cli("run", "--resume", str(out))
    assert r.returncode == 0, r.stderr
    assert_same_as_straight(out, straight)


@pytest.mark.parametrize("mode, says", [("full", "cannot write the lock"),
                                        ("read-only", "cannot create")])
def test_a_start_on_a_disk_that_takes_nothing_leaves_nothing(tmp_path, mode, says):
    disk, flag, out = tmp_path / "disk", tmp_path / "flag", tmp_path / "disk" / "run"
    disk.mkdir()
    flag.touch()
    r = cli("run", *sets(*RUN, "steps=2"), "--out", str(out), prefix=fs_fault(mode, disk, flag))
    assert r.returncode == 2
    line = one_line(r.stderr)
    assert line.startswith("error: --out: ") and says in line and "nothing was started" in line
    assert not (out / "run.lock").exists() and not (out / "run.json").exists()
    if mode == "full":
        flag.unlink()
        r = cli("run", *sets(*RUN, "steps=2"), "--out", str(out))  # the next run: a plain start
        assert r.returncode == 0, r.stderr
        assert record(out)["status"] == "done"


def test_full_disk_for_a_while_training_goes_on(straight, tmp_path):
    with failing_disk(tmp_path) as (root, prefix, fail, heal):
        fail()
        out = tmp_path / "run"
        # Checkpoints every 8 steps (they do not change the trajectory): time to free space.
        cmd = (prefix or [sys.executable, "-m", "workbench"]) + [
            "run", *sets(*RUN, f"checkpoint_dir={root}", "checkpoint_every=8"),
            "--out", str(out), "--quiet"]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, env=ENV)
        lines: list[str] = []
        healed: list = []

        def read():
            for line in proc.stderr:
                lines.append(line)
                if "a checkpoint write failed" in line and not healed:
                    healed.append(heal())  # space comes back after the first failure
        reader = threading.Thread(target=read)
        reader.start()
        assert proc.wait(timeout=300) == 0, "".join(lines)
        reader.join()
        assert "Traceback" not in "".join(lines)
        # Space comes back 8 steps before the next checkpoint; a slow reader may miss one more.
        assert 1 <= sum("a checkpoint write failed" in l for l in lines) <= 2
        rec = record(out)
        assert rec["status"] == "done" and rec["param_digest"] == straight["param_digest"]
        assert [p.name for p in sorted(root.glob("step-*"))] == [
            "step-00000032", "step-00000040"]
        assert_clean(out, root)


def test_a_run_that_cannot_fit_is_refused_and_force_starts_it(tmp_path):
    out = tmp_path / "run"
    r = cli("run", *sets(*RUN), "--out", str(out), prefix=[*FAULT_CLI, "lowmem"])
    assert r.returncode == 2
    assert "host memory: mezo on tiny-opt needs" in one_line(r.stderr) and not out.exists()
    r = cli("run", *sets(*RUN, "steps=2"), "--out", str(out), "--force",
            prefix=[*FAULT_CLI, "lowmem"])
    assert r.returncode == 0, r.stderr
    assert record(out)["status"] == "done"


# --- directories ----------------------------------------------------------------------------
def test_two_runs_on_one_directory_the_second_is_refused(tmp_path):
    out = tmp_path / "run"
    # The first run is long enough to be still running while the second starts (a 40-step
    # tiny run can end before a second interpreter has imported torch); Ctrl-C ends it.
    long = [kv for kv in RUN if not kv.startswith("steps=")] + ["steps=100000"]
    ck = tmp_path / "ck"  # its checkpoints outside the run directory: locked as well
    first = start("run", *sets(*long, f"checkpoint_dir={ck}"), "--out", str(out),
                  log=tmp_path / "first.log")
    wait_for(lambda: history_steps(out) >= 1, first)
    r = cli("run", *sets(*RUN), "--out", str(out))
    assert r.returncode == 2
    assert f"is being written by another run (pid {first.pid}" in one_line(r.stderr)
    r = cli("run", *sets(*RUN, f"checkpoint_dir={ck}"), "--out", str(tmp_path / "other"))
    assert r.returncode == 2  # two runs writing one checkpoint_dir: the second never starts
    assert f"checkpoint_dir: {ck} is in use by another run (pid {first.pid}, checkpoint.lock)" \
        in one_line(r.stderr)
    assert not (tmp_path / "other").exists()
    assert first.poll() is None  # the refusal did not disturb it
    first.send_signal(signal.SIGINT)
    assert first.wait(timeout=120) == 130
    rec = record(out)  # the first run's record is whole: every step once, in order
    assert rec["status"] == "stopped" and rec["config"]["steps"] == 100000
    assert [s["step"] for s in rec["steps"]] == list(range(len(rec["steps"])))
    assert_clean(out, ck)
    assert not (ck / "checkpoint.lock").exists()


def test_a_reused_directory_is_refused_and_overwrite_replaces_it(straight, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(straight["dir"], out)
    (out / "checkpoints" / "step-00000099").mkdir()  # must not survive --overwrite
    (out / "notes.txt").write_text("mine")  # not the run's: never deleted
    before = (out / "run.json").read_bytes()
    r = cli("run", *sets(*RUN), "--out", str(out))
    assert r.returncode == 2
    line = one_line(r.stderr)
    assert "already holds a run" in line and "--resume" in line and "--overwrite" in line
    assert (out / "run.json").read_bytes() == before
    r = cli("run", *sets(*RUN), "--out", str(out), "--overwrite")
    assert r.returncode == 0, r.stderr
    assert not (out / "checkpoints" / "step-00000099").exists()
    assert (out / "notes.txt").read_text() == "mine"
    assert_same_as_straight(out, straight)


def test_a_checkpoint_dir_belongs_to_the_run_that_wrote_it(straight, tmp_path):
    """Issue 37, class 1: another run may not take a checkpoint_dir whose run can still resume
    from it (not even with --overwrite); a resume never loads another run's checkpoints."""
    ck, a, b = tmp_path / "ck", tmp_path / "a", tmp_path / "b"
    r = cli("run", *sets(*RUN, f"checkpoint_dir={ck}", "steps=20"), "--out", str(a))
    assert r.returncode == 0, r.stderr
    for extra in ([], ["--overwrite"]):
        r = cli("run", *sets(*RUN, f"checkpoint_dir={ck}", "seed=1"), "--out", str(b), *extra)
        assert r.returncode == 2
        assert f"checkpoint_dir: {ck} holds the checkpoints of the run in {a.resolve()}" in \
            one_line(r.stderr)
        assert not b.exists()
    r = cli("run", "--resume", str(a), *sets(f"steps={STEPS}"))  # A itself goes on exactly
    assert r.returncode == 0, r.stderr
    assert_same_as_straight(a, straight)
    manifest = json.loads((ck / f"step-{STEPS:08d}" / "manifest.json").read_text())
    ident = manifest["identity"]
    assert ident["run_id"] == record(a)["info"]["run_id"] and ident["run_dir"] == str(a.resolve())
    assert (ident["model"], ident["seed"]) == ("tiny-opt", 0) and len(ident["data"]) == 16
    # A's directory moves away: its checkpoints are nobody's, and --overwrite may take them
    moved = tmp_path / "a-moved"
    shutil.move(str(a), str(moved))
    r = cli("run", *sets(*RUN, f"checkpoint_dir={ck}", "seed=1", "steps=4"), "--out", str(b),
            "--overwrite")
    assert r.returncode == 0, r.stderr
    r = cli("run", "--resume", str(moved), *sets(f"steps={STEPS + 4}"))  # B's weights: never
    assert r.returncode == 2
    line = one_line(r.stderr)
    assert f"checkpoint_dir: {ck} holds checkpoints of another run (step-00000004: run id " \
        f"{record(b)['info']['run_id']}, written by the run in {b.resolve()})" in line
    assert record(moved)["status"] == "done" and len(record(moved)["steps"]) == STEPS


DATA = [{"text": f"{w} film number {i}", "label": i % 3}
        for i, w in enumerate(["a dull", "an odd", "a fine", "a grim", "a warm", "a slow"] * 5)]
WORDS = " bad, fine, great"  # three labels; the spaces are part of the words


def test_a_resume_refuses_changed_data_unless_told(tmp_path):
    """Issue 37, class 2 (and 3, 4): the run records its data's fingerprint; a resume on edited
    data is refused, on the restored data it ends as a straight run does, and with
    data_changed_ok=true it goes on, recorded. The straight run sets label_words with --set, the
    other in TOML: the same words (nothing stripped). The train file starts with a UTF-8 BOM."""
    data = tmp_path / "data"
    data.mkdir()
    train = b"\xef\xbb\xbf" + "".join(json.dumps(r) + "\n" for r in DATA).encode()
    (data / "train.jsonl").write_bytes(train)
    (data / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in DATA[:6]))
    task = ["model=tiny-opt", "method=mezo", f"data={data}", "batch_size=4", "seq_len=32",
            "lr=2e-3", "checkpoint_every=4", "sample_hz=0", "eval_samples=6"]
    r = cli("run", *sets(*task, "steps=8", f"label_words={WORDS}"), "--out", str(tmp_path / "s"))
    assert r.returncode == 0, r.stderr
    straight = record(tmp_path / "s")
    assert straight["config"]["label_words"] == WORDS
    toml = tmp_path / "words.toml"
    toml.write_text(f"[run]\nlabel_words = {json.dumps(WORDS)}\n")
    out = tmp_path / "r"
    r = cli("run", "--config", str(toml), *sets(*task, "steps=4"), "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert record(out)["info"]["data_fingerprint"]["train"]["source"] == str(data / "train.jsonl")
    lines = train.splitlines(keepends=True)
    (data / "train.jsonl").write_bytes(b"".join([lines[0], lines[2], lines[1], *lines[3:]]))
    r = cli("run", "--resume", str(out), *sets("steps=8"))
    assert r.returncode == 2
    assert one_line(r.stderr) == (
        f"error: data: the train split ({data / 'train.jsonl'}) changed since this run started "
        "(its content fingerprint differs); a resume continues on the data it began with: "
        "restore it, or set data_changed_ok=true to go on with the new data (run.json records "
        "that)")
    (data / "train.jsonl").write_bytes(train)  # restored: the resume is the straight run
    r = cli("run", "--resume", str(out), *sets("steps=8"))
    assert r.returncode == 0, r.stderr
    assert record(out)["param_digest"] == straight["param_digest"]
    (data / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in DATA[6:12]))
    r = cli("run", "--resume", str(out), *sets("steps=10"))
    assert r.returncode == 2 and "the dev split" in one_line(r.stderr)
    r = cli("run", "--resume", str(out), *sets("steps=10", "data_changed_ok=true"))
    assert r.returncode == 0, r.stderr
    assert "warning: data: the dev split" in r.stderr
    rec = record(out)
    assert rec["config"]["data_changed_ok"] is True
    assert [c["changed"] for c in rec["info"]["data_changed"]] == [
        [f"the dev split ({data / 'dev.jsonl'})"]]
    r = cli("run", "--resume", str(out), *sets("steps=12"))  # the new data is the run's now
    assert r.returncode == 0, r.stderr
    rec = record(out)
    assert rec["config"]["data_changed_ok"] is False and len(rec["info"]["data_changed"]) == 1
    assert [s["step"] for s in rec["steps"]] == list(range(12))


def test_corrupted_checkpoint_falls_back_and_a_damaged_record_is_one_line(straight, tmp_path):
    out = tmp_path / "run"
    r = cli("run", *sets(*RUN, "steps=20"), "--out", str(out))
    assert r.returncode == 0, r.stderr
    shard = out / "checkpoints" / "step-00000020" / "p2.safetensors"
    data = bytearray(shard.read_bytes())
    data[-5] ^= 0xFF
    shard.write_bytes(bytes(data))
    damaged = tmp_path / "damaged"  # a copy with run.json and events.json.gz cut short
    shutil.copytree(out, damaged)
    hopeless = tmp_path / "hopeless"  # a copy with every checkpoint corrupted
    shutil.copytree(out, hopeless)
    for ck in (hopeless / "checkpoints").glob("step-*"):
        (ck / "p1.safetensors").write_bytes(b"garbage")
    for name in ("run.json", "events.json.gz"):
        blob = (damaged / name).read_bytes()
        (damaged / name).write_bytes(blob[:len(blob) // 2])
    events = (out / "events.json.gz").read_bytes()  # the run itself: its telemetry cut short
    (out / "events.json.gz").write_bytes(events[:len(events) // 2])
    html = str(tmp_path / "r.html")
    calls = [("run", "--resume", str(damaged)), ("compare", str(damaged)),
             ("report", str(damaged), "-o", html), ("report", str(out), "-o", html),
             ("run", "--resume", str(hopeless)), ("compare", str(out))]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda a: cli(*a), calls))
    said = ["run.json cannot be read: truncated or damaged"] * 3 + [
        "events.json.gz cannot be read: truncated or damaged",
        "error: resume: no usable checkpoint in"]
    for args, r, line in zip(calls, results, said):
        assert r.returncode == 2, (args, r.stderr)
        assert line in one_line(r.stderr), args
    assert results[-1].returncode == 0, results[-1].stderr  # compare needs no telemetry
    r = cli("run", "--resume", str(out), *sets(f"steps={STEPS}"))
    assert r.returncode == 0, r.stderr
    assert "step-00000020" in r.stderr and "corrupted" in r.stderr  # said, then step-18 used
    assert "events.json.gz cannot be read" in r.stderr  # said; the resume goes on without it
    assert_same_as_straight(out, straight)


# --- sweeps (issue 37, class 6) ---------------------------------------------------------------
def test_a_sweep_folder_has_a_lifecycle(straight, tmp_path):
    """A lock (a second sweep into the folder is refused), Ctrl-C then --resume (the interrupted
    point continues from its checkpoint and ends as a straight run), a rerun refused before any
    damage."""
    out = tmp_path / "sweep"
    grid = [*sets(*[kv for kv in RUN if not kv.startswith("steps=")]), "--sweep", "steps=40,4",
            "--out", str(out)]
    first = start("sweep", *grid, log=tmp_path / "sweep.log")
    point = out / "steps-40"
    wait_for(lambda: history_steps(point) >= 5, first)
    first.send_signal(signal.SIGINT)
    assert first.wait(timeout=120) == 130
    log = (tmp_path / "sweep.log").read_text()
    assert "Traceback" not in log
    assert f"finish it with: python -m workbench sweep --resume {out}" in log
    assert not (out / "sweep.lock").exists()
    # While a sweep holds the folder (here: this process holds its lock) a second is refused
    fd = lockfile.take(out / "sweep.lock", "busy {pid}", "--out")
    try:
        for args in (grid, ["--resume", str(out)]):
            r = cli("sweep", *args, "--quiet")
            assert r.returncode == 2
            assert f"is being written by another sweep (pid {os.getpid()}, sweep.lock)" in \
                one_line(r.stderr)
    finally:
        lockfile.release(out / "sweep.lock", fd)
    before = (out / "sweep.json").read_bytes()
    manifest = json.loads(before)
    assert manifest["status"] == "stopped" and record(point)["status"] == "stopped"
    assert not (out / "sweep.lock").exists()
    r = cli("sweep", *grid, "--quiet")  # again, unasked: refused, nothing touched
    assert r.returncode == 2
    assert f"holds a sweep (status stopped, 0 of 2 points done); finish it with --resume {out}" \
        in one_line(r.stderr)
    assert (out / "sweep.json").read_bytes() == before
    r = cli("sweep", "--resume", str(out), "--quiet")
    assert r.returncode == 0, r.stderr
    manifest = json.loads((out / "sweep.json").read_text())
    assert manifest["status"] == "done"
    assert [p["status"] for p in manifest["points"]] == ["done", "done"]
    assert_same_as_straight(point, straight)
    assert len(record(out / "steps-4")["steps"]) == 4


def test_a_sweep_folder_is_replaced_only_with_overwrite(tmp_path):
    out = tmp_path / "sweep"
    grid = [*sets(*[kv for kv in RUN if not kv.startswith("steps=")], "steps=2"), "--sweep",
            "seed=3", "--out", str(out), "--quiet"]
    assert cli("sweep", *grid).returncode == 0
    (out / "notes.txt").write_text("mine")
    old_id = record(out / "seed-3")["info"]["run_id"]
    r = cli("sweep", *grid)
    assert r.returncode == 2 and "--overwrite" in one_line(r.stderr)
    r = cli("sweep", *grid, "--overwrite")
    assert r.returncode == 0, r.stderr
    assert record(out / "seed-3")["info"]["run_id"] != old_id  # a new run
    assert (out / "notes.txt").read_text() == "mine"  # not the sweep's: kept
    r = cli("sweep", "--resume", str(out), "--overwrite")
    assert r.returncode == 2 and "--overwrite: not with --resume" in one_line(r.stderr)


# --- records with holes (issue 37, class 7) ---------------------------------------------------
def test_records_with_holes_are_read_with_what_is_there(straight, tmp_path):
    cases = {}
    for hole in ("summary", "config", "steps"):
        d = tmp_path / hole
        d.mkdir()
        rec = record(straight["dir"])
        rec[hole] = None
        (d / "run.json").write_text(json.dumps(rec))
        cases[f"compare {hole}"] = (("compare", str(d)), 0, None)
    # a report draws what compare shows and more: one with holes stands for the three
    cases["report holes"] = (("report", str(tmp_path / "steps"), str(tmp_path / "summary"),
                              str(tmp_path / "config"), "-o", str(tmp_path / "holes.html")), 0,
                             None)
    # a resume needs the settings the run started with: defaults in their place resumed a
    # different run (batch 8 x 64 after 4 x 32), exit 0 and no warning
    cases["resume config"] = (("run", "--resume", str(tmp_path / "config")), 2,
                              "has no config (null or missing): the settings this run started "
                              "with are unknown")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "run.json").write_text(json.dumps({**record(straight["dir"]), "steps": "many"}))
    cases["compare wrong type"] = (("compare", str(bad)), 2, "'steps' is str, not a list")
    disk, flag = tmp_path / "ro", tmp_path / "ro-flag"
    disk.mkdir()
    flag.touch()
    cases["report read-only"] = (("report", str(straight["dir"]), "-o", str(disk / "r.html")),
                                 2, f"-o: cannot write {disk / 'r.html'} (Read-only file system)")
    (tmp_path / "afile").write_text("")
    cases["report under a file"] = (("report", str(straight["dir"]), "-o",
                                     str(tmp_path / "afile" / "r.html")), 2,
                                    f"({tmp_path / 'afile'} is a file, not a folder)")
    prefix = {"report read-only": fs_fault("read-only", disk, flag)}
    with ThreadPoolExecutor(4) as pool:
        results = dict(zip(cases, pool.map(lambda k: cli(*cases[k][0], prefix=prefix.get(k)),
                                           cases)))
    for name, r in results.items():
        args, code, said = cases[name]
        assert r.returncode == code, (name, r.stderr)
        assert "Traceback" not in r.stderr, name
        if said:
            assert said in one_line(r.stderr), name
    assert "run" in results["compare config"].stdout  # the table, with what is there
    assert (tmp_path / "holes.html").is_file() and not (disk / "r.html").exists()


# --- bad input: one line, exit 2, nothing written ---------------------------------------------
def _write_bad_inputs(d: Path) -> dict[str, tuple[list[str], str]]:
    """name -> (CLI arguments, what the one line must say)."""
    files = {
        "columns": "text\ty\nhi\t1\nho\t0\n", "label-text": "sentence\tlabel\nfine\tx\nok\t1\n",
        "label-range": "sentence\tlabel\nfine\t7\nok\t1\n", "empty": "",
        "header-only": "sentence\tlabel\n", "missing-field": "sentence\tlabel\nok\t1\nlonely\n",
    }
    for name, text in files.items():
        (d / name).mkdir()
        (d / name / "train.tsv").write_text(text)
    (d / "binary").mkdir()
    (d / "binary" / "train.tsv").write_bytes(bytes(range(256)) * 8)
    (d / "long-line").mkdir()
    with open(d / "long-line" / "train.tsv", "w") as fh:
        fh.write("sentence\tlabel\n" + "a" * 50_000_000 + "\t1\n")
    (d / "config.bin").write_bytes(bytes(range(128, 256)) * 4)
    # degenerate data (issue 37): nothing in a split, a huge JSONL line, two dev splits
    (d / "blank-completions.jsonl").write_text('{"prompt": "a", "completion": ""}\n' * 3)
    (d / "blank-texts.jsonl").write_text('{"text": ""}\n{"text": " "}\n' * 2)
    with open(d / "huge-line.jsonl", "w") as fh:
        fh.write('{"text": "ok", "label": 1}\n{"text": "' + "a" * (3 << 20) + '", "label": 0}\n')
    (d / "two-devs").mkdir()
    for name in ("train", "dev", "validation"):
        (d / "two-devs" / f"{name}.jsonl").write_text('{"text": "a", "label": 1}\n' * 3)
    (d / "demo.toml").write_text('[run]\ndevice = "cpu"\n')
    (d / "dashes.toml").write_text("[run]\nbatch-size = 4\n")
    (d / "extra.toml").write_text("[run]\nsteps = 3\n[optim]\nlr = 1e-3\n")
    (d / "outside.toml").write_text("steps = 3\n[run]\nlr = 1e-3\n")
    (d / "a-file").write_text("x")
    (d / "others").mkdir()
    (d / "others" / "keep.txt").write_text("x")
    for name, conf in (("no-model", None), ("non-model", {"hello": 1}),
                       ("custom-code", {"model_type": "opt", "auto_map": {"AutoConfig": "m.C"}}),
                       ("unknown-arch", {"model_type": "my-own-net"})):
        (d / name).mkdir()
        if conf is not None:
            (d / name / "config.json").write_text(json.dumps(conf))
            (d / name / "model.safetensors").write_bytes(b"")
    out = ["--out", str(d / "out")]
    run = lambda *s: ["run", *sets(*RUN, *s), *out]  # noqa: E731
    said = {"columns": ": no label field among text, y",
            # a text label is a name, scored by the label word of that name: none here
            "label-text": ": field 'label' names the label 'x' and no word of label_words",
            "label-range": " line 2: field 'label' is 7, outside 0..1", "empty": ": the file is empty",
            "header-only": ": a header (sentence, label) but no examples",
            "missing-field": " line 3: 1 fields, the header has 2",
            "binary": " line 1: a NUL byte (a binary file?)", "long-line": " line 2: longer than 1 MiB"}
    cases = {f"data {k}": (run(f"data={d / k}"), f"data: {d / k / 'train.tsv'}{said[k]}")
             for k in said}
    cases.update({
        "config binary": (["run", "--config", str(d / "config.bin"), *out], "not a text file"),
        "config folder": (["run", "--config", str(d), *out], "is a folder, not a TOML file"),
        "config table": (["run", "--config", str(d / "extra.toml"), *out], "table [optim]"),
        "config key": (["run", "--config", str(d / "outside.toml"), *out], "'steps' is outside"),
        "out is a file": (["run", *sets(*RUN), "--out", str(d / "a-file")], "is a file"),
        "out has files": (["run", *sets(*RUN), "--out", str(d / "others")], "other files"),
        "seq_len": (run("seq_len=600"), "seq_len: 600 exceeds the 512 positions of tiny-opt"),
        "model empty": (run(f"model={d / 'no-model'}"), "has no config.json"),
        "model non-model": (run(f"model={d / 'non-model'}"), "Unrecognized model"),
        "model custom code": (run(f"model={d / 'custom-code'}"), "trust_remote_code=False"),
        "model unknown": (run(f"model={d / 'unknown-arch'}"), "my-own-net"),
        "nan": (run("lr=nan"), "lr: nan is not a finite number"),
        "inf": (run("eps=inf"), "eps: inf is not a finite number"),
        "not for mezo": (run("codec=bf16"), "codec: bf16 with master=fp32 leaves mezo's weights"),
        "not for zo": (["run", *sets(*RUN, "method=zo-offload", "subgroup_size=4096"), *out],
                       "subgroup_size: 4096 does not apply to method=zo-offload"),
        "eval without dev": (run("eval_every=5"), "eval_every: data=synthetic has no dev"),
        "one label word": (run("data=embedded", "label_words=good"),
                           "label_words: 'good' needs k >= 2 non-blank words"),
        "too big": (["run", *sets("model=opt-175b", "method=zo-offload"), *out],
                    "host memory: zo-offload on opt-175b needs"),
        # issue 37, class 3: values as typed; label words the model can tell apart
        "label words twice": (run("data=embedded", "label_words= bad, bad"),
                              "label_words: ' bad, bad' repeats a word (' bad')"),
        "label word prefix": (run("data=embedded", "label_words= good, goodness"),
                              "label_words: the tokens of ' good' begin another word's"),
        # class 4: degenerate data, in one line naming file, line and field
        "completions blank": (run("objective=completion", f"data={d / 'blank-completions.jsonl'}"),
                              "field 'completion' is blank in all"),
        "texts blank": (run("objective=lm", f"data={d / 'blank-texts.jsonl'}"),
                        "field 'text' is blank in all"),
        "jsonl huge line": (run(f"data={d / 'huge-line.jsonl'}"),
                            f"data: {d / 'huge-line.jsonl'} line 2: longer than 1 MiB"),
        "data empty": (run("data="), "data: '' is empty"),
        "two dev splits": (run(f"data={d / 'two-devs'}"),
                           "several dev splits (dev.jsonl, validation.jsonl); keep one"),
        "sst2 without data_dir": (run("model=opt-125m", "data=sst2", f"data_dir={d / 'nowhere'}"),
                                  f"data_dir: {d / 'nowhere'} does not exist (data=sst2 reads"),
        # class 5: checks before anything is built
        "max_new_tokens": (run("objective=completion", "data=embedded", "max_new_tokens=500"),
                           "max_new_tokens: 500 new tokens after a prompt of up to seq_len=16 "
                           "reach position 515, beyond the 512 positions of tiny-opt"),
        "lora_targets": (run("peft=lora", "lora_targets=q_proj,nosuch"),
                         "lora_targets: nosuch matches no linear module of this model"),
        "gpu cap on cpu": (run("gpu_mem_limit_gb=2"), "gpu_mem_limit_gb: 2 applies only with "
                           "device=cuda"),
        "demo method": (["demo", *sets("method=fo"), *out], "method: the demo sets it itself"),
        "demo device": (["demo", "--config", str(d / "demo.toml"), *out],
                        "device: the demo sets it itself"),
        "two configs": (["run", "--config", str(d / "demo.toml"), "--config",
                         str(d / "dashes.toml"), *out], "--config: given 2 times"),
        "plan suggest": (["plan", "--suggest", "-5"], "--suggest: -5 GiB is not a GPU memory"),
        "typo": (run("stpes=3"), "stpes: unknown setting; did you mean steps?"),
        "dashes": (["run", "--config", str(d / "dashes.toml"), *out],
                   "batch-size: unknown setting; did you mean batch_size?"),
        "data_changed_ok fresh": (run("data_changed_ok=true"),
                                  "data_changed_ok: applies to a resumed run only"),
        "sweep resume nothing": (["sweep", "--resume", str(d / "others")],
                                 f"--resume: {d / 'others'} is not a sweep folder"),
    })
    if not shutil.which("nvidia-smi"):
        cases["calibrate cuda"] = (["calibrate", "--device", "cuda"],
                                   "--device: cuda was asked for but this machine has no CUDA")
    return cases


def test_a_tokenizer_that_cannot_be_had_is_one_line(tmp_path):
    """No opt-tokenizer/ in data_dir, an empty Hub cache and the Hub out of reach (offline mode
    here, so the test does not depend on the network): exit 2, one line, no run directory."""
    offline = ["env", "HF_HUB_OFFLINE=1", f"HF_HOME={tmp_path / 'hf'}", sys.executable, "-m",
               "workbench"]
    r = cli("run", *sets("model=opt-125m", "data=embedded", f"data_dir={tmp_path}",
                         "device=cpu", "steps=1"), "--out", str(tmp_path / "r"), prefix=offline)
    assert r.returncode == 2
    assert "model: no usable tokenizer for opt-125m" in one_line(r.stderr)
    assert not (tmp_path / "r").exists()


def test_every_bad_input_is_one_line_and_exit_2(straight, tmp_path):
    cases = _write_bad_inputs(tmp_path)
    ran = straight["dir"]
    cases.update({
        "report -o folder": (["report", str(ran), "-o", str(tmp_path)], "-o: "),
        "resume fixed knob": (["run", "--resume", str(ran), *sets("seed=1")],
                              "seed: fixed for a resumed run (it was 0, now 1)"),
        "resume below checkpoint": (["run", "--resume", str(ran), *sets("steps=10")],
                                    "steps: 10 is below the newest checkpoint"),
        "resume elsewhere": (["run", "--resume", str(ran), "--out", str(tmp_path / "b")],
                             "--out: a resumed run continues in its own directory"),
        "resume no run": (["run", "--resume", str(tmp_path / "others")], "no run.json"),
    })
    before = (ran / "run.json").read_bytes()
    with ThreadPoolExecutor(4) as pool:
        results = dict(zip(cases, pool.map(lambda c: cli(*c[0]), cases.values())))
    problems = []
    for name, r in results.items():
        try:
            assert r.returncode == 2, f"exit {r.returncode}"
            assert cases[name][1] in one_line(r.stderr)
        except AssertionError as e:
            problems.append(f"{name}: {e} | {r.stderr.strip()[-400:]}")
    assert not problems, "\n".join(problems)
    assert not (tmp_path / "out").exists() and not (tmp_path / "b").exists()
    assert (ran / "run.json").read_bytes() == before  # a refused resume changes nothing


# --- divergence -----------------------------------------------------------------------------
def test_nan_divergence_stops_keeps_the_last_good_checkpoint_and_a_valid_record(tmp_path):
    out = tmp_path / "run"
    r = cli("run", *sets(*RUN, "lr=10"), "--out", str(out))  # lr=10 blows up at step 3
    assert r.returncode == 1
    line = one_line(r.stderr)
    assert line.startswith("error: diverged at step 3 (loss = nan")
    assert "the last good checkpoint is step-00000002" in line
    rec = record(out)
    assert rec["status"] == "diverged" and rec["error"].startswith("diverged at step 3")
    assert [s["step"] for s in rec["steps"]] == [0, 1, 2, 3] and rec["steps"][3]["loss"] is None
    assert [p.name for p in (out / "checkpoints").glob("step-*")] == ["step-00000002"]
    assert_clean(out)


# --- GPU memory cap (run on the GPU machine: python -m pytest -m gpu tests/recipes) ----------
@pytest.mark.gpu
def test_gpu_mem_limit_refuses_and_caps_the_run_at_run_time(tmp_path):
    args = sets("model=opt-125m", "method=mezo", "device=cuda", "data=synthetic",
                "batch_size=8", "seq_len=128", "steps=3", "sample_hz=0", "gpu_mem_limit_gb=0.75")
    r = cli("run", *args, "--out", str(tmp_path / "refused"))
    assert r.returncode == 2
    line = one_line(r.stderr)
    assert "gpu memory: mezo on opt-125m needs" in line and "gpu_mem_limit_gb=0.75 caps" in line
    assert not (tmp_path / "refused").exists()
    r = cli("run", *args, "--out", str(tmp_path / "forced"), "--force")  # the cap holds
    assert r.returncode == 1
    line = one_line(r.stderr)
    assert line.startswith("error: gpu_mem_limit_gb: the run needed more GPU memory than its "
                           "0.75 GB cap")
    rec = record(tmp_path / "forced")
    assert rec["status"] == "failed" and rec["error"].startswith("gpu_mem_limit_gb:")
    r = cli("run", *sets("model=opt-125m", "method=mezo", "device=cuda", "data=synthetic",
                         "batch_size=8", "seq_len=128", "steps=3", "sample_hz=0",
                         "gpu_mem_limit_gb=4"), "--out", str(tmp_path / "fits"))
    assert r.returncode == 0, r.stderr
    assert record(tmp_path / "fits")["summary"]["peak_gpu_mem_bytes"] < 4e9  # GB = 10^9 B
