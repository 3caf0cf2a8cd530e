"""Counter-based normal samples: Philox4x32-10 + Box-Muller, in plain torch.

z for element e of a group is a pure function of (step seed, group id, e): the key is
(seed, group id), the counter is c = e mod Q with Q = ceil(n / 4), and the lane is e div Q (one
Philox call gives four normals, written to four contiguous quarters). The Triton kernel in
``kernels.py`` computes the same integers bit for bit; the floats then agree to the last few
ulps of log / cos / sin on each device.

Torch has no unsigned 32-bit multiply-high, so products are built from 16-bit limbs in int64,
which never overflows.
"""
from __future__ import annotations

import math

import torch

PHILOX_M0, PHILOX_M1 = 0xD2511F53, 0xCD9E8D57
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85
ROUNDS = 10
MASK32 = 0xFFFFFFFF
CHUNK = 1 << 22  # counters per pass: bounds temporary memory to ~0.3 GB


def _mulhilo(a: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32 bits of a * m for a in [0, 2^32) (int64 tensor) and a 32-bit constant."""
    a_hi, a_lo = a >> 16, a & 0xFFFF
    m_hi, m_lo = m >> 16, m & 0xFFFF
    lo_lo = a_lo * m_lo
    mid = a_hi * m_lo + a_lo * m_hi + (lo_lo >> 16)
    hi = a_hi * m_hi + (mid >> 16)
    lo = ((mid & 0xFFFF) << 16) | (lo_lo & 0xFFFF)
    return hi, lo


def philox4x32(counter: torch.Tensor, k0: int, k1: int) -> list[torch.Tensor]:
    """Four uint32 words (as int64) per counter value; counter words 1..3 are zero."""
    c0 = counter
    c1 = c2 = c3 = torch.zeros_like(counter)
    for _ in range(ROUNDS):
        hi0, lo0 = _mulhilo(c0, PHILOX_M0)
        hi1, lo1 = _mulhilo(c2, PHILOX_M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0, k1 = (k0 + PHILOX_W0) & MASK32, (k1 + PHILOX_W1) & MASK32
    return [c0, c1, c2, c3]


def uniform(x: torch.Tensor) -> torch.Tensor:
    """uint32 -> float32 in (0, 1), exact: (2 * (x >> 9) + 1) * 2^-24."""
    return (x >> 9).to(torch.float32) * (2.0 ** -23) + 2.0 ** -24


def _lanes(n: int, k0: int, k1: int, dtype: torch.dtype, device, fill) -> torch.Tensor:
    """(n,) output in the lane layout (element e: lane e div Q, counter e mod Q), filled chunk by
    chunk of counters: ``fill(lanes[:, start:stop], words)`` with the chunk's four Philox words."""
    q = (n + 3) // 4
    out = torch.empty(4 * q, dtype=dtype, device=device)
    lanes = out.view(4, q)
    for start in range(0, q, CHUNK):
        stop = min(q, start + CHUNK)
        counter = torch.arange(start, stop, dtype=torch.int64, device=device)
        fill(lanes[:, start:stop], philox4x32(counter, k0 & MASK32, k1 & MASK32))
    return out[:n]


def words(n: int, k0: int, k1: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """n raw uint32 words (as int64, shape (n,)) under key (k0, k1), in ``normals``' layout."""

    def fill(lanes: torch.Tensor, w: list[torch.Tensor]) -> None:
        for lane in range(4):
            lanes[lane] = w[lane]

    return _lanes(n, k0, k1, torch.int64, device, fill)


def normals(n: int, seed: int, gid: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The n standard normals of group ``gid`` at step seed ``seed`` (float32, shape (n,))."""

    def fill(lanes: torch.Tensor, w: list[torch.Tensor]) -> None:
        for pair in (0, 1):  # Box-Muller: two uniforms -> two normals
            u1, u2 = uniform(w[2 * pair]), uniform(w[2 * pair + 1])
            r = torch.sqrt(-2.0 * torch.log(u1))
            theta = (2.0 * math.pi) * u2
            lanes[2 * pair] = r * torch.cos(theta)
            lanes[2 * pair + 1] = r * torch.sin(theta)

    return _lanes(n, seed, gid, torch.float32, device, fill)
