"""The fused stochastic-rounding kernel, run by Triton's CPU interpreter and compiled for sm_90."""
import importlib.util

import pytest

from zo_helpers import run_under_triton_interpreter

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="triton not installed")

SCRIPT = r"""
import torch
from workbench.engine.codecs import sr_kernel as codec_kernels
from workbench.engine.codecs.wire import SR_KEY, stochastic_round

n = 10_003  # not a multiple of 4: the last counter's lanes are partly masked
x = torch.randn(n, generator=torch.Generator().manual_seed(0)) * 0.02
x[:4] = torch.tensor([float("inf"), float("-inf"), float("nan"), 0.0])
x[4:6] = torch.tensor([3.0e38, -3.0e38])  # near the top of the range
# (subnormal inputs are left out: the kernel may flush them to zero, the torch path does not)
for dtype in (torch.bfloat16, torch.float16):
    for seed in (1, 2, 12345):  # 1: the value Triton would specialise into a constant
        out = torch.empty(n, dtype=dtype)
        codec_kernels.stochastic_round_into(x, out, seed, SR_KEY)
        ref = stochastic_round(x, dtype, seed)
        same = (out.view(torch.int16) == ref.view(torch.int16)) | (out.isnan() & ref.isnan())
        assert same.all(), (dtype, seed, (~same).nonzero()[:5])
print("ok")
"""


def test_sr_kernel_equals_torch_path_under_interpreter():
    run_under_triton_interpreter(SCRIPT)


@pytest.mark.parametrize("out_type, drop", [("*bf16", 16), ("*fp16", 13)])
def test_sr_kernel_compiles_for_hopper(out_type, drop):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from workbench.engine.codecs import sr_kernel as k

    sig = {"x_ptr": "*fp32", "out_ptr": out_type, "n": "i32", "q": "i32", "seed": "i32",
           "key": "i32", "DROP": "constexpr", "BLOCK": "constexpr"}
    ptx = triton.compile(ASTSource(fn=k.sr_kernel, signature=sig,
                                   constexprs={"DROP": drop, "BLOCK": k.BLOCK}),
                         target=GPUTarget("cuda", 90, 32)).asm["ptx"]
    assert "mul.hi.u32" in ptx and "cvt" in ptx
