"""Counter-based normal samples: Philox4x32-10 + Box-Muller, in plain torch.

z for element e of a group is a pure function of (step seed, group id, e): the key is
(seed, group id), the counter is c = e mod Q with Q = ceil(n / 4), and the lane is e div Q (one
Philox call gives four normals, written to four contiguous quarters). The Triton kernel in
``kernels.py`` computes the same integers bit for bit; the floats then agree to the last few
ulps of log / cos / sin on each device.

Torch has no unsigned 32-bit multiply-high. The words are held in int64: the product of two
32-bit values is below 2^64, and int64 multiplication wraps, so its 64 bits are the unsigned
product's; the high word is taken with an arithmetic shift and a mask. Each round is a dozen
in-place ops on buffers of ``CPU_CHUNK`` counters reused across rounds, so the operands stay in
cache and nothing is allocated per op: a CPU step costs about what torch.randn's does.
"""
from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

import torch

PHILOX_M0, PHILOX_M1 = 0xD2511F53, 0xCD9E8D57
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85
ROUNDS = 10
MASK32 = 0xFFFFFFFF
# Counters per pass. On a CPU: torch's parallel grain (32768 elements), so each op runs inline
# on the thread that issued it (no OpenMP region, whose barriers cost more than the op on a
# loaded host) and a pass's buffers (256 KB each) stay in the core's cache; the chunks are
# spread over torch's thread count with Python threads, torch releasing the GIL inside ops.
# On a GPU (the Triton kernel's fallback): large passes, few launches.
CPU_CHUNK = 1 << 15
CHUNK = 1 << 22


def _mulhilo(a: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32 bits of a * m for a in [0, 2^32) (int64 tensor) and a 32-bit constant."""
    p = a * m  # wraps mod 2^64: the unsigned product's bits
    return (p >> 32) & MASK32, p & MASK32


def philox4x32(counter: torch.Tensor, k0: int, k1: int) -> list[torch.Tensor]:
    """Four uint32 words (as int64) per counter value; counter words 1..3 are zero."""
    c0 = counter.to(torch.int64, copy=True)
    c1, c2, c3, p0, p1 = (torch.zeros_like(c0) for _ in range(5))
    for _ in range(ROUNDS):
        torch.mul(c0, PHILOX_M0, out=p0)
        torch.mul(c2, PHILOX_M1, out=p1)
        # c0' = hi(p1) ^ c1 ^ k0 in c1's buffer, c2' = hi(p0) ^ c3 ^ k1 in c3's (c0 and c2
        # hold the shifted products meanwhile); c1' = lo(p1), c3' = lo(p0) in place
        torch.bitwise_right_shift(p1, 32, out=c0)
        c1.bitwise_xor_(c0).bitwise_xor_(k0).bitwise_and_(MASK32)
        torch.bitwise_right_shift(p0, 32, out=c2)
        c3.bitwise_xor_(c2).bitwise_xor_(k1).bitwise_and_(MASK32)
        p0.bitwise_and_(MASK32)
        p1.bitwise_and_(MASK32)
        c0, c1, c2, c3, p0, p1 = c1, p1, c3, p0, c0, c2
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
    chunk = CPU_CHUNK if out.device.type == "cpu" else CHUNK

    def one(start: int) -> None:
        stop = min(q, start + chunk)
        counter = torch.arange(start, stop, dtype=torch.int64, device=device)
        fill(lanes[:, start:stop], philox4x32(counter, k0 & MASK32, k1 & MASK32))

    starts = range(0, q, chunk)
    workers = min(len(starts), torch.get_num_threads()) if out.device.type == "cpu" else 1
    if workers > 1:
        list(_pool(workers).map(one, starts))  # list(): re-raises a worker's exception
    else:
        for start in starts:
            one(start)
    return out[:n]


@lru_cache(maxsize=4)
def _pool(workers: int) -> ThreadPoolExecutor:
    """One pool per thread count, kept: a pass of a small group must not pay a pool's start."""
    return ThreadPoolExecutor(workers, thread_name_prefix="philox")


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
