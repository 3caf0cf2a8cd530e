"""Philox4x32-10 normals inside Triton kernels: the device twin of ``philox.py``, bit for bit
(same counters, key (seed, group id), uniform and Box-Muller). Imported by every kernel that draws
a direction or a stochastic rounding (the fused ZO kernel, the chain kernel, the SR codec)."""
from __future__ import annotations

import triton
import triton.language as tl

M0 = tl.constexpr(0xD2511F53)
M1 = tl.constexpr(0xCD9E8D57)
W0 = tl.constexpr(0x9E3779B9)
W1 = tl.constexpr(0xBB67AE85)
TWO_PI = tl.constexpr(6.283185307179586)


@triton.jit
def uniform(x):
    return (x >> 9).to(tl.float32) * 1.1920928955078125e-07 + 5.960464477539063e-08


@triton.jit
def philox4x32(seed, gid, c):
    """Philox4x32-10 of counter c under key (seed, gid): four uint32 words."""
    k0 = seed.to(tl.uint32)
    k1 = gid.to(tl.uint32)
    c0 = c.to(tl.uint32)
    c1 = c0 * 0
    c2 = c1
    c3 = c1
    for _ in tl.static_range(10):
        _c0 = c0
        _c2 = c2
        c0 = tl.umulhi(M1, _c2) ^ c1 ^ k0
        c2 = tl.umulhi(M0, _c0) ^ c3 ^ k1
        c1 = M1 * _c2
        c3 = M0 * _c0
        k0 = k0 + W0
        k1 = k1 + W1
    return c0, c1, c2, c3


@triton.jit
def normals4(seed, gid, c):
    c0, c1, c2, c3 = philox4x32(seed, gid, c)
    r0 = tl.sqrt_rn(-2.0 * tl.log(uniform(c0)))
    t0 = TWO_PI * uniform(c1)
    r1 = tl.sqrt_rn(-2.0 * tl.log(uniform(c2)))
    t1 = TWO_PI * uniform(c3)
    return r0 * tl.cos(t0), r0 * tl.sin(t0), r1 * tl.cos(t1), r1 * tl.sin(t1)
