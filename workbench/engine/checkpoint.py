"""Checkpoints: asynchronous snapshots, a per-step log, exact resume, crash safety.

A checkpoint is a folder ``step-NNNNNNNN`` holding safetensors shards (p1 = embedding + first
half of the blocks, p2 = second half + head, the paper's halves) and ``manifest.json`` with the
step, the pending update, the config, the group layout, each shard's SHA-256 and the identity of
the run that wrote it (its run id and directory, model, seed and data fingerprint: a resume takes
only its own run's checkpoints). Weights are
stored in master precision (fp32; bf16 / fp16 for streamed blocks under master=compressed-sr,
half the bytes) and read back as fp32, which holds them exactly. It is written
as ``step-NNNNNNNN.partial``: shards, fsync, manifest (temp + rename), fsync, then the folder is
renamed. A folder without the final name is never read, so a crash mid-write loses nothing that
was complete before.

Beside the snapshots, ``steps.jsonl`` records every step's (step, seed, g, lr, wd): with MeZO's
arithmetic replayed from the nearest snapshot, any step can be restored exactly, so a
"checkpoint" between snapshots costs a line, not gigabytes.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import threading
import warnings
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Sequence
from typing import Any

import torch

from workbench.engine.groups import LazyFlats

FORMAT = 1
#: a group's optimizer state is stored under the group's name with this suffix (checkpoints,
#: transfers)
STATE_SUFFIX = ".zo_state"


@dataclass
class Snapshot:
    """Host copies of every group's master weights at a step boundary, plus what resumes it."""

    step: int  # the next step to run
    flats: Sequence[torch.Tensor]  # canonical order, CPU; fp32, or bf16 / fp16 for an SR
    # master; read back: a LazyFlats that loads each group (as fp32) when it is reached
    names: list[str]
    pending: dict[str, Any] | None  # {"seed", "g" (a float or a list), "lr", "wd"} or None
    config: dict[str, Any]
    n_decay: list[int] | None = None  # per group: elements [0, n_decay) get weight decay
    identity: dict[str, Any] | None = None  # the run that wrote it (None: written before ids)
    # zo_optimizer=momentum / adam: each group's optimizer state (``zo/optim.py``), canonical
    # order, in the master's precision as the weights; None: the rule keeps none
    opt_state: Sequence[torch.Tensor] | None = None


