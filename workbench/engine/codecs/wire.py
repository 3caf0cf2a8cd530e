"""Transfer codecs: the formats blocks travel in over PCIe, and stochastic rounding.

An encoded group is one flat byte buffer (so one copy moves it): the values in the codec's
dtype, then, for fp8, one fp32 scale per ``CHUNK`` elements (finer than per row, so a tensor's
small weights are not flushed to zero by its large ones). Encoding and decoding are plain
tensor ops that run on the device and stream the caller is on (the GPU, in the transfer's
stream); on the CPU the same code runs for tests.

Stochastic rounding (SR) to bf16 / fp16 adds uniform noise below the kept mantissa bits before
truncating, so E[SR(x)] = x: an update far smaller than a bf16 ulp still moves the stored
weight in expectation instead of being rounded away. The noise is counter-based Philox
(``philox.words``), so the fused CUDA kernel (``sr_kernel.py``) and the torch path here
round every element the same way.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from workbench.engine import kernels
from workbench.engine.rng import philox
from workbench.plan.wire import FP8_CHUNK as CHUNK  # elements per fp8 scale
from workbench.plan.wire import codec_bytes, fp8_scales_offset

FP8 = {"fp8-e4m3": (torch.float8_e4m3fn, 448.0), "fp8-e5m2": (torch.float8_e5m2, 57344.0)}
HALF = {"bf16": torch.bfloat16, "fp16": torch.float16}
SR_KEY = 0x53524E44  # second Philox key word of the rounding noise: apart from z's group ids


@dataclass(frozen=True)
class Codec:
    """A transfer format. ``nbytes(n)``: encoded size of n fp32 elements (scales included)."""

    name: str

    def _scales_offset(self, n: int) -> int:
        return fp8_scales_offset(n)  # fp8 bytes, padded so the fp32 scales are aligned

    def nbytes(self, n: int) -> int:
        return codec_bytes(self.name, n)  # the cost model counts the same bytes

    def empty(self, n: int, device: torch.device | str, pin: bool = False) -> torch.Tensor:
        """An encoded buffer (uint8) for n elements."""
        return torch.empty(self.nbytes(n), dtype=torch.uint8, device=device, pin_memory=pin)

    def views(self, buf: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(values, scales) viewing an encoded buffer."""
        if self.name == "fp32":
            return buf.view(torch.float32)[:n], None
        if self.name in HALF:
            return buf.view(HALF[self.name])[:n], None
        off = self._scales_offset(n)
        return buf[:n].view(FP8[self.name][0]), buf[off:].view(torch.float32)

    def encode(self, x: torch.Tensor, buf: torch.Tensor, sr_seed: int | None = None) -> None:
        """fp32 x (n,) -> buf; with ``sr_seed`` (bf16 / fp16 only) stochastic rounding."""
        n = x.numel()
        values, scales = self.views(buf, n)
        if self.name == "fp32":
            values.copy_(x)
        elif self.name in HALF:
            if sr_seed is None:
                values.copy_(x)
            elif x.is_cuda and sr_kernels() is not None:
                sr_kernels().stochastic_round_into(x, values, sr_seed, SR_KEY)
            else:
                values.copy_(stochastic_round(x, HALF[self.name], sr_seed))
        else:  # in pieces of whole chunks: each chunk's scale is its own, so the bytes are
            # the same, and the temporaries stay small (a 175B model's 7 GB block on a capped GPU)
            step = ENCODE_PIECE
            for lo in range(0, n, step):
                hi = min(n, lo + step)
                self._encode_fp8(x[lo:hi], values[lo:hi], scales[lo // CHUNK:(hi + CHUNK - 1) // CHUNK])

    def _encode_fp8(self, x: torch.Tensor, values: torch.Tensor, scales: torch.Tensor) -> None:
        """fp32 x (m,) -> fp8 values (m,) and one fp32 scale per CHUNK (the last one padded)."""
        dtype, fmax = FP8[self.name]
        chunks, _ = _chunked(x, x.numel())
        amax = chunks.abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny)
        scales.copy_(amax / fmax)
        scaled = (chunks / scales[:, None]).clamp_(-fmax, fmax).reshape(-1)[:x.numel()]
        values.copy_(scaled.to(dtype))

    def decode(self, buf: torch.Tensor, out: torch.Tensor) -> None:
        """buf -> fp32 out (n,)."""
        self.decode_range(buf, out.numel(), 0, out.numel(), out)

    def decode_range(self, buf: torch.Tensor, n: int, lo: int, hi: int,
                     out: torch.Tensor) -> None:
        """Elements [lo, hi) of an n-element encoding -> fp32 out (hi - lo,); lo a multiple of
        ``CHUNK`` (each fp8 chunk has its own scale)."""
        values, scales = self.views(buf, n)
        if scales is None:
            out.copy_(values[lo:hi])
            return
        full = (hi - lo) // CHUNK * CHUNK
        out[:full].view(-1, CHUNK).copy_(values[lo:lo + full].view(-1, CHUNK)).mul_(
            scales[lo // CHUNK:(lo + full) // CHUNK, None])
        if lo + full < hi:  # the encoding's last, ragged chunk
            out[full:].copy_(values[lo + full:hi]).mul_(scales[(lo + full) // CHUNK])


#: elements an fp8 encode handles at once (a multiple of CHUNK): 64 Mi = 256 MiB of fp32, so
#: its temporaries are about 0.8 GB however large the group
ENCODE_PIECE = 1 << 26


def _chunked(x: torch.Tensor, n: int) -> tuple[torch.Tensor, int]:
    """x padded with zeros to whole chunks, as (chunks, CHUNK)."""
    pad = (-n) % CHUNK
    if pad:
        x = torch.cat([x, x.new_zeros(pad)])
    return x.view(-1, CHUNK), pad


def sr_kernels():
    """The fused SR kernel module, or None when Triton is missing (said once)."""
    return kernels.load("codecs.sr_kernel", "master=compressed-sr")


def stochastic_round(x: torch.Tensor, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """fp32 (n,) -> bf16 / fp16 with unbiased stochastic rounding (deterministic given ``seed``).

    Adds uniform integer noise below the kept mantissa bits of the fp32 pattern and truncates
    them; the result is then exactly representable (fp16: within its normal range)."""
    drop = 16 if dtype == torch.bfloat16 else 13
    noise = (philox.words(x.numel(), seed, SR_KEY, x.device) >> (32 - drop)).to(torch.int32)
    noise = noise.view(x.shape)
    bits = x.contiguous().view(torch.int32)
    finite = torch.isfinite(x)
    rounded = ((bits + noise) & ~((1 << drop) - 1)).view(torch.float32)
    return torch.where(finite, rounded, x).to(dtype)


def get_codec(name: str) -> Codec:
    if name != "fp32" and name not in HALF and name not in FP8:
        raise ValueError(f"codec: {name!r} is not one of fp32, bf16, fp16, fp8-e4m3, fp8-e5m2")
    return Codec(name)
