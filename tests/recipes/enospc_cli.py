"""The workbench CLI with a disk that is full while a flag file exists: checkpoint shard writes
fail with ENOSPC after writing part of the file, as on a full disk. Used by test_faults where
no small tmpfs can be mounted (not root). Usage: python enospc_cli.py FLAG_FILE run ..."""
import errno
import os
import sys
from pathlib import Path

from workbench.engine import checkpoint

FLAG = Path(sys.argv.pop(1))
_real = checkpoint._save_shard


def _full_disk(tensors, path):
    if FLAG.exists():
        Path(path).write_bytes(b"\0" * 4096)  # the part that fitted
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    _real(tensors, path)


checkpoint._save_shard = _full_disk

from workbench.cli import main  # noqa: E402

sys.exit(main(sys.argv[1:]))
