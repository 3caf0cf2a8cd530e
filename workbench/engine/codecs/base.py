"""Formats of a frozen base block (``base_codec``): how a block that never changes is stored.

A base block is encoded once, at load, into one flat byte buffer, and decoded before each use
(on the GPU, or the CPU in CPU runs) into its device form (``frozen_form.py``: matrices in the
compute dtype, the tail in fp32), or into fp32 (``decode``: host copies, digests). Because the
base never changes, no encode ever runs in a step and nothing goes back down. On CUDA the fp8
and int8 decodes into a form are fused kernels (``base_kernels.py``).

    fp32       4 B/param, exact.
    bf16/fp16  2 B/param, rounded to nearest.
    fp8-e4m3   1 B/param + one fp32 scale per ``codecs.CHUNK`` (256) elements ("per-block"):
               |error| <= 2^-4 |x| (3 mantissa bits), or scale * 2^-10 in the subnormal range.
    int8       1 B/param for matrices, one fp32 scale per output channel (row) of each matrix:
               symmetric, scale = max |row| / 127, so |error| <= scale / 2. Biases and norm
               weights (the layout's 1-D tail after ``n_decay``) stay fp32: they are a tiny
               share of a block and a LayerNorm gain would lose 0.4% to int8.

A codec is bound to one layout (int8 needs each matrix's row structure); layouts with one
signature share it.
"""
from __future__ import annotations

import torch

from workbench.engine import kernels
from workbench.engine.codecs.wire import CHUNK, HALF, Codec
from workbench.engine.groups import GroupLayout

INT8_MAX = 127.0


def fused():
    """The fused decode kernels (``base_kernels.py``), or None when Triton is missing (said
    once)."""
    return kernels.load("codecs.base_kernels", "base_codec")


class FlatBaseCodec:
    """fp32 / bf16 / fp16 / fp8-e4m3: the transfer codec of ``wire.py`` over the whole group."""

    def __init__(self, name: str, layout: GroupLayout):
        self.name, self.numel = name, layout.numel
        self.codec = Codec(name)
        self.nbytes = self.codec.nbytes(layout.numel)

    def encode(self, x: torch.Tensor, buf: torch.Tensor) -> None:
        """fp32 x (n,) -> buf (uint8, (nbytes,)), rounding to nearest."""
        self.codec.encode(x, buf)

    def decode(self, buf: torch.Tensor, out: torch.Tensor) -> None:
        """buf -> fp32 out (n,)."""
        self.codec.decode(buf, out)

    def decode_range(self, buf: torch.Tensor, lo: int, hi: int, out: torch.Tensor) -> None:
        """Elements [lo, hi) of ``decode`` into fp32 ``out`` (hi - lo,); lo a multiple of
        ``CHUNK`` (each fp8 chunk has its own scale)."""
        self.codec.decode_range(buf, self.numel, lo, hi, out)

    def decode_form(self, buf: torch.Tensor, mats: torch.Tensor, tail: torch.Tensor) -> None:
        """buf -> a ``FrozenForm``'s parts: ``mats`` (n_mat,) in its dtype, each value rounded
        once from its fp32 decoding; ``tail`` fp32. On buf's device and current stream."""
        n_mat = mats.numel()
        values, scales = self.codec.views(buf, self.numel)
        if scales is None:  # fp32 / bf16 / fp16: one conversion (via fp32, to nearest even)
            mats.copy_(values[:n_mat])
            tail.copy_(values[n_mat:])
        elif buf.is_cuda and fused() is not None:
            fused().decode_fp8(values, scales, mats, tail, CHUNK)
        else:
            _via_fp32(self, buf, mats, tail)

    def warm(self, dtype: torch.dtype, n_mat: int) -> None:
        """Compile ``decode_form``'s kernel for matrices in ``dtype`` (CUDA, fp8 only)."""
        if self.name not in ("fp32", *HALF) and fused() is not None:
            fused().warm_fp8(dtype, n_mat, self.numel, CHUNK)


