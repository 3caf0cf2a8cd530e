"""The fused Triton kernel, run by Triton's CPU interpreter (no GPU needed)."""
import importlib.util

import pytest

from zo_helpers import run_under_triton_interpreter

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="triton not installed")

SCRIPT = r"""
import torch
from workbench.engine.groups import GroupLayout
from workbench.engine.rng import philox
from workbench.engine.zo import kernels as zo_kernels
from workbench.engine.zo.perturb import PendingUpdate, ZOOps

n = 10_001  # not a multiple of 4: the last counter's lanes are partly masked
z = zo_kernels.normals(n, 12345, 678, "cpu")
# same integers: a different counter or key gives different normals (differences of order 1);
# the interpreter's numpy log / cos may differ from torch's by a few ulp (seen: > 2e-6 once in a
# full run, its SIMD path depends on the arrays' alignment), so the bound is far above that
assert (z - philox.normals(n, 12345, 678, "cpu")).abs().max() < 1e-4

fused = ZOOps("philox", torch.device("cpu"))
fused.kernels = zo_kernels  # the interpreter runs the kernel on CPU tensors
plain = ZOOps("philox", torch.device("cpu"))
lay = GroupLayout("block.3", [], n, n - 100)
w = torch.randn(n, generator=torch.Generator().manual_seed(0)) * 0.02
upd = PendingUpdate(77, torch.tensor(0.37), 1e-3, 0.1)
a, b, out = w.clone(), w.clone(), torch.empty_like(w)
fused.update(a, lay, upd)
fused.perturb(a, lay, 99, 1e-3)
fused.update_perturb(b, lay, upd, 99, 1e-3)
assert torch.equal(a, b), "one fused pass must equal the two separate passes bit for bit"
c = w.clone()
fused.update_perturb(c, lay, upd, 99, 1e-3, out=out)
w2 = w.clone()
fused.update(w2, lay, upd)
assert torch.equal(c, w2) and torch.equal(out, a), "tied form: x updated, out perturbed"
d = w.clone()
plain.update(d, lay, upd)
plain.perturb(d, lay, 99, 1e-3)
assert (d - a).abs().max() < 1e-7, "kernel and torch path agree"
assert not torch.equal(a, w)

# several queries: the pending update's q parts (q - 1 passes, the last fused with the first
# perturbation) and each restore fused with the next query's perturbation (step.shift) round
# exactly as the separate passes do
from workbench.engine.zo.step import ZOStep, zo_passes
multi = PendingUpdate(77, torch.tensor([0.37, -0.2, 0.05]), 1e-3, 0.1)
for estimator in ("central", "one-sided"):
    st = ZOStep(99, 1e-3, multi, queries=3, estimator=estimator)
    x, states = w.clone(), []
    for k in zo_passes(fused, x, lay, st):
        states.append(x.clone())
    states.append(x.clone())
    y, ref = w.clone(), []
    fused.update(y, lay, multi)
    seeds = st.seeds
    if estimator == "one-sided":
        ref.append(y.clone())
    for s in seeds:
        fused.perturb(y, lay, s, 1e-3)
        ref.append(y.clone())
        if estimator == "central":
            fused.perturb(y, lay, s, -2e-3)
            ref.append(y.clone())
            fused.perturb(y, lay, s, 1e-3)
        else:
            fused.perturb(y, lay, s, -1e-3)
    ref.append(y.clone())
    assert len(states) == len(ref) == st.passes + 1
    assert all(torch.equal(p, r) for p, r in zip(states, ref)), estimator
print("ok")
"""


def test_fused_kernel_under_interpreter():
    run_under_triton_interpreter(SCRIPT)


@pytest.mark.parametrize("update, perturb, write_x", [(False, True, False), (True, False, True),
                                                      (True, True, False), (True, True, True)])
def test_fused_kernel_compiles_for_hopper(update, perturb, write_x):
    """Lower the kernel to PTX for sm_90 without a GPU: catches what the interpreter allows
    but the compiler refuses."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from workbench.engine.zo import kernels as k

    sig = {"x_ptr": "*fp32", "out_ptr": "*fp32", "g_ptr": "*fp32", "n": "i32", "q": "i32",
           "n_decay": "i32", "seed": "i32", "prev_seed": "i32", "gid": "i32", "scale": "fp32",
           "neg_lr": "fp32", "wd": "fp32", "DO_UPDATE": "constexpr", "DO_PERTURB": "constexpr",
           "WRITE_X": "constexpr", "BLOCK": "constexpr"}
    consts = {"DO_UPDATE": update, "DO_PERTURB": perturb, "WRITE_X": write_x, "BLOCK": k.BLOCK}
    ptx = triton.compile(ASTSource(fn=k.zo_kernel, signature=sig, constexprs=consts),
                         target=GPUTarget("cuda", 90, 32)).asm["ptx"]
    assert "mul.hi.u32" in ptx  # Philox's multiply-high made it through
