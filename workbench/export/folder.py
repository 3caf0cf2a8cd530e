"""An exported folder on disk: written in a temporary folder beside it, published by a rename.

``AtomicFolder`` makes ``.NAME.partial-XXXX`` next to the destination; everything is written
there and fsynced, then the folder is renamed to its name. A failure before the rename (a full
disk, an error, Ctrl-C) removes the temporary folder: the destination either does not exist or
is complete. An existing destination is refused unless ``overwrite``; then it is replaced by a
second rename after the new folder is complete (the old one is deleted last).

``WeightsWriter`` writes the weights as Hugging Face lays them out: ``model.safetensors``, or
``model-0000k-of-0000n.safetensors`` shards of at most ``shard_size`` bytes (a tensor larger
than that gets a shard of its own) with ``model.safetensors.index.json``. Groups arrive one at
a time and are written straight into the open shard (``safetensors_stream.py``).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import torch

from workbench.engine.checkpoint import _fsync_dir
from workbench.engine.groups import GroupLayout
from workbench.export.safetensors_stream import StreamWriter, TensorSpec, file_bytes
from workbench.export.source import ExportError
from workbench.runs.outcome import os_error
from workbench.runs.outputs import carry_over, is_export

UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
         "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(text: str) -> int:
    """``"5GB"`` -> 5 * 10^9 bytes (KB/MB/GB/TB decimal as Hugging Face's ``max_shard_size``,
    KiB/MiB/GiB binary; a bare number is bytes)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text))
    unit = m.group(2).upper() if m else None
    if m is None or unit not in UNITS or float(m.group(1)) * UNITS[unit] < 1:
        raise ExportError(f"--shard-size: {text!r} is not a size such as 5GB, 500MB or 2GiB")
    return int(float(m.group(1)) * UNITS[unit])


class AtomicFolder:
    """``with AtomicFolder(out, overwrite) as tmp:`` write into ``tmp``; ``out`` appears, whole,
    when the block ends without an error.

    Raises:
        ExportError: ``out`` exists (without ``overwrite``), is a file, or its parent cannot be
            written; a failed write, as one line (``No space left on device: ...``).
    """

    def __init__(self, out: str | Path, overwrite: bool = False):
        self.out, self.overwrite = Path(out).expanduser(), overwrite
        self.tmp: Path | None = None
        if self.out.exists() and not self.out.is_dir():
            raise ExportError(f"--out: {self.out} is a file; give a folder to create")
        # an empty folder holds nothing to lose; else only an export, with ``overwrite``
        # (``runs/outputs.py`` checked which it is)
        if self.out.exists() and any(self.out.iterdir()) and not overwrite:
            raise ExportError(f"--out: {self.out} already exists; give a new folder, or "
                              "--overwrite to replace it")

    def __enter__(self) -> Path:
        try:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.partial-",
                                             dir=self.out.parent))
            # mkdtemp makes it 0700 (private while partial); published, the folder is as
            # readable as any folder the user makes (0755 under the usual umask 022)
            self.tmp.chmod(0o777 & ~_umask())
        except OSError as e:
            raise ExportError(f"--out: cannot write in {self.out.parent} ({os_error(e)})") from None
        return self.tmp

    def __exit__(self, kind, error, tb) -> bool:
        tmp = self.tmp
        if error is not None:
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(error, OSError):
                raise ExportError(f"--out: the export failed and left nothing ({os_error(error)})"
                                  ) from None
            return False
        try:
            _fsync_dir(tmp)
            old = None
            if self.out.exists():
                if any(self.out.iterdir()) and not (self.overwrite and is_export(self.out)):
                    # made meanwhile by someone else, or no export: keep theirs
                    raise ExportError(f"--out: {self.out} was written while exporting; "
                                      "nothing of it was replaced")
                old = self.out.with_name(f".{self.out.name}.old-{tmp.name.rsplit('-', 1)[-1]}")
                self.out.rename(old)
            tmp.rename(self.out)  # the folder exists, complete, from this rename on
            _fsync_dir(self.out.parent)
            if old is not None:
                carry_over(old, self.out)  # the user's files beside the old export stay
                shutil.rmtree(old, ignore_errors=True)
        except BaseException as e:
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(e, OSError):
                raise ExportError(f"--out: {self.out} not published ({os_error(e)})") from None
            raise
        return False


def _umask() -> int:
    """The process's umask (read by setting it, then put back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def tensor_specs(layouts: list[GroupLayout], rename=lambda name: name) -> list[list[TensorSpec]]:
    """Per group, its tensors as a file stores them (``rename``: checkpoint name -> file name)."""
    return [[TensorSpec(rename(e.name), e.shape) for e in lay.entries] for lay in layouts]


def plan_shards(specs: list[TensorSpec], dtype: torch.dtype, shard_size: int
                ) -> list[list[TensorSpec]]:
    """``specs`` in order, cut into files of at most ``shard_size`` bytes of ``dtype``."""
    shards: list[list[TensorSpec]] = [[]]
    for s in specs:
        if shards[-1] and file_bytes(shards[-1] + [s], dtype) > shard_size:
            shards.append([])
        shards[-1].append(s)
    return shards


class WeightsWriter:
    """Writes groups (fp32 (n,) each, in order; ``specs[k]`` the tensors of group k, in
    order) as ``prefix.safetensors``, or shards with ``prefix.safetensors.index.json``:
    ``with WeightsWriter(...) as w:`` ``w.write(k, values)`` each group in turn; the last
    shard and the index are written when the block ends without an error."""

    def __init__(self, folder: Path, specs: list[list[TensorSpec]], dtype: torch.dtype,
                 shard_size: int, prefix: str = "model"):
        self.folder, self.specs, self.dtype, self.prefix = folder, specs, dtype, prefix
        self.flat = [s for group in specs for s in group]
        self.shards = plan_shards(self.flat, dtype, shard_size)
        n = len(self.shards)
        self.names = ([f"{prefix}.safetensors"] if n == 1 else
                      [f"{prefix}-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)])
        self.shard_of = {s.name: i for i, shard in enumerate(self.shards) for s in shard}
        self._open, self._writer, self._next = -1, None, 0

    def write(self, k: int, values: torch.Tensor) -> None:
        """Group ``k``'s values (the groups in order)."""
        if k != self._next:
            raise ValueError(f"group {k} written out of order (expected {self._next})")
        offset = 0
        for s in self.specs[k]:
            i = self.shard_of[s.name]
            if i != self._open:
                if self._writer is not None:
                    self._writer.close()
                self._writer = StreamWriter(self.folder / self.names[i], self.shards[i],
                                            self.dtype, {"format": "pt"})
                self._open = i
            self._writer.write(s.name, values[offset:offset + s.numel])
            offset += s.numel
        self._next += 1

    def close(self) -> None:
        """Finish the last shard and write the index (several shards)."""
        if self._next != len(self.specs):
            raise ValueError(f"{len(self.specs) - self._next} groups were not written")
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if len(self.names) > 1:
            index = {"metadata": {"total_size": file_bytes(self.flat, self.dtype)},
                     "weight_map": {name: self.names[i] for name, i in self.shard_of.items()}}
            (self.folder / f"{self.prefix}.safetensors.index.json").write_text(
                json.dumps(index, indent=2))

    def __enter__(self) -> "WeightsWriter":
        return self

    def __exit__(self, kind, error, tb) -> bool:
        if error is None:
            self.close()
        elif self._writer is not None:
            self._writer.abort()  # the folder it is in is removed by ``AtomicFolder``
        return False
