"""The planner counts what Rademacher directions cost (``directions=rademacher``): on CUDA the
fused kernel, which draws normals inside, is left for torch ops on a materialised z (the
kernel's normals, signed in place), so each perturbation and update holds z (4 B per element
of its group) and runs at torch's rate; off CUDA z is materialised either way."""
import pytest

from workbench.config import RunConfig
from workbench.plan.planner import plan
from workbench.presets import PRESETS


def _cfg(**kw) -> RunConfig:
    return RunConfig(**{**dict(device="cuda", data="synthetic", batch_size=16, seq_len=128,
                               model="opt-1.3b", queries=4, estimator="one-sided"), **kw})


@pytest.mark.parametrize("method", ["mezo", "zo-offload"])
def test_rademacher_directions_materialise_z_and_run_at_torchs_rate(method):
    nb = PRESETS["opt-1.3b"].block_params()
    gauss = plan(_cfg(method=method), gpu="h200")
    signs = plan(_cfg(method=method, directions="rademacher"), gpu="h200")
    extra = signs.gpu_breakdown["activations"] - gauss.gpu_breakdown["activations"]
    assert extra >= 4 * nb  # z of (at least) one block beside the forward's activations
    assert signs.step_seconds > gauss.step_seconds
    assert signs.pcie_bytes_per_step == gauss.pcie_bytes_per_step  # z never travels
    on_cpu = [plan(_cfg(method=method, device="cpu", directions=d), gpu="h200")
              for d in ("gaussian", "rademacher")]
    assert on_cpu[0].gpu_breakdown == on_cpu[1].gpu_breakdown
