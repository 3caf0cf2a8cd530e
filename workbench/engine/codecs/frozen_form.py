"""How a frozen base block is held on the device for compute (``peft=lora``, a compressed
``base_codec``): its weight matrices in the compute dtype, its biases and norm weights in fp32.

Under autocast every matmul casts an fp32 weight to bf16 / fp16 (round to nearest even) in each
of a step's two passes; a frozen matrix can take that cast once, when it is decoded, and be held
in the compute dtype: the matmuls see the same values, the block takes half the memory, and
no pass re-reads 4 B per weight to cast it. Biases (autocast casts them the same way) and
norm weights (layer norms run in fp32 under autocast; CPU autocast would mix dtypes) stay fp32,
so nothing is rounded that autocast would not round. Without autocast the matrices stay fp32.

A form is one byte buffer: the layout's matrix prefix (``n_decay`` elements) in ``dtype``,
padded to 16 bytes, then the fp32 tail. MeZO's resident base and the zo-offload slot both hold
it, so both compute with the same values bit for bit.
"""
from __future__ import annotations

import torch
from torch import nn

from workbench.engine.codecs.wire import HALF
from workbench.engine.groups import GroupLayout


def matrix_dtype(amp: str, base_codec: str) -> torch.dtype | None:
    """The dtype a frozen block's matrices are held in: the autocast dtype under ``amp`` with a
    compressed ``base_codec``, fp32 without autocast; None for ``base_codec=fp32`` (the block
    stays one exact fp32 flat, no form)."""
    if base_codec == "fp32":
        return None
    return HALF.get(amp, torch.float32)


class FrozenForm:
    """A frozen block's device form for ``layout`` with matrices in ``dtype``. Units: bytes
    (``nbytes``), elements (``numel``, ``n_mat``)."""

    def __init__(self, layout: GroupLayout, dtype: torch.dtype):
        self.layout, self.dtype = layout, dtype
        self.numel, self.n_mat = layout.numel, layout.n_decay
        self.tail_at = (self.n_mat * dtype.itemsize + 15) // 16 * 16  # aligned as a kernel's own
        self.nbytes = self.tail_at + 4 * (self.numel - self.n_mat)

    def empty(self, device: torch.device | str) -> torch.Tensor:
        return torch.empty(self.nbytes, dtype=torch.uint8, device=device)

    def parts(self, buf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(matrices (n_mat,) in ``dtype``, tail (numel - n_mat,) fp32) viewing ``buf``."""
        mats = buf[:self.n_mat * self.dtype.itemsize].view(self.dtype)
        return mats, buf[self.tail_at:self.nbytes].view(torch.float32)

    def views(self, buf: torch.Tensor) -> list[torch.Tensor]:
        """One view per layout entry, shaped as the parameter."""
        mats, tail = self.parts(buf)
        return [(mats[e.offset:e.offset + e.numel] if e.offset < self.n_mat else
                 tail[e.offset - self.n_mat:e.offset - self.n_mat + e.numel]).view(e.shape)
                for e in self.layout.entries]

    def make_params(self, buf: torch.Tensor) -> list[nn.Parameter]:
        """Parameter objects viewing ``buf`` (as ``GroupLayout.make_params``; cache them)."""
        return [nn.Parameter(v, requires_grad=False) for v in self.views(buf)]

    def fill(self, buf: torch.Tensor, flat: torch.Tensor) -> None:
        """``buf`` <- fp32 ``flat`` (n,): matrices rounded to nearest even, as autocast casts."""
        mats, tail = self.parts(buf)
        mats.copy_(flat[:self.n_mat])
        tail.copy_(flat[self.n_mat:])

    def round_(self, flat: torch.Tensor, start: int = 0, piece: int = 1 << 24) -> None:
        """Round fp32 values in place to those this form holds: ``flat`` holds the block's
        elements [start, start + len); its part in the matrix prefix goes through ``dtype`` (to
        nearest even, as ``decode_form``), ``piece`` elements at a time; the fp32 tail stays."""
        if self.dtype == torch.float32:
            return
        end = min(flat.numel(), self.n_mat - start)  # flat's part in the matrix prefix
        for lo in range(0, end, piece):
            part = flat[lo:min(end, lo + piece)]
            part.copy_(part.to(self.dtype))

    def to_fp32(self, buf: torch.Tensor) -> torch.Tensor:
        """The values held, as a new fp32 flat (n,) on ``buf``'s device."""
        mats, tail = self.parts(buf)
        return torch.cat([mats.float(), tail])
