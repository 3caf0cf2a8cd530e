"""Exact-size page-locked host memory.

torch's pinned allocator rounds every request up to a power of two: one OPT-13B block
(1.26 GB) pins 2 GiB, so streaming OPT-13B would pin 80 GiB instead of 47, and OPT-30B would not
fit a 125 GiB host at all. Large buffers are therefore ordinary CPU tensors registered with
``cudaHostRegister`` (page-locked at their exact size) and unregistered on ``release``.
"""
from __future__ import annotations

import ctypes
import warnings

import torch

from workbench.plan.memory import PIN_EXACT


class HostMemory:
    """Exact-size page-locked host tensors. torch's pinned allocator rounds each request up to
    a power of two (a 26.6 GB buffer would pin 32 GB), so large buffers are ordinary CPU
    tensors registered with ``cudaHostRegister`` and unregistered on ``release``."""

    LARGE = PIN_EXACT  # bytes; smaller requests use the pinned allocator

    def __init__(self, cuda: bool, share=None):
        """``share``: a ``shared_host.NodeShare`` whose files hold every buffer (data
        parallel: one host copy per node), each registered whatever its size."""
        self.cuda, self._registered, self.share = cuda, [], share

    def empty(self, n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        shared = self.share.storage(n, dtype) if self.share is not None else None
        if not self.cuda:
            return shared if shared is not None else torch.empty(n, dtype=dtype)
        nbytes = n * torch.empty((), dtype=dtype).element_size()
        if nbytes < self.LARGE and shared is None:
            return torch.empty(n, dtype=dtype, pin_memory=True)
        t = shared if shared is not None else torch.empty(n, dtype=dtype)
        ret = torch.cuda.cudart().cudaHostRegister(t.data_ptr(), nbytes, 0)
        err = int(getattr(ret, "value", ret))  # a cudaError enum
        if err == 0:
            self._registered.append(t)
        else:  # slower (copies stage through the driver) but correct
            _clear_cuda_error()
            warnings.warn(f"cannot page-lock {nbytes / 1e9:.1f} GB of host memory "
                          f"(cudaHostRegister error {err}); using pageable memory", stacklevel=3)
        return t

    def release(self) -> None:
        for t in self._registered:
            torch.cuda.cudart().cudaHostUnregister(t.data_ptr())
        self._registered.clear()

    def __del__(self) -> None:
        if self._registered:
            try:
                self.release()
            except Exception:  # interpreter shutdown: the process frees everything anyway
                pass


def _clear_cuda_error() -> None:
    """Reset the runtime's last-error slot after a failed cudaHostRegister, so the next kernel
    launch check does not report it (best effort: libcudart is already loaded by torch)."""
    try:
        ctypes.CDLL("libcudart.so." + torch.version.cuda.split(".")[0]).cudaGetLastError()
    except (OSError, AttributeError):
        pass


class SnapshotBuffers:
    """Host buffers for checkpoint snapshots, allocated on first use and kept from one snapshot
    to the next (a fresh page-locked buffer costs a ``cudaHostAlloc`` and page faults in the
    training thread on every snapshot; the writer is idle when a snapshot starts, so nothing
    still reads them). ``allocations`` counts the buffers ever allocated here."""

    def __init__(self, cuda: bool):
        self.memory, self.allocations = HostMemory(cuda), 0
        self._bufs: dict[object, torch.Tensor] = {}

    def get(self, key: object, n: int, dtype: torch.dtype, pinned: bool) -> torch.Tensor:
        """The (n,) ``dtype`` buffer kept under ``key``: page-locked when ``pinned`` (a GPU
        copies into it), pageable otherwise (a host thread does)."""
        buf = self._bufs.get(key)
        if buf is None or buf.numel() != n or buf.dtype != dtype:
            buf = self.memory.empty(n, dtype) if pinned else torch.empty(n, dtype=dtype)
            self._bufs[key] = buf
            self.allocations += 1
        return buf

    def release(self) -> None:
        self._bufs.clear()
        self.memory.release()
