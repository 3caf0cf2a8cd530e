"""An adapter run's frozen base on the host (``base_codec``): encoded once at load, up only.

fp32: each block is copied straight into an fp32 slot, as ``PlainTransfer`` does.
Compressed codecs (bf16, fp16, fp8-e4m3, int8): each slot is a wire buffer of encoded bytes;
the upload stream only copies, block after block, and the block is decoded on the compute
stream just before it computes, into one buffer in its device form (``codecs/frozen_form.py``:
matrices in the autocast dtype). Why there and not on a stream of its own: a fused decode
costs about 3 B of GPU memory traffic per weight (~0.2 ms for an opt-6.7b block on an H100)
against ~3.1 ms of compute and ~3.7 ms of fp8 upload per block, so compute + decode stays
below the link and the link never waits for either; one decoded buffer then serves every
block (the compute stream runs them in order) instead of one per slot, and no concurrent
decode kernel competes with the matmuls for the GPU. A wire is free again once its block is
decoded (not computed), so with ``prefetch_depth`` + 1 wires the next copy never waits on
compute unless compute is more than ``prefetch_depth`` blocks behind the link.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from workbench.engine.codecs.base import BaseCodec, base_codec
from workbench.engine.codecs.frozen_form import FrozenForm
from workbench.engine.groups import GroupLayout, sample_by_pieces
from workbench.engine.device.pinned import HostMemory
from workbench.engine.stream.transfer import HostCopy, Extra, Stream
from workbench.engine.timing import OpTimer
from workbench.engine.device.shared_host import NodeShare
from workbench.plan.memory import SPARE_SLOTS


@dataclass
class Encoded:
    """A frozen base block on the host: its encoded bytes (pinned on CUDA), its codec and its
    device form (None for fp32)."""

    buf: torch.Tensor
    codec: BaseCodec
    form: FrozenForm | None


class FrozenTransfer:
    """Args:
        name: the base codec. layouts: the streamed blocks' layouts (wire and decoded buffers
        are sized for the largest). device, timer: as the other transfers. dtype: the
        matrices' dtype in the device form (``frozen_form.matrix_dtype``; None for fp32).
        share: the node's one host copy under data parallel (the base is never written back,
        so the writer fills it once and every rank only reads it).
    """

    master_dtype = torch.float32

    #: slots beyond prefetch_depth: with fp32 the block computing reads its slot; compressed,
    #: the wire the next copy may fill while the last one is still to be decoded
    spare_slots = SPARE_SLOTS["frozen"]
    lazy = False  # the decoded block is ready before compute (``before_compute``)

    def __init__(self, name: str, layouts: list[GroupLayout], device: torch.device, timer: OpTimer,
                 dtype: torch.dtype | None, share: NodeShare | None = None):
        self.name, self.device, self.timer, self.dtype = name, device, timer, dtype
        self.cuda = device.type == "cuda"
        self.host = HostMemory(self.cuda, share)
        self._codecs: dict[tuple, tuple[BaseCodec, FrozenForm | None]] = {}
        self.wire_bytes = max((self.codec_for(lay)[0].nbytes for lay in layouts), default=0)
        self.form_bytes = max((self.codec_for(lay)[1].nbytes for lay in layouts
                               if dtype is not None), default=0)
        self._decoded: torch.Tensor | None = None  # the one decoded buffer (``slot_buffers``)

    def codec_for(self, layout: GroupLayout) -> tuple[BaseCodec, FrozenForm | None]:
        key = layout.signature()
        if key not in self._codecs:
            form = FrozenForm(layout, self.dtype) if self.dtype is not None else None
            self._codecs[key] = (base_codec(self.name, layout), form)
        return self._codecs[key]

    def warm(self) -> None:
        """Compile the fused decode of every streamed layout (CUDA; nothing is launched)."""
        if self.cuda:
            for codec, form in self._codecs.values():
                if form is not None:
                    codec.warm(form.dtype, form.n_mat)

    def host_storage(self, layout: GroupLayout) -> Encoded:
        codec, form = self.codec_for(layout)
        return Encoded(self.host.empty(codec.nbytes, torch.uint8), codec, form)

    def host_bytes(self, host: Encoded) -> int:
        return host.buf.numel()

    def store_fp32(self, host: Encoded, flat: torch.Tensor) -> None:
        """Encode ``flat`` on its own device (on the GPU only the encoded bytes cross PCIe)."""
        same = flat.device == host.buf.device
        wire = host.buf if same else torch.empty_like(host.buf, device=flat.device)
        host.codec.encode(flat, wire)
        if wire is not host.buf:
            host.buf.copy_(wire)

    def to_fp32(self, host: Encoded) -> torch.Tensor:
        """The block's values as it computes with them (its form's), a new fp32 (n,) on the
        host."""
        if host.form is None:
            return host.buf.view(torch.float32).clone()
        # Decode to fp32 in place, then round the matrices as the form holds them: the same
        # values as decode_form + to_fp32 with one block-sized allocation, not four (a 175B
        # model's base digest decodes 96 blocks of 7 GB each)
        out = torch.empty(host.codec.numel, dtype=torch.float32)
        host.codec.decode(host.buf, out)
        host.form.round_(out)
        return out

    def reader(self, host: Encoded) -> "BlockReader":
        """The block's ``to_fp32`` values read a range at a time (``groups.fingerprint``: a
        digest never holds a decoded block)."""
        return BlockReader(host)

    # --- slots --------------------------------------------------------------------------------
    def slot_buffers(self, n: int, shared: bool = False) -> tuple[torch.Tensor, dict]:
        """A slot for blocks of up to n elements and the buffers beside it. fp32: an fp32 slot.
        Compressed: the decoded buffer (with ``shared``, the one all slots share, since the
        compute stream decodes and computes block after block; else a fresh one) and a wire
        buffer of the slot's own."""
        if self.dtype is None:
            return torch.empty(n, device=self.device), {}
        wire = torch.empty(self.wire_bytes, dtype=torch.uint8, device=self.device)
        if not shared:
            return torch.empty(self.form_bytes, dtype=torch.uint8, device=self.device), \
                {"wire": wire}
        if self._decoded is None:
            self._decoded = torch.empty(self.form_bytes, dtype=torch.uint8, device=self.device)
        return self._decoded, {"wire": wire}

    def slot_view(self, slot: torch.Tensor, numel: int) -> torch.Tensor:
        """What a block of ``numel`` elements uses of ``slot``: its prefix (fp32), or the
        whole decoded buffer, whose form reads its own prefix."""
        return slot[:numel] if self.dtype is None else slot

    def make_params(self, layout: GroupLayout, slot: torch.Tensor) -> list:
        """Parameter views of a block of ``layout`` in ``slot`` (its form's for compressed
        codecs; the caller caches them)."""
        form = self.codec_for(layout)[1]
        return form.make_params(slot) if form is not None else layout.make_params(slot)

    def updater(self, extra: dict[str, torch.Tensor], block: int) -> None:
        return None  # nothing in the base is ever updated

    def upload(self, host: Encoded, slot: torch.Tensor, extra: Extra, step: int, block: int,
               stream: Stream, slot_ready: Callable[[], None] | None = None) -> int:
        """The encoded bytes up, into the slot (fp32) or its wire; returns the bytes moved.
        ``slot_ready`` makes the stream wait until the slot's last block is done with it."""
        n = host.buf.numel()
        if slot_ready is not None:
            slot_ready()  # the copy overwrites the slot (fp32) or its wire (the last decode's)
        dst, src = ((slot, host.buf.view(torch.float32)) if host.form is None else
                    (extra["wire"][:n], host.buf))
        with self.timer.span("upload", "upload", stream, step, block, n):
            dst.copy_(src, non_blocking=True)
        return n

    def before_compute(self, host: Encoded, slot: torch.Tensor, extra: Extra, step: int, block: int,
                       stream: Stream, released: Callable[[], None],
                       layout: GroupLayout | None = None) -> None:
        """On the compute stream, once the block's upload has landed: decode its wire into
        ``slot`` (the decoded buffer), then ``released`` (the wire may take the next copy).
        fp32: nothing (the block computes in its slot, which stays busy until it is done)."""
        if host.form is None:
            return
        n = host.buf.numel()
        with self.timer.span("codec", "compute", stream, step, block, n, "decode"):
            host.codec.decode_form(extra["wire"][:n], *host.form.parts(slot))
        released()

    def offload(self, host: HostCopy, slot: torch.Tensor, extra: Extra, step: int, block: int,
                layout: GroupLayout, stream: Stream,
                released: Callable[[], None] | None = None) -> int:
        raise RuntimeError("a frozen base block is never offloaded (stream it with "
                           "write_back=False)")

    def wait_host(self, block: int) -> None:
        """No host-side work ever touches a frozen block."""

    def close(self) -> None:
        self._decoded = None
        self.host.release()


class BlockReader:
    """A frozen block's fp32 values (as ``FrozenTransfer.to_fp32`` gives them) by range: the
    codec's decode of the range, its matrix part rounded as the block's form holds it."""

    def __init__(self, host: Encoded):
        self.host, self.numel = host, host.codec.numel

    def sample(self, stride: int) -> torch.Tensor:
        return sample_by_pieces(self, stride)

    def read(self, lo: int, hi: int, out: torch.Tensor) -> None:
        self.host.codec.decode_range(self.host.buf, lo, hi, out)
        if self.host.form is not None:
            self.host.form.round_(out, start=lo)
