"""Adam's moments stored in bf16 with stochastic rounding (``adam_state_dtype=bf16``).

The fp32 master p stays fp32; m and v are stored in 2 bytes each. An update reads them into
fp32 scratch (a chunk at a time: ``chunk`` elements, small enough on the CPU that the scratch
stays in cache, so the host memory traffic per CPU-updated parameter falls from 28 B to 20 B of
the AdamW pass), runs the same fused AdamW kernel as the fp32 path, and writes them back with
stochastic rounding (SR): E[SR(x)] = x, so moments far below one bf16 ulp still move in
expectation, and each stored moment is within one bf16 ulp of its fp32 value.

Why not the transfer codecs' SR (``codecs/wire.py::stochastic_round``). Its noise is Philox
computed in plain torch ops (16-bit limbs in int64); on the CPU it ran at 1.5 M elements/s on
a 2-core CI machine, about 600x slower than the fused CPU AdamW it would follow. Here the noise
is a slice of a fixed table: ``PERIOD`` 16-bit words holding every value of [0, 2^16) equally
often, in an order drawn once with ``philox.words`` (so identical on every machine and device).
Element i (relative to its subgroup's start) of moment k of subgroup j at Adam step t gets
word (o(seed, t, j, k) + i) mod PERIOD, with o a 64-bit hash. Over the offset every word is
equally likely, so the rounding is exactly unbiased; offsets of different steps are
independent, so an element's rounding errors do not correlate from step to step. The noise is
a view, so SR costs three element passes (add, shift, narrowing copy), and the same for any
chunking: the CPU and the GPU side round a subgroup bit for bit the same way.

Non-finite moments: inf stays inf; a NaN stays a NaN (canonical NaNs; a NaN payload at the top
of the mantissa can wrap, which matters only once training has already failed).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from workbench.engine.fo.adamw import AdamW, OptState, Segment, adamw, within
from workbench.engine.rng import philox

#: Noise words in the table (each 16-bit value 4 times); elements PERIOD apart in a subgroup
#: share their noise within one step (never across steps).
PERIOD = 1 << 18
#: Elements a CPU update handles at once: p, g and two fp32 moment scratches of this size
#: (2 MiB) stay in a core's cache between the upcast, the AdamW and the rounding.
CPU_CHUNK = 1 << 17
TABLE_KEY = 0x4D4F4D53  # Philox key word of the table's order: apart from z's and wire SR's
MASK64 = (1 << 64) - 1
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@lru_cache(maxsize=None)
def _order() -> torch.Tensor:
    """The noise table (int32, (PERIOD,)), on the CPU: [0, PERIOD) mod 2^16, permuted by
    sorting Philox words (stable, so ties keep one order everywhere)."""
    keys = philox.words(PERIOD, 0, TABLE_KEY)
    perm = torch.sort(keys, stable=True).indices
    return (perm & 0xFFFF).to(torch.int32)


def noise_table(device: torch.device, longest: int) -> torch.Tensor:
    """The table followed by its first ``longest`` words again, on ``device``: any window of
    up to ``longest`` words starting in [0, PERIOD) is a contiguous slice."""
    t = _order()
    reps = -(-(PERIOD + longest) // PERIOD)
    return t.repeat(reps)[:PERIOD + longest].to(device)


def offset(seed: int, t: int, j: int, k: int) -> int:
    """Where moment k (0: m, 1: v) of subgroup j at Adam step t starts in the table
    (splitmix64 of the four, chained)."""
    h = 0
    for x in (seed, t, j, k):
        h = (h + x + 0x9E3779B97F4A7C15) & MASK64
        h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & MASK64
        h ^= h >> 31
    return h % PERIOD


def round_into(x: torch.Tensor, out: torch.Tensor, noise: torch.Tensor) -> None:
    """out (bf16, (n,)) <- SR(x) (fp32, (n,)) with ``noise`` (int32, (n,), in [0, 2^16)):
    the noise is added below the 16 bits bf16 keeps, and the top half of the sum kept. An
    arithmetic shift of a negative pattern keeps its sign bits, so the narrowing copy is
    exact."""
    out.view(torch.int16).copy_(torch.add(x.view(torch.int32), noise).bitwise_right_shift_(16))


@dataclass
class HalfMoments:
    """What one side needs to update subgroups whose m and v are bf16.

    Args:
        seed: the run's seed (part of every offset).
        device: where the updates run.
        chunk: elements upcast and rounded at a time (``CPU_CHUNK`` on the CPU; a slot piece
            on the GPU, where one launch per piece matters more than cache).

    Attributes: ``table`` (int32 noise, (PERIOD + chunk,)), ``m32`` / ``v32`` (fp32 scratch,
    (chunk,)), ``t`` (the Adam step the next updates round for; set by the engine).
    """

    seed: int
    device: torch.device
    chunk: int

    def __post_init__(self):
        self.table = noise_table(self.device, self.chunk)
        self.m32, self.v32 = (torch.empty(self.chunk, device=self.device) for _ in range(2))
        self.t = 0

    def buffers(self) -> list[torch.Tensor]:
        """Its device buffers (table and scratch)."""
        return [self.table, self.m32, self.v32]

    def noise(self, j: int, k: int, lo: int, n: int) -> torch.Tensor:
        """The noise of elements [lo, lo + n) of moment k of subgroup j (n <= chunk)."""
        o = (offset(self.seed, self.t, j, k) + lo) % PERIOD
        return self.table[o:o + n]


def adamw_half(state: OptState, g: torch.Tensor, segments: list[Segment], opt: AdamW,
               step_t: torch.Tensor, half: HalfMoments, j: int, lo: int = 0) -> None:
    """``adamw`` on elements [lo, lo + n) of subgroup j whose ``state`` has bf16 m and v (fp32
    p; ``g`` fp32; ``segments`` relative to ``lo``), in place: per chunk, the moments upcast
    into fp32 scratch, the fused AdamW, the moments stochastically rounded back."""
    n = state.p.numel()
    for a in range(0, n, half.chunk):
        b = min(n, a + half.chunk)
        m32, v32 = half.m32[:b - a].copy_(state.m[a:b]), half.v32[:b - a].copy_(state.v[a:b])
        adamw(OptState(state.p[a:b], m32, v32), g[a:b], within(segments, a, b), opt, step_t)
        round_into(m32, state.m[a:b], half.noise(j, 0, lo + a, b - a))
        round_into(v32, state.v[a:b], half.noise(j, 1, lo + a, b - a))
