"""safetensors files written and read a tensor at a time, without holding a file in memory.

``safetensors.torch.save_file`` takes every tensor of a file at once; an export shard of 5 GB
would then hold 5 GB of tensors in host memory. The format is simple enough to stream: an
8-byte little-endian header length, a JSON header naming each tensor's dtype, shape and byte
range, then the bytes in that order. Every tensor's name, dtype and shape is known before any
weight is read (the group layouts), so the header is written first and each tensor's bytes
follow as its group arrives, cast to the file's dtype a chunk at a time (host memory: one
chunk of ``CHUNK`` elements beside the caller's fp32 group).

``read_fp32`` reads one tensor back as fp32 with plain reads into its own buffer, not through a
memory map: a mapped file's pages count in the process's resident memory while the tensor is
copied out of them (two copies of a group at once), and a bf16 tensor would be held in both
dtypes. Here the fp32 result is the only large buffer (a bf16 / fp16 tensor is widened a chunk
at a time).
"""
from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

#: Elements cast per write when the file's dtype is not fp32 (16 MiB of fp32).
CHUNK = 1 << 22
DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
FROM_NAME = {v: k for k, v in DTYPES.items()}
#: A 2-byte dtype is written through a same-size integer view (numpy has no bfloat16).
_RAW = {torch.float32: torch.float32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of a file: its name and shape (elements of ``dtype`` once written)."""

    name: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


def file_bytes(specs: list[TensorSpec], dtype: torch.dtype) -> int:
    """Bytes of the tensor data of a file of ``specs`` (the header not counted)."""
    return sum(s.numel for s in specs) * torch.empty((), dtype=dtype).element_size()


class StreamWriter:
    """Writes ``specs`` (in that order) to ``path`` as ``dtype``; ``write`` each tensor in
    turn, then ``close``. The file is fsynced on close; a missing tensor raises there.

    Args:
        metadata: text the header's ``__metadata__`` carries (transformers wants
            ``{"format": "pt"}``).
    """

    def __init__(self, path: Path, specs: list[TensorSpec], dtype: torch.dtype,
                 metadata: dict[str, str]):
        self.path, self.specs, self.dtype = Path(path), specs, dtype
        self.size = torch.empty((), dtype=dtype).element_size()
        header: dict[str, object] = {"__metadata__": dict(metadata)}
        offset = 0
        for s in specs:
            header[s.name] = {"dtype": DTYPES[dtype], "shape": list(s.shape),
                              "data_offsets": [offset, offset + s.numel * self.size]}
            offset += s.numel * self.size
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
        self._fh = open(self.path, "wb")
        self._fh.write(struct.pack("<Q", len(text)) + text)
        self._next = 0
        self._buf: torch.Tensor | None = None

    def write(self, name: str, values: torch.Tensor) -> None:
        """The next tensor's values (any float dtype, CPU; cast to the file's dtype)."""
        spec = self.specs[self._next]
        if name != spec.name or values.numel() != spec.numel:
            raise ValueError(f"{self.path.name}: expected {spec.name} ({spec.numel} elements), "
                             f"got {name} ({values.numel()})")
        flat = values.reshape(-1)
        if flat.dtype == self.dtype and flat.is_contiguous():
            self._put(flat)  # straight from the caller's memory: no copy
        else:
            for lo in range(0, flat.numel(), CHUNK):
                piece = flat[lo:lo + CHUNK]
                if self._buf is None:
                    self._buf = torch.empty(min(CHUNK, max(flat.numel(), 1)), dtype=self.dtype)
                elif self._buf.numel() < piece.numel():
                    self._buf = torch.empty(piece.numel(), dtype=self.dtype)
                out = self._buf[:piece.numel()]
                out.copy_(piece)  # round to nearest even, as torch's .to(dtype)
                self._put(out)
        self._next += 1

    def _put(self, t: torch.Tensor) -> None:
        self._fh.write(memoryview(t.view(_RAW[self.dtype]).numpy()).cast("B"))

    def close(self) -> None:
        """Flush and fsync; raises if a tensor was not written."""
        try:
            if self._next != len(self.specs):
                raise ValueError(f"{self.path.name}: {len(self.specs) - self._next} tensors "
                                 "were not written")
            self._fh.flush()
            os.fsync(self._fh.fileno())  # the shard is on disk before the folder is published
        finally:
            self._fh.close()

    def abort(self) -> None:
        self._fh.close()


def read_header(path: Path) -> tuple[int, dict]:
    """(byte offset of the data, the JSON header) of a safetensors file."""
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        return 8 + n, json.loads(fh.read(n))


def read_fp32(path: Path, name: str, header: tuple[int, dict] | None = None) -> torch.Tensor:
    """Tensor ``name`` of the file at ``path`` as a new flat fp32 CPU tensor (see the module
    doc). ``header``: ``read_header(path)``, if the caller has it."""
    start, entries = header or read_header(path)
    entry = entries[name]
    dtype = FROM_NAME.get(entry["dtype"])
    if dtype is None:
        raise ValueError(f"{path.name}: {name} is {entry['dtype']}, not a float dtype read here")
    lo, hi = entry["data_offsets"]
    size = torch.empty((), dtype=dtype).element_size()
    out = torch.empty((hi - lo) // size, dtype=torch.float32)
    with open(path, "rb", buffering=0) as fh:
        fh.seek(start + lo)
        if dtype == torch.float32:
            _read_into(fh, out)
            return out
        buf = torch.empty(min(CHUNK, out.numel()), dtype=dtype)
        for at in range(0, out.numel(), CHUNK):
            piece = buf[:min(CHUNK, out.numel() - at)]
            _read_into(fh, piece)
            out[at:at + piece.numel()].copy_(piece)  # exact: fp32 holds every bf16 / fp16
    return out


def _read_into(fh, t: torch.Tensor) -> None:
    view = memoryview(t.view(_RAW[t.dtype]).numpy()).cast("B")
    got = 0
    while got < len(view):
        n = fh.readinto(view[got:])
        if not n:
            raise ValueError(f"{fh.name}: truncated")
        got += n
