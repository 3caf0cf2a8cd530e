"""Fused decodes of a frozen base block (Triton, CUDA only): fp8-e4m3 / int8 -> its device form.

The torch path in ``base.py`` decodes into an fp32 block (a copy, then a scaling pass)
and casts the matrices to the compute dtype after: about 19 B of memory traffic per element.
Here each element is read once (1 B and its scale) and written once in the form's dtype (2 B
under autocast): the same arithmetic, element by element (the fp8 / int8 value widened to fp32,
times its fp32 scale, rounded once to nearest even into the output dtype), so both paths give
the same bits, except that these kernels may flush fp32 subnormal products (|x| < 1.2e-38) to
zero, as ``sr_kernel.py`` says of its own.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from workbench.engine.kernels import load_compiled

BLOCK = 2048


@triton.jit
def fp8_kernel(v_ptr, s_ptr, mats_ptr, tail_ptr, n_mat, n, CHUNK: tl.constexpr,
               BLOCK: tl.constexpr):
    """Element e < n_mat -> mats[e] (its dtype), else tail[e - n_mat] (fp32); scale e // CHUNK."""
    e = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = e < n
    x = tl.load(v_ptr + e, mask=m).to(tl.float32) * tl.load(s_ptr + e // CHUNK, mask=m)
    mat = e < n_mat
    tl.store(mats_ptr + e, x.to(mats_ptr.dtype.element_ty), mask=m & mat)
    tl.store(tail_ptr + (e - n_mat), x, mask=m & (e >= n_mat))


@triton.jit
def rows_kernel(v_ptr, s_ptr, out_ptr, n, cols, BLOCK: tl.constexpr):
    """One int8 matrix, row-major: out[e] = v[e] * s[e // cols], in out's dtype."""
    e = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = e < n
    x = tl.load(v_ptr + e, mask=m).to(tl.float32) * tl.load(s_ptr + e // cols, mask=m)
    tl.store(out_ptr + e, x.to(out_ptr.dtype.element_ty), mask=m)


def decode_fp8(values: torch.Tensor, scales: torch.Tensor, mats: torch.Tensor,
               tail: torch.Tensor, chunk: int) -> None:
    """Enqueue on the current stream: fp8 ``values`` (n,) times ``scales`` (one per ``chunk``)
    into ``mats`` (n_mat,) and fp32 ``tail`` (n - n_mat,)."""
    n, n_mat = values.numel(), mats.numel()
    if n:
        fp8_kernel[(triton.cdiv(n, BLOCK),)](values, scales, mats, tail, n_mat, n, CHUNK=chunk,
                                             BLOCK=BLOCK)


def decode_rows(values: torch.Tensor, scales: torch.Tensor, out: torch.Tensor,
                cols: int) -> None:
    """Enqueue on the current stream: int8 ``values`` (rows x cols, flat) times one scale per
    row into ``out`` (same numel)."""
    n = values.numel()
    if n:
        rows_kernel[(triton.cdiv(n, BLOCK),)](values, scales, out, n, cols, BLOCK=BLOCK)


def warm_fp8(dtype: torch.dtype, n_mat: int, n: int, chunk: int) -> None:
    """Compile and load, without launching, ``decode_fp8``'s kernel for these sizes."""
    load_compiled(fp8_kernel.warmup(torch.float8_e4m3fn, torch.float32, dtype, torch.float32,
                                    n_mat, n, CHUNK=chunk, BLOCK=BLOCK, grid=(1,)))


def warm_rows(dtype: torch.dtype, n: int, cols: int) -> None:
    """Compile and load, without launching, ``decode_rows``'s kernel for these sizes."""
    load_compiled(rows_kernel.warmup(torch.int8, torch.float32, dtype, n, cols, BLOCK=BLOCK,
                                     grid=(1,)))
