"""The transfer contract: how a streamed unit's weights live on the host and cross PCIe.

``Transfer`` is what the scheduler (``scheduler.py``) asks of any streamed unit's host format,
the frozen base's (``frozen_transfer.py``) included; ``TrainedTransfer`` adds what trained
weights need (read back as fp32 for digests, checkpoints and the replay, and settled after a
pass that writes them): ``transfers.py``'s plain, SR and mirror formats and the compute-dtype
slots of ``compute_slots.py``. Both are ``typing.Protocol``s, checked member by member and
signature by signature in ``tests/engine/stream/test_transfer_protocol.py`` as ``Engine`` is.

Units are named by their id (a block index, or EMBED / HEAD); ``step`` is the step index (-1
outside any step); ``stream`` is the CUDA stream the work is queued on (None on a CPU).
"""
from __future__ import annotations

from typing import Any, Callable, Protocol, runtime_checkable

import torch

from workbench.engine.groups import GroupLayout
from workbench.engine.zo.step import ApplyUpdate

#: A unit's host copy: one tensor, or named parts (a mirror's master and mirror, an encoded
#: frozen block).
HostCopy = Any
#: The device buffers beside a slot (wire buffers, a mirror's deltas), by name.
Extra = dict[str, torch.Tensor]
#: A CUDA stream, or None on a CPU.
Stream = Any


@runtime_checkable
class Transfer(Protocol):
    """A streamed unit's host format and its way up (and down) the link.

    Attributes:
        spare_slots: GPU slots needed beyond ``prefetch_depth``.
        lazy: whether the scheduler calls ``ready(unit)`` before each forward pass of a unit.
    """

    spare_slots: int
    lazy: bool

    def host_storage(self, layout: GroupLayout) -> HostCopy:
        """Host storage for a unit of ``layout`` (not yet filled)."""

    def host_bytes(self, host: HostCopy) -> int:
        """Bytes of host memory a unit's storage takes."""

    def reader(self, host: HostCopy) -> Any:
        """A piece-at-a-time reader of the unit for digests, or None (read it whole)."""

    def slot_buffers(self, n: int, shared: bool = False) -> tuple[torch.Tensor, Extra]:
        """A device slot of n elements and the buffers beside it (``shared``: slots allocated
        once, whose wire buffers can be one per direction)."""

    def slot_view(self, slot: torch.Tensor, numel: int) -> torch.Tensor:
        """What a unit of ``numel`` elements uses of ``slot``."""

    def make_params(self, layout: GroupLayout, slot: torch.Tensor) -> list:
        """Parameter views of a unit of ``layout`` in ``slot``."""

    def updater(self, extra: Extra, block: int) -> ApplyUpdate | None:
        """How a pending update reaches the uploaded weights (None: the fused update)."""

    def upload(self, host: HostCopy, slot: torch.Tensor, extra: Extra, step: int, block: int,
               stream: Stream, slot_ready: Callable[[], None] | None = None) -> int:
        """Host copy -> ``slot`` on ``stream``; returns the bytes moved."""

    def before_compute(self, host: HostCopy, slot: torch.Tensor, extra: Extra, step: int,
                       block: int, stream: Stream, released: Callable[[], None],
                       layout: GroupLayout | None = None) -> None:
        """On the compute stream, just before the unit computes."""

    def offload(self, host: HostCopy, slot: torch.Tensor, extra: Extra, step: int, block: int,
                layout: GroupLayout, stream: Stream,
                released: Callable[[], None] | None = None) -> int:
        """``slot`` -> host copy on ``stream``; returns the bytes sent."""

    def wait_host(self, block: int) -> None:
        """Host-side work on the unit's storage is done before its next upload."""

    def close(self) -> None:
        """Free the pinned host memory and device buffers."""


@runtime_checkable
class TrainedTransfer(Transfer, Protocol):
    """A trained unit's host format: its master read back and written as fp32.

    Attributes:
        master_dtype: what the host keeps, and so what a checkpoint stores.
    """

    master_dtype: torch.dtype

    def store_fp32(self, host: HostCopy, flat: torch.Tensor) -> None:
        """Fill a unit's host storage from fp32 weights ``flat`` ((n,), CPU)."""

    def to_fp32(self, host: HostCopy) -> torch.Tensor:
        """The unit's weights as fp32 ((n,), CPU)."""

    def read_master(self, host: HostCopy, out: torch.Tensor) -> torch.Tensor:
        """The unit's master copied into ``out`` ((n,) of ``master_dtype``, host)."""

    def slot_extra(self, n: int, shared: bool = False) -> Extra:
        """Device buffers beside a slot of n elements."""

    def settle(self, step: int, block: int, layout: GroupLayout) -> None:
        """On the compute stream, after a pass that writes the unit back."""