def _fsync_dir(path: Path) -> None:
    fd = os.open(str(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


def halves(n_groups: int) -> tuple[range, range]:
    """Group indices of p1 (embedding + first half of blocks) and p2 (the rest + head)."""
    blocks = n_groups - 2
    cut = 1 + (blocks + 1) // 2
    return range(0, cut), range(cut, n_groups)


def write_checkpoint(root: Path, snap: Snapshot,
                     identity: dict[str, Any] | None = None, name: str = "",
                     per_group: bool = False) -> Path:
    """Write ``snap`` under ``root`` atomically; returns the final folder.

    ``identity`` (the writing run's, else ``snap.identity``) goes into the manifest. ``name``: the
    folder's name (default ``step-NNNNNNNN``). ``per_group``: one shard per group rather than
    the two halves, so a ``LazyFlats`` snapshot is written holding one group at a time (the
    end-of-run weights, ``runs/final_weights.py``)."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / (name or f"step-{snap.step:08d}")
    tmp = root / f"{final.name}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        return _write_folder(root, tmp, final, snap, identity or snap.identity,
                             per_group)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # a failed write (a full disk) leaves nothing
        raise


def _save_shard(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """safetensors' save_file, its I/O failures (a full disk) raised as the OSError they are."""
    from safetensors.torch import save_file

    try:
        save_file(tensors, str(path))
    except OSError:
        raise
    except Exception as e:  # safetensors wraps the OS error in its own type
        code = re.search(r"os error (\d+)", str(e))
        if code is None:
            raise
        raise OSError(int(code.group(1)), os.strerror(int(code.group(1))), str(path)) from None


def _write_folder(root: Path, tmp: Path, final: Path, snap: Snapshot,
                  identity: dict[str, Any] | None, per_group: bool) -> Path:
    tmp.mkdir()
    shards, numels = {}, {}
    n = len(snap.flats)
    parts = ([(f"g{i:05d}", [i]) for i in range(n)] if per_group
             else zip(("p1", "p2"), halves(n)))
    for part, idx in parts:
        path = tmp / f"{part}.safetensors"
        tensors = {snap.names[i]: snap.flats[i].contiguous() for i in idx}
        numels.update((name, t.numel()) for name, t in tensors.items())
        if snap.opt_state is not None:  # weights only in ``numels``: the layout check's
            tensors.update((snap.names[i] + STATE_SUFFIX, snap.opt_state[i].contiguous())
                           for i in idx)
        _save_shard(tensors, path)
        del tensors  # a lazy snapshot's group is dropped before the next is made
        with open(path, "rb+") as fh:
            os.fsync(fh.fileno())  # the shard is on disk before the manifest can name it
        shards[path.name] = _sha256(path)
    manifest = {"format": FORMAT, "step": snap.step, "pending": snap.pending,
                "config": snap.config, "groups": [[name, numels[name]] for name in snap.names],
                "n_decay": snap.n_decay, "shards": shards, "identity": identity,
                **({"opt_state": True} if snap.opt_state is not None else {})}
    mtmp = tmp / "manifest.json.tmp"
    mtmp.write_text(json.dumps(manifest, indent=1))
    with open(mtmp, "rb+") as fh:
        os.fsync(fh.fileno())
    mtmp.replace(tmp / "manifest.json")
    _fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(final)
    tmp.replace(final)  # the checkpoint exists from this rename on
    _fsync_dir(root)
    return final


class CheckpointError(ValueError):
    """A checkpoint that cannot be used (corrupted, or for another model)."""


def complete_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first; incomplete ones are skipped with a
    warning."""
    if not root.is_dir():
        return []
    found = []
    for p in sorted(root.glob("step-*")):
        if p.name.endswith(".partial") or not (p / "manifest.json").is_file():
            warnings.warn(f"checkpoint {p.name} is incomplete (a write was interrupted); "
                          "skipping it", stacklevel=2)
            continue
        found.append(p)
    return found


def read_checkpoint(path: Path, names: list[str], numels: list[int]) -> Snapshot:
    """Load and verify a checkpoint against the model's groups.

    Raises:
        CheckpointError: corrupted shards, or groups that do not match this model.
    """
    from safetensors import safe_open

    try:
        manifest = json.loads((path / "manifest.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"checkpoint {path}: unreadable manifest ({e})") from None
    want = [[n, k] for n, k in zip(names, numels)]
    if manifest.get("groups") != want:
        raise CheckpointError(
            f"checkpoint {path} belongs to another model or shapes (model "
            f"{manifest.get('config', {}).get('model')!r}, {len(manifest.get('groups', []))} "
            f"groups); this run has {len(names)} groups of {names[1:2] and 'these shapes'}")
    where: dict[str, Path] = {}
    for shard, digest in manifest["shards"].items():
        file = path / shard
        if not file.is_file() or _sha256(file) != digest:
            raise CheckpointError(f"checkpoint {path}: shard {shard} is missing or corrupted "
                                  "(SHA-256 mismatch); use an earlier checkpoint")
        with safe_open(str(file), framework="pt") as fh:
            where.update((name, file) for name in fh.keys())
    missing = [n for n in names if n not in where]
    if missing:
        raise CheckpointError(f"checkpoint {path}: groups {missing[:3]} are in no shard")

    def load(i: int, suffix: str = "") -> torch.Tensor:
        # Streamed blocks are stored in master precision (bf16 / fp16 under
        # master=compressed-sr); read back as fp32, which holds those values exactly. One group
        # per call: a resume holds one group beside the model, not a second model.
        with safe_open(str(where[names[i]]), framework="pt") as fh:
            return fh.get_tensor(names[i] + suffix).float()

    state = (LazyFlats(len(names), lambda i: load(i, STATE_SUFFIX))
             if manifest.get("opt_state") else None)
    return Snapshot(manifest["step"], LazyFlats(len(names), load), names,
                    manifest.get("pending"), manifest.get("config", {}), manifest.get("n_decay"),
                    manifest.get("identity"), state)


def checkpoint_identity(path: Path) -> dict[str, Any] | None:
    """The identity in a checkpoint's manifest (None: none recorded, or unreadable)."""
    try:
        found = json.loads((path / "manifest.json").read_text()).get("identity")
    except (OSError, ValueError, AttributeError):
        return None
    return found if isinstance(found, dict) else None


def latest_checkpoint(root: Path) -> Path | None:
    found = complete_checkpoints(root)
    return found[-1] if found else None


class StepLog:
    """Append-only JSON lines of each step's update: enough to replay any step exactly."""

    def __init__(self, root: Path):
        root.mkdir(parents=True, exist_ok=True)
        self.path = root / "steps.jsonl"
        self._lock = threading.Lock()

    def append(self, step: int, seed: int, g: float | list[float], lr: float, wd: float) -> None:
        """Step ``step``'s row: its seed, g (a list: the coefficients of a step of several
        queries, ``zo/perturb.py::PendingUpdate``), lr and wd."""
        with self._lock, open(self.path, "a") as fh:
            fh.write(json.dumps({"step": step, "seed": seed, "g": g, "lr": lr, "wd": wd}) + "\n")

    def read(self) -> dict[int, dict]:
        if not self.path.is_file():
            return {}
        out = {}
        for line in self.path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                break  # a torn last line from a crash
            out[row["step"]] = row
        return out


class AsyncCheckpointer:
    """Background writes: the training thread hands over host snapshots and goes on.

    A snapshot still being written when the next one is due is skipped (the step log still
    covers every step), so a slow disk never makes training wait or memory pile up. A failed
    write (a full or read-only disk) is not raised: ``failure()`` reports it once, and the
    caller decides when to give up.

    Args:
        root: checkpoint folder.
        keep_last: complete checkpoints kept; older ones are deleted after a newer completes.
            Only checkpoints at or before ``verified`` (a step count the caller raises as it
            sees its steps' results) count: newer ones could hold a diverged state, so the
            last ``keep_last`` good ones stay until the newer ones are known good.
        identity: the writing run's identity, put into every manifest.
    """

    def __init__(self, root: Path, keep_last: int, bus=None, timer=None,
                 identity: dict[str, Any] | None = None):
        self.root, self.keep_last, self.bus, self.timer = Path(root), keep_last, bus, timer
        self.identity = identity  # written into every manifest
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        self.writing: Future | None = None
        self.skipped = 0
        self.written: list[Path] = []
        self.verified: float = float("inf")
        self.failures = 0  # failed writes in a row
        self._errors: deque[BaseException] = deque()  # not yet reported by ``failure``

    @property
    def busy(self) -> bool:
        return self.writing is not None and not self.writing.done()

    def submit(self, make_snapshot) -> bool:
        """Write ``make_snapshot()`` (called in the writer thread) unless a write is running."""
        if self.busy:
            self.skipped += 1
            return False
        self.writing = self.pool.submit(self._write, make_snapshot)
        return True

    def _write(self, make_snapshot) -> Path | None:
        from workbench.engine.events import OpEvent

        start = self.timer.now() if self.timer else 0.0
        snap = make_snapshot()
        try:
            path = write_checkpoint(self.root, snap, identity=self.identity)
        except OSError as e:  # ENOSPC, EROFS, EIO...: reported by ``failure``, training goes on
            self.failures += 1
            self._errors.append(e)
            return None
        self.failures = 0
        nbytes = sum(f.numel() * 4 for f in snap.flats)
        if self.bus is not None and self.timer is not None:
            self.bus.publish(OpEvent("checkpoint", "checkpoint", snap.step - 1, -1, nbytes,
                                     start, self.timer.now(), path.name))
        self.written.append(path)
        self.prune()
        return path

    def prune(self) -> None:
        """Delete all but the newest ``keep_last`` verified checkpoints of this run's."""
        good = [p for p in self._own() if checkpoint_step(p) <= self.verified]
        for old in good[:-self.keep_last]:
            shutil.rmtree(old, ignore_errors=True)

    def _own(self) -> list[Path]:
        """Complete checkpoints under ``root`` this run wrote (its run id in the manifest): a
        folder shared with another run (a copy of this one) keeps that run's checkpoints."""
        mine = (self.identity or {}).get("run_id")
        return [p for p in complete_checkpoints(self.root)
                if mine is None or (checkpoint_identity(p) or {}).get("run_id", mine) == mine]

    def discard_after(self, step: int) -> list[Path]:
        """Delete complete checkpoints of more than ``step`` steps (a diverged state)."""
        self.wait()
        bad = [p for p in self._own() if checkpoint_step(p) > step]
        for p in bad:
            shutil.rmtree(p, ignore_errors=True)
        return bad

    def failure(self) -> BaseException | None:
        """The error of a failed write not reported yet, else None (never blocks)."""
        return self._errors.popleft() if self._errors else None

    def wait(self) -> None:
        """Until the write in progress has ended (a failed write is left for ``failure``)."""
        if self.writing is not None:
            self.writing.result()  # end of run or a divergence: the last write must be over

    def close(self) -> None:
        self.wait()
        self.pool.shutdown(wait=True)


def checkpoint_step(path: Path) -> int:
    """The step count of a checkpoint folder ``step-NNNNNNNN``."""
    return int(path.name.split("-", 1)[1].split(".", 1)[0])
