"""Fused ZO kernel (Triton, CUDA only): regenerate z and apply it in one pass, z never stored.

One launch covers a flat parameter group. Per element, with z from ``philox.py``'s scheme:
  update  (DO_UPDATE):  w <- fma(-lr, fma(g, z_prev, wd_e * w), w)   wd_e = wd on [0, n_decay)
  perturb (DO_PERTURB): out <- fma(z, scale, w)
The update uses the pending step's seed, the perturbation the current one, so the efficient
update (apply step t's update right after the upload in step t+1) costs one pass, not two.
Every rounding is an explicit fma or multiply, so separate and fused launches agree bit for bit.
"""
from __future__ import annotations

import triton
import triton.language as tl

from workbench.engine.kernels import load_compiled
from workbench.engine.rng.triton_philox import normals4

@triton.jit
def _lane(x_ptr, out_ptr, e, m, zp, zc, g, neg_lr, wd, n_decay, scale,
          DO_UPDATE: tl.constexpr, DO_PERTURB: tl.constexpr, WRITE_X: tl.constexpr):
    w = tl.load(x_ptr + e, mask=m)
    if DO_UPDATE:
        wd_e = tl.where(e < n_decay, wd, 0.0)
        w = tl.fma(neg_lr, tl.fma(g, zp, wd_e * w), w)
        if WRITE_X:
            tl.store(x_ptr + e, w, mask=m)
    if DO_PERTURB:
        tl.store(out_ptr + e, tl.fma(zc, scale, w), mask=m)
    elif not WRITE_X:
        tl.store(out_ptr + e, w, mask=m)


# Triton turns an integer argument equal to 1 into a compile-time constant; a seed or group id
# of 1 would then break ``.to(tl.uint32)``, so those are never specialised.
@triton.jit(do_not_specialize=["seed", "prev_seed", "gid"])
def zo_kernel(x_ptr, out_ptr, g_ptr, n, q, n_decay, seed, prev_seed, gid, scale, neg_lr, wd,
              DO_UPDATE: tl.constexpr, DO_PERTURB: tl.constexpr, WRITE_X: tl.constexpr,
              BLOCK: tl.constexpr):
    c = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    cm = c < q
    g = 0.0
    zp0, zp1, zp2, zp3 = 0.0, 0.0, 0.0, 0.0
    zc0, zc1, zc2, zc3 = 0.0, 0.0, 0.0, 0.0
    if DO_UPDATE:
        g = tl.load(g_ptr)
        zp0, zp1, zp2, zp3 = normals4(prev_seed, gid, c)
    if DO_PERTURB:
        zc0, zc1, zc2, zc3 = normals4(seed, gid, c)
    e = c
    _lane(x_ptr, out_ptr, e, cm & (e < n), zp0, zc0, g, neg_lr, wd, n_decay, scale,
          DO_UPDATE, DO_PERTURB, WRITE_X)
    e = c + q
    _lane(x_ptr, out_ptr, e, cm & (e < n), zp1, zc1, g, neg_lr, wd, n_decay, scale,
          DO_UPDATE, DO_PERTURB, WRITE_X)
    e = c + 2 * q
    _lane(x_ptr, out_ptr, e, cm & (e < n), zp2, zc2, g, neg_lr, wd, n_decay, scale,
          DO_UPDATE, DO_PERTURB, WRITE_X)
    e = c + 3 * q
    _lane(x_ptr, out_ptr, e, cm & (e < n), zp3, zc3, g, neg_lr, wd, n_decay, scale,
          DO_UPDATE, DO_PERTURB, WRITE_X)


@triton.jit(do_not_specialize=["seed", "gid"])
def normals_kernel(out_ptr, n, q, seed, gid, BLOCK: tl.constexpr):
    """Materialise z (tests and forward-gradient tangents)."""
    c = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    cm = c < q
    z0, z1, z2, z3 = normals4(seed, gid, c)
    tl.store(out_ptr + c, z0, mask=cm & (c < n))
    tl.store(out_ptr + c + q, z1, mask=cm & (c + q < n))
    tl.store(out_ptr + c + 2 * q, z2, mask=cm & (c + 2 * q < n))
    tl.store(out_ptr + c + 3 * q, z3, mask=cm & (c + 3 * q < n))


BLOCK = 1024
#: (DO_UPDATE, DO_PERTURB, WRITE_X) of ``launch``'s callers: perturb, update, update + perturb
#: in place, update + perturb into a separate output
VARIANTS = ((False, True, False), (True, False, True), (True, True, False), (True, True, True))


def warm(n: int, n_decay: int) -> None:
    """Compile and load, without launching, every variant of both kernels for a group of n
    elements whose first n_decay decay: the variants differ in the flags and in what Triton
    specialises on (n, q and n_decay: equal to 1, divisible by 16), so the sizes are the real
    ones while the tensors are only their dtypes. Setup only: each compile takes seconds the
    first step would otherwise pay; Triton's disk cache makes later processes only load."""
    import torch

    f32, q = torch.float32, (n + 3) // 4
    for do_update, do_perturb, write_x in VARIANTS:
        load_compiled(zo_kernel.warmup(f32, f32, f32, n, q, n_decay, 0, 0, 0, 0.0, 0.0, 0.0,
                                       DO_UPDATE=do_update, DO_PERTURB=do_perturb,
                                       WRITE_X=write_x, BLOCK=BLOCK, grid=(1,)))
    load_compiled(normals_kernel.warmup(f32, n, q, 0, 0, BLOCK=BLOCK, grid=(1,)))


def launch(x, out, g, n_decay: int, seed: int, prev_seed: int, gid: int, scale: float,
           lr: float, wd: float, do_update: bool, do_perturb: bool, write_x: bool) -> None:
    """Enqueue one fused pass on the current stream (x, out: flat fp32 CUDA tensors)."""
    n = x.numel()
    q = (n + 3) // 4
    grid = (triton.cdiv(q, BLOCK),)
    zo_kernel[grid](x, out, g if g is not None else x, n, q, n_decay, seed, prev_seed, gid,
                    scale, -lr, wd, DO_UPDATE=do_update, DO_PERTURB=do_perturb, WRITE_X=write_x,
                    BLOCK=BLOCK)


def normals(n: int, seed: int, gid: int, device) -> "torch.Tensor":  # noqa: F821
    import torch

    out = torch.empty(n, dtype=torch.float32, device=device)
    q = (n + 3) // 4
    normals_kernel[(triton.cdiv(q, BLOCK),)](out, n, q, seed, gid, BLOCK=BLOCK)
    return out
