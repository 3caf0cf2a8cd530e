"""Fused stochastic-rounding encode (Triton, CUDA only): fp32 -> bf16 / fp16 in one pass.

The torch version in ``wire.py`` makes about seven passes over the block (noise, bit
arithmetic, finiteness mask, select, cast) and, running on the offload stream ahead of every
down-copy, it lengthened that stream by ~40% at opt-6.7b. Here each element is read once
(4 B) and written once (2 B). The noise is the same Philox word the torch path draws
(``philox.words`` under key (seed, SR_KEY)), so both give the same bits, except that the
kernel may flush fp32 subnormals (|x| < 1.2e-38) to zero.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from workbench.engine.kernels import load_compiled
from workbench.engine.rng.triton_philox import philox4x32

BLOCK = 1024


@triton.jit
def _round_lane(x_ptr, out_ptr, e, m, word, DROP: tl.constexpr):
    x = tl.load(x_ptr + e, mask=m)
    bits = x.to(tl.uint32, bitcast=True)
    keep = (bits + (word >> (32 - DROP))) & (0xFFFFFFFF ^ ((1 << DROP) - 1))
    finite = (bits & 0x7F800000) != 0x7F800000  # inf / NaN pass through unchanged
    y = tl.where(finite, keep.to(tl.float32, bitcast=True), x)
    tl.store(out_ptr + e, y.to(out_ptr.dtype.element_ty), mask=m)


# seed / key never specialised: Triton would turn a value of 1 into a constant (see zo/kernels.py)
@triton.jit(do_not_specialize=["seed", "key"])
def sr_kernel(x_ptr, out_ptr, n, q, seed, key, DROP: tl.constexpr, BLOCK: tl.constexpr):
    c = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    cm = c < q
    w0, w1, w2, w3 = philox4x32(seed, key, c)
    _round_lane(x_ptr, out_ptr, c, cm & (c < n), w0, DROP)
    _round_lane(x_ptr, out_ptr, c + q, cm & (c + q < n), w1, DROP)
    _round_lane(x_ptr, out_ptr, c + 2 * q, cm & (c + 2 * q < n), w2, DROP)
    _round_lane(x_ptr, out_ptr, c + 3 * q, cm & (c + 3 * q < n), w3, DROP)


def stochastic_round_into(x: torch.Tensor, out: torch.Tensor, seed: int, key: int) -> None:
    """Enqueue on the current stream: out (bf16 / fp16, (n,)) <- SR(x) (fp32, (n,))."""
    n = x.numel()
    q = (n + 3) // 4
    drop = 16 if out.dtype == torch.bfloat16 else 13
    sr_kernel[(triton.cdiv(q, BLOCK),)](x, out, n, q, seed, key, DROP=drop, BLOCK=BLOCK)


def warm(n: int, dtype: torch.dtype) -> None:
    """Compile and load, without launching, the kernel ``stochastic_round_into`` runs for n
    elements into ``dtype`` (bf16 / fp16); see ``zo/kernels.py::warm``."""
    q = (n + 3) // 4
    drop = 16 if dtype == torch.bfloat16 else 13
    load_compiled(sr_kernel.warmup(torch.float32, dtype, n, q, 0, 0, DROP=drop, BLOCK=BLOCK,
                                   grid=(1,)))
