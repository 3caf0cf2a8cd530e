"""The chain kernel's span mode (a streamed embedding's rows under compute-dtype slots), run by
Triton's CPU interpreter: each row equals the whole-group fill's value for its elements, bit
for bit, and the kernel lowers to PTX for sm_90 without a GPU."""
import importlib.util

import pytest

from zo_helpers import run_under_triton_interpreter

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="triton not installed")

SCRIPT = r"""
import torch
from workbench.engine.codecs.frozen_form import FrozenForm
from workbench.engine.groups import Entry, GroupLayout
from workbench.engine.zo import chain_kernel
from workbench.engine.zo.chain import ChainRunner
from workbench.engine.zo.perturb import PendingUpdate, ZOOps
from workbench.engine.zo.step import shift

V, D, P = 37, 24, 10  # token table V x D, then a P-element tail (a norm) past the prefix
n = V * D + P  # 898: not a multiple of 4, lanes cross rows
lay = GroupLayout("embed", [Entry("tok", (), (V, D), 0, V * D), Entry("norm", (), (P,), V * D, P)],
                  n, V * D)
ops = ZOOps("philox", torch.device("cpu"))
runner = ChainRunner(ops, "bf16", True, torch.bfloat16)
runner.kernel = chain_kernel  # the interpreter runs it on CPU tensors
master = (torch.randn(n, generator=torch.Generator().manual_seed(1)) * 0.02).to(torch.bfloat16)
upd = PendingUpdate(11, torch.tensor([0.7, -1.3]), 1e-3, 0.1)
chain = [("update", upd), ("perturb", 5, 1e-3), ("perturb", 5, -2e-3),
         ("update", shift(ops, 5, 1e-3))]
whole = FrozenForm(lay, torch.float32)  # the FORM mode, every element written in fp32
ids = torch.tensor([[3, 36, 0, 3], [17, 17, 5, 1]])
for k in range(len(chain) + 1):
    buf = whole.empty("cpu")
    runner.fill_form(master, lay, chain[:k], whole, buf)
    want = whole.to_fp32(buf)
    rows = torch.empty(ids.numel() * D)
    tail = torch.empty(P)
    runner.fill_spans(master, lay, chain[:k], [
        (ids.reshape(-1) * D, D, rows), (torch.tensor([V * D]), P, tail)])
    assert torch.equal(rows.view(-1, D), want[:V * D].view(V, D)[ids.reshape(-1)]), k
    assert torch.equal(tail, want[V * D:]), k
print("ok")
"""


def test_span_fill_equals_the_whole_group_fill_under_interpreter():
    run_under_triton_interpreter(SCRIPT)


def test_span_kernel_compiles_for_hopper():
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    import triton

    from workbench.engine.zo import chain_kernel as k

    sig = {"w_ptr": "*bf16", "out_ptr": "*fp32", "starts_ptr": "*i64", "g_ptr": "*fp32",
           "g_seed": "*i64", "g_start": "*i64", "op_a": "*fp32", "op_wd": "*fp32",
           "op_g": "*i32", "q": "i32", "length": "i32", "per_span": "i32", "n_decay": "i32",
           "gid": "i32", "n_groups": "i32", "BLOCK": "constexpr"}
    ptx = triton.compile(ASTSource(fn=k.span_kernel, signature=sig, constexprs={"BLOCK": k.BLOCK}),
                         target=GPUTarget("cuda", 90, 32)).asm["ptx"]
    assert "mul.hi.u32" in ptx