class Int8BaseCodec:
    """int8 with per-channel scales. Buffer: int8 values of the matrix prefix, padded to 4 B,
    then one fp32 scale per row of each matrix, then the fp32 tail."""

    name = "int8"

    def __init__(self, layout: GroupLayout):
        self.numel, self.n_mat = layout.numel, layout.n_decay
        # (offset, rows, cols) of each matrix entry, in buffer order
        self.mats = [(e.offset, e.shape[0], e.numel // e.shape[0]) for e in layout.entries
                     if e.offset < layout.n_decay]
        self.n_rows = sum(r for _, r, _ in self.mats)
        self._scales_at = (self.n_mat + 3) // 4 * 4
        self._tail_at = self._scales_at + 4 * self.n_rows
        self.nbytes = self._tail_at + 4 * (self.numel - self.n_mat)

    def _views(self, buf: torch.Tensor):
        values = buf[:self.n_mat].view(torch.int8)
        scales = buf[self._scales_at:self._tail_at].view(torch.float32)
        tail = buf[self._tail_at:self.nbytes].view(torch.float32)
        return values, scales, tail

    def encode(self, x: torch.Tensor, buf: torch.Tensor) -> None:
        values, scales, tail = self._views(buf)
        row = 0
        for off, rows, cols in self.mats:
            m = x[off:off + rows * cols].view(rows, cols)
            scale = m.abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny) / INT8_MAX
            scales[row:row + rows].copy_(scale)
            q = torch.round(m / scale[:, None]).clamp_(-INT8_MAX, INT8_MAX)
            values[off:off + rows * cols].view(rows, cols).copy_(q.to(torch.int8))
            row += rows
        tail.copy_(x[self.n_mat:])

    def decode(self, buf: torch.Tensor, out: torch.Tensor) -> None:
        values, scales, tail = self._views(buf)
        row = 0
        for off, rows, cols in self.mats:
            dst = out[off:off + rows * cols].view(rows, cols)
            dst.copy_(values[off:off + rows * cols].view(rows, cols))
            dst.mul_(scales[row:row + rows, None])
            row += rows
        out[self.n_mat:].copy_(tail)

    def decode_range(self, buf: torch.Tensor, lo: int, hi: int, out: torch.Tensor) -> None:
        """Elements [lo, hi) of ``decode`` into fp32 ``out`` (hi - lo,): each matrix's part of
        the range times its rows' scales (a range may start or end inside a row), then the
        tail's part."""
        values, scales, tail = self._views(buf)
        row = 0
        for off, rows, cols in self.mats:
            a, b = max(lo, off), min(hi, off + rows * cols)
            if a < b:
                r0, r1 = (a - off) // cols, (b - off - 1) // cols  # first and last row touched
                per = scales[row + r0:row + r1 + 1].repeat_interleave(cols)
                seg = out[a - lo:b - lo].copy_(values[a:b])
                seg.mul_(per[a - off - r0 * cols:b - off - r0 * cols])
            row += rows
        if hi > self.n_mat:
            a = max(lo, self.n_mat)
            out[a - lo:].copy_(tail[a - self.n_mat:hi - self.n_mat])

    def decode_form(self, buf: torch.Tensor, mats: torch.Tensor, tail: torch.Tensor) -> None:
        """As ``FlatBaseCodec.decode_form``: each matrix row times its scale, in fp32, rounded
        once into ``mats``' dtype; the fp32 tail copied."""
        values, scales, wire_tail = self._views(buf)
        tail.copy_(wire_tail)
        if not (buf.is_cuda and fused() is not None):
            _via_fp32(self, buf, mats, None)
            return
        row = 0
        for off, rows, cols in self.mats:
            span = slice(off, off + rows * cols)
            fused().decode_rows(values[span], scales[row:row + rows], mats[span], cols)
            row += rows

    def warm(self, dtype: torch.dtype, n_mat: int) -> None:
        """Compile ``decode_form``'s kernels for matrices in ``dtype`` (CUDA)."""
        if fused() is not None:
            for cols, n in {(cols, rows * cols) for _, rows, cols in self.mats}:
                fused().warm_rows(dtype, n, cols)


def _via_fp32(codec, buf: torch.Tensor, mats: torch.Tensor, tail: torch.Tensor | None) -> None:
    """The torch path of ``decode_form``: decode to an fp32 block, then one cast into
    ``mats`` (and the tail copied, unless None)."""
    flat = torch.empty(codec.numel, dtype=torch.float32, device=buf.device)
    codec.decode(buf, flat)
    mats.copy_(flat[:mats.numel()])
    if tail is not None:
        tail.copy_(flat[mats.numel():])


BaseCodec = FlatBaseCodec | Int8BaseCodec


def base_codec(name: str, layout: GroupLayout) -> BaseCodec:
    """The codec ``name`` (the ``base_codec`` knob) bound to ``layout``."""
    if name == "int8":
        return Int8BaseCodec(layout)
    if name not in ("fp32", "bf16", "fp16", "fp8-e4m3"):
        raise ValueError(f"base_codec: {name!r} is not one of fp32, bf16, fp16, fp8-e4m3, int8")
    return FlatBaseCodec(name, layout)


def round_trip(name: str, layout: GroupLayout, flat: torch.Tensor) -> None:
    """``flat`` (n,) fp32 replaced by its decoded encoding: the base exactly as a streamed
    block sees it (MeZO keeps this on the device, so both engines compute with equal weights)."""
    if name == "fp32" or not layout.numel:
        return
    codec = base_codec(name, layout)
    buf = torch.empty(codec.nbytes, dtype=torch.uint8, device=flat.device)
    codec.encode(flat, buf)
    codec.decode(buf, flat)
