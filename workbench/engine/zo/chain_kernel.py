"""The chain kernel (Triton, CUDA only): a half-precision block's ZO arithmetic recomputed from
its master in one pass, z regenerated, nothing fp32 stored.

A compute-dtype slot (``stream/compute_slots.py``) holds a block's bf16 / fp16 master as it is.
The fp32-slot path decodes it to fp32 and runs a visit's operations on it in place, each an
explicit fma (``kernels.py``):
    update   x <- fma(-lr, fma(g, z, wd_e x), x)      (wd_e = wd on [0, n_decay))
    perturb  x <- fma(z, scale, x)
Here each launch starts again from the master and applies the visit's operations so far, in
the same order with the same fmas, so every intermediate value is the fp32 path's bit for bit;
only the end differs: the forward pass's form (matrices rounded to nearest even in the compute
dtype, as autocast casts them, the rest fp32: ``codecs/frozen_form.py``), or the master
written back (stochastically rounded with the SR encoder's own Philox words, or to nearest).
Operations that share a seed share one regeneration of z.

Op tables (device tensors): groups of consecutive operations under one seed (``g_seed``, and
``g_start``: the first operation of each group, with one entry past the last), then per
operation its factor a (-lr, or the scale), weight decay and the index of its g in ``g_ptr``
(-1: a perturbation).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from workbench.engine.kernels import load_compiled
from workbench.engine.rng.triton_philox import normals4, philox4x32

BLOCK = 512
FORM, SR, NEAREST = 0, 1, 2  # what a launch writes: the forward's form, or the master


@triton.jit
def _apply(x, e, z, a, wd, g, is_update, n_decay):
    wd_e = tl.where(e < n_decay, wd, 0.0)
    upd = tl.fma(a, tl.fma(g, z, wd_e * x), x)
    return tl.where(is_update, upd, tl.fma(z, a, x))


@triton.jit
def _store(x, e, m, w_ptr, mats_ptr, tail_ptr, n_mat, word, MODE: tl.constexpr,
           DROP: tl.constexpr):
    if MODE == 0:
        tl.store(mats_ptr + e, x.to(mats_ptr.dtype.element_ty), mask=m & (e < n_mat))
        tl.store(tail_ptr + (e - n_mat), x, mask=m & (e >= n_mat))
    elif MODE == 1:  # the SR encoder's rounding (``codecs/sr_kernel.py``), into the master
        bits = x.to(tl.uint32, bitcast=True)
        keep = (bits + (word >> (32 - DROP))) & (0xFFFFFFFF ^ ((1 << DROP) - 1))
        finite = (bits & 0x7F800000) != 0x7F800000
        y = tl.where(finite, keep.to(tl.float32, bitcast=True), x)
        tl.store(w_ptr + e, y.to(w_ptr.dtype.element_ty), mask=m)
    else:
        tl.store(w_ptr + e, x.to(w_ptr.dtype.element_ty), mask=m)


# seeds and ids never specialised: Triton would turn a value of 1 into a constant (kernels.py)
@triton.jit(do_not_specialize=["gid", "sr_seed", "sr_key", "n_groups"])
def chain_kernel(w_ptr, mats_ptr, tail_ptr, g_ptr, g_seed, g_start, op_a, op_wd, op_g,
                 n, q, n_mat, n_decay, gid, n_groups, sr_seed, sr_key,
                 MODE: tl.constexpr, DROP: tl.constexpr, BLOCK: tl.constexpr):
    c = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    cm = c < q
    e0, e1, e2, e3 = c, c + q, c + 2 * q, c + 3 * q
    m0, m1, m2, m3 = cm & (e0 < n), cm & (e1 < n), cm & (e2 < n), cm & (e3 < n)
    x0 = tl.load(w_ptr + e0, mask=m0, other=0.0).to(tl.float32)
    x1 = tl.load(w_ptr + e1, mask=m1, other=0.0).to(tl.float32)
    x2 = tl.load(w_ptr + e2, mask=m2, other=0.0).to(tl.float32)
    x3 = tl.load(w_ptr + e3, mask=m3, other=0.0).to(tl.float32)
    for k in range(n_groups):
        z0, z1, z2, z3 = normals4(tl.load(g_seed + k), gid, c)
        for j in range(tl.load(g_start + k), tl.load(g_start + k + 1)):
            a = tl.load(op_a + j)
            wd = tl.load(op_wd + j)
            gi = tl.load(op_g + j)
            is_update = gi >= 0
            g = tl.load(g_ptr + tl.maximum(gi, 0))
            x0 = _apply(x0, e0, z0, a, wd, g, is_update, n_decay)
            x1 = _apply(x1, e1, z1, a, wd, g, is_update, n_decay)
            x2 = _apply(x2, e2, z2, a, wd, g, is_update, n_decay)
            x3 = _apply(x3, e3, z3, a, wd, g, is_update, n_decay)
    w0, w1, w2, w3 = c, c, c, c
    if MODE == 1:
        w0, w1, w2, w3 = philox4x32(sr_seed, sr_key, c)
    _store(x0, e0, m0, w_ptr, mats_ptr, tail_ptr, n_mat, w0, MODE, DROP)
    _store(x1, e1, m1, w_ptr, mats_ptr, tail_ptr, n_mat, w1, MODE, DROP)
    _store(x2, e2, m2, w_ptr, mats_ptr, tail_ptr, n_mat, w2, MODE, DROP)
    _store(x3, e3, m3, w_ptr, mats_ptr, tail_ptr, n_mat, w3, MODE, DROP)


@triton.jit(do_not_specialize=["gid", "n_groups", "length", "per_span"])
def span_kernel(w_ptr, out_ptr, starts_ptr, g_ptr, g_seed, g_start, op_a, op_wd, op_g,
                q, length, per_span, n_decay, gid, n_groups, BLOCK: tl.constexpr):
    """The FORM mode's fp32 values for elements [start, start + length) of each span (a
    streamed embedding's rows), to ``out[s * length + j]``: element e is lane e // q of chunk
    e % q, so it takes the very z ``chain_kernel`` gives it."""
    pid = tl.program_id(0)
    s = pid // per_span
    j = (pid % per_span) * BLOCK + tl.arange(0, BLOCK)
    m = j < length
    e = tl.load(starts_ptr + s) + j
    c = e % q
    lane = e // q
    x = tl.load(w_ptr + e, mask=m, other=0.0).to(tl.float32)
    for k in range(n_groups):
        z0, z1, z2, z3 = normals4(tl.load(g_seed + k), gid, c)
        z = tl.where(lane == 0, z0, tl.where(lane == 1, z1, tl.where(lane == 2, z2, z3)))
        for jj in range(tl.load(g_start + k), tl.load(g_start + k + 1)):
            a = tl.load(op_a + jj)
            wd = tl.load(op_wd + jj)
            gi = tl.load(op_g + jj)
            g = tl.load(g_ptr + tl.maximum(gi, 0))
            x = _apply(x, e, z, a, wd, g, gi >= 0, n_decay)
    tl.store(out_ptr + s.to(tl.int64) * length + j, x, mask=m)


def launch_spans(w: torch.Tensor, out: torch.Tensor, starts: torch.Tensor, length: int,
                 g: torch.Tensor, tables: tuple[torch.Tensor, ...], n_groups: int, n_decay: int,
                 gid: int) -> None:
    """Enqueue ``span_kernel`` on the current stream: ``out`` (S x length,) fp32 <- the spans
    of the master ``w`` (n,) bf16 / fp16 at ``starts`` (S,) int64 after the ops in
    ``tables`` (as ``launch``)."""
    q = (w.numel() + 3) // 4
    per_span = triton.cdiv(length, BLOCK)
    span_kernel[(starts.numel() * per_span,)](w, out, starts, g, *tables, q, length, per_span,
                                              n_decay, gid, n_groups, BLOCK=BLOCK)


def launch(w: torch.Tensor, mats: torch.Tensor, tail: torch.Tensor, g: torch.Tensor,
           tables: tuple[torch.Tensor, ...], n_groups: int, n_mat: int, n_decay: int, gid: int,
           mode: int, sr_seed: int = 0, sr_key: int = 0) -> None:
    """Enqueue one pass on the current stream. ``w``: the master (n,) bf16 / fp16, read, and
    written in the SR / NEAREST modes; ``mats`` (n_mat,) in the compute dtype and ``tail``
    (n - n_mat,) fp32: the form (FORM mode; else any tensors of those dtypes); ``g``: the
    pending update's coefficients (fp32, at least one element); ``tables``: (g_seed, g_start,
    op_a, op_wd, op_g) on the device."""
    n = w.numel()
    q = (n + 3) // 4
    drop = 16 if w.dtype == torch.bfloat16 else 13
    chain_kernel[(triton.cdiv(q, BLOCK),)](w, mats, tail, g, *tables, n, q, n_mat, n_decay, gid,
                                           n_groups, sr_seed, sr_key, MODE=mode, DROP=drop,
                                           BLOCK=BLOCK)


def warm(n: int, n_mat: int, n_decay: int, half: torch.dtype, compute: torch.dtype,
         modes: tuple[int, ...]) -> None:
    """Compile and load, without launching, the variants a block of these sizes runs (see
    ``kernels.py::warm``)."""
    q = (n + 3) // 4
    drop = 16 if half == torch.bfloat16 else 13
    i64, f32, i32 = torch.int64, torch.float32, torch.int32
    for mode in modes:
        load_compiled(chain_kernel.warmup(half, compute, f32, f32, i64, i64, f32, f32, i32,
                                          n, q, n_mat, n_decay, 0, 0, 0, 0, MODE=mode,
                                          DROP=drop, BLOCK=BLOCK, grid=(1,)))


def warm_spans(n: int, n_decay: int, half: torch.dtype) -> None:
    """Compile and load ``span_kernel`` for a streamed embedding of n elements (``warm``)."""
    i64, f32, i32 = torch.int64, torch.float32, torch.int32
    load_compiled(span_kernel.warmup(half, f32, i64, f32, i64, i64, f32, f32, i32, (n + 3) // 4,
                                     0, 0, n_decay, 0, 0, BLOCK=BLOCK, grid=(1,)))
