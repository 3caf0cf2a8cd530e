"""The workbench CLI with one fault injected, for test_faults where the real fault cannot be
made (no root for a small tmpfs; no machine short of RAM). Usage:

    python fault_cli.py disk FLAG_FILE run ...   checkpoint shards fail while FLAG_FILE exists:
                                                 ENOSPC (a full disk), or EROFS when the file
                                                 says "read-only"; part of the file is written
    python fault_cli.py fs MODE DIR FLAG_FILE CMD ...
                                                 every write under DIR fails while FLAG_FILE
                                                 exists, as a file system would: MODE "full"
                                                 (files are created, empty, and writing to
                                                 them raises ENOSPC) or "read-only" (creating,
                                                 writing, renaming, removing raise EROFS)
    python fault_cli.py lowmem run ...           the host shows 256 MiB available
"""
import builtins
import errno
import io
import os
import sys
import types
from pathlib import Path

kind = sys.argv.pop(1)
if kind == "disk":
    from workbench.engine import checkpoint

    flag, real = Path(sys.argv.pop(1)), checkpoint._save_shard

    def _failing_disk(tensors, path):
        if not flag.exists():
            return real(tensors, path)
        code = errno.EROFS if flag.read_text() == "read-only" else errno.ENOSPC
        if code == errno.ENOSPC:
            Path(path).write_bytes(b"\0" * 4096)  # the part that fitted
        raise OSError(code, os.strerror(code), str(path))

    checkpoint._save_shard = _failing_disk
elif kind == "fs":
    mode, root, flag = sys.argv.pop(1), Path(sys.argv.pop(1)).resolve(), Path(sys.argv.pop(1))
    code = errno.ENOSPC if mode == "full" else errno.EROFS
    real_open, real_os_open, real_pwrite, real_write = io.open, os.open, os.pwrite, os.write

    def _under(path) -> bool:
        try:
            return flag.exists() and Path(os.path.abspath(os.fspath(path))).is_relative_to(root)
        except TypeError:  # a file descriptor
            return False

    def _fail(path):
        raise OSError(code, os.strerror(code), str(path))

    class _Guarded:
        """A file opened for writing under DIR: its writes fail while FLAG_FILE exists (also
        when it appears after the file was opened: a disk filling up mid-run)."""

        def __init__(self, fh, path):
            self._fh, self._path = fh, path

        def write(self, data):
            if flag.exists():
                _fail(self._path)
            return self._fh.write(data)

        def __getattr__(self, name):
            return getattr(self._fh, name)

        def __iter__(self):
            return iter(self._fh)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self._fh.close()

    def _open(file, mode="r", *args, **kwargs):
        writing = any(c in mode for c in "wax+")
        inside = not isinstance(file, int) and Path(os.path.abspath(file)).is_relative_to(root)
        if not (writing and inside):
            return real_open(file, mode, *args, **kwargs)
        if code == errno.EROFS and flag.exists():
            _fail(file)
        return _Guarded(real_open(file, mode, *args, **kwargs), file)

    def _os_open(path, flags, *args, **kwargs):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT) and code == errno.EROFS and \
                _under(path):
            _fail(path)
        return real_os_open(path, flags, *args, **kwargs)

    def _fd_under(fd) -> bool:
        try:
            return _under(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            return False

    def _pwrite(fd, data, offset):
        if _fd_under(fd):
            _fail(os.readlink(f"/proc/self/fd/{fd}"))
        return real_pwrite(fd, data, offset)

    def _write(fd, data):
        if _fd_under(fd):
            _fail(os.readlink(f"/proc/self/fd/{fd}"))
        return real_write(fd, data)

    def _guard(real, *, full_too=False):
        def call(path, *args, **kwargs):
            if _under(path) and (code == errno.EROFS or full_too):
                _fail(path)
            return real(path, *args, **kwargs)
        return call

    io.open = builtins.open = _open
    os.open, os.pwrite, os.write = _os_open, _pwrite, _write
    os.mkdir, os.unlink, os.rmdir = (_guard(f) for f in (os.mkdir, os.unlink, os.rmdir))
    os.replace, os.rename = _guard(os.replace), _guard(os.rename)

    from workbench.engine import checkpoint

    real_shard = checkpoint._save_shard

    def _shard(tensors, path):
        if not _under(path):
            return real_shard(tensors, path)
        if code == errno.ENOSPC:
            real_open(path, "wb").close()  # created; nothing fitted
        _fail(path)

    checkpoint._save_shard = _shard
elif kind == "lowmem":
    import psutil

    vm = psutil.virtual_memory()
    psutil.virtual_memory = lambda: vm._replace(available=256 << 20)
    psutil.Process.memory_info = lambda self: types.SimpleNamespace(rss=256 << 20)
else:
    raise SystemExit(f"unknown fault {kind!r}")

from workbench.cli import main  # noqa: E402

sys.exit(main(sys.argv[1:]))
