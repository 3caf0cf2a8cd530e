"""One writer per folder: a lock file holding the writer's pid, created exclusively and held
with ``flock`` for the writer's life.

A run directory (``run.lock``), a checkpoint folder outside it (``checkpoint.lock``) and a sweep
folder (``sweep.lock``) each have one. The kernel drops an ``flock`` when its process dies, so
the lock of a process killed with -9 is free and is taken over, with a warning. A lock whose
pid cannot be written (a full disk) is removed again before the error is raised: no 0-byte lock
is left to puzzle the next run.
"""
from __future__ import annotations

import fcntl
import os
import warnings
from pathlib import Path

from workbench.config import ConfigError


class LockError(ConfigError):
    """The folder is locked by a live process, or the lock cannot be written (one line)."""

    def __init__(self, problem: str):
        super().__init__([problem])


class LockWarning(UserWarning):
    """A stale lock taken over (shown as one line)."""


def holder(path: Path) -> str | None:
    """The pid in the lock file ``path`` while a live process holds it, else None."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # free unless a writer holds it
    except BlockingIOError:
        return _pid(fd)
    finally:
        os.close(fd)
    return None


def is_stale(path: Path) -> bool:
    """A lock file nobody holds: left by a process that died, or one that never got going."""
    return path.is_file() and holder(path) is None


def take(path: Path, busy: str, option: str, warn: type[Warning] = LockWarning) -> int:
    """Lock ``path`` (created if absent) and write this process's pid in it; returns the fd
    (release with ``release``).

    Args:
        busy: the refusal when a live process holds it; ``{pid}`` is filled in.
        option: the setting the folder came from (``--out``, ``checkpoint_dir``), which a
            lock that cannot be written is reported under.
        warn: the warning category for a stale lock taken over.
    Raises:
        LockError: held by a live process, or the lock cannot be created or written.
    """
    while True:
        try:
            fd, fresh = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644), True
        except FileExistsError:
            try:
                fd, fresh = os.open(path, os.O_RDWR), False
            except FileNotFoundError:
                continue  # released in between: try to create it again
            except OSError as e:
                raise LockError(_cannot(option, path, e)) from None
        except OSError as e:  # a read-only or full file system, a missing folder
            raise LockError(_cannot(option, path, e)) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _pid(fd)
            os.close(fd)
            raise LockError(busy.format(pid=pid)) from None
        try:  # the file we locked must still be the one at ``path`` (not just released)
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if not same:
            os.close(fd)
            continue
        old = "" if fresh else _pid(fd)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as e:  # a full disk: no lock file is left behind, empty or not
            path.unlink(missing_ok=True)
            os.close(fd)
            raise LockError(_cannot(option, path, e)) from None
        if not fresh:
            what = f"of pid {old}, which is no longer running" if old != "?" else \
                "left by a process that never wrote its pid (a full disk?)"
            warnings.warn(f"{path}: taking over the lock {what}", warn)
        return fd


def release(path: Path, fd: int) -> None:
    """Remove the lock file, then unlock (in that order: see ``take``'s inode check)."""
    path.unlink(missing_ok=True)
    os.close(fd)


def _pid(fd: int) -> str:
    return os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"


def _cannot(option: str, path: Path, e: OSError) -> str:
    why = e.strerror or type(e).__name__
    return (f"{option}: cannot write the lock {path} ({why}); nothing was started, free space "
            "or give another folder")
