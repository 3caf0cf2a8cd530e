"""The workbench CLI with one fault injected, for test_faults where the real fault cannot be
made (no root for a small tmpfs; no machine short of RAM). Usage:

    python fault_cli.py disk FLAG_FILE run ...   checkpoint shards fail while FLAG_FILE exists:
                                                 ENOSPC (a full disk), or EROFS when the file
                                                 says "read-only"; part of the file is written
    python fault_cli.py lowmem run ...           the host shows 256 MiB available
"""
import errno
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
elif kind == "lowmem":
    import psutil

    vm = psutil.virtual_memory()
    psutil.virtual_memory = lambda: vm._replace(available=256 << 20)
    psutil.Process.memory_info = lambda self: types.SimpleNamespace(rss=256 << 20)
else:
    raise SystemExit(f"unknown fault {kind!r}")

from workbench.cli import main  # noqa: E402

sys.exit(main(sys.argv[1:]))
