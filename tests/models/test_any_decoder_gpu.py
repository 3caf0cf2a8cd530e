"""The representative layouts on CUDA: zo-offload's digest and losses equal MeZO's (fp32 and
bf16 autocast, synthetic batches; SDPA, the per-block-type masks, latent attention, experts and
state-space scans on the GPU), and a padded batch's piecewise logits equal the model's own."""
import sys
from pathlib import Path

import pytest
import torch

from workbench.config import RunConfig
from workbench.models.adapter import BlockAdapter
from workbench.models.build import build_skeleton

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from zo_helpers import train  # noqa: E402

from test_any_decoder import REPRESENTATIVE, _materialised  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("amp", ["off", "bf16"])
@pytest.mark.parametrize("model_type", REPRESENTATIVE)
def test_zo_offload_equals_mezo_on_cuda(model_type, amp):
    cfg = RunConfig(model=f"tiny:{model_type}", method="mezo", device="cuda", amp=amp, lr=5e-3,
                    weight_decay=0.1)
    _, ref_digest, ref_losses = train(cfg, steps=3)
    _, digest, losses = train(cfg.replace(method="zo-offload", prefetch_depth=2), steps=3)
    assert (digest, losses) == (ref_digest, ref_losses)


@pytest.mark.parametrize("model_type", REPRESENTATIVE)
def test_piecewise_forward_equals_the_models_own_on_cuda(model_type):
    model = _materialised(f"tiny:{model_type}").cuda()
    ids = torch.randint(4, 260, (3, 17), generator=torch.Generator().manual_seed(1)).cuda()
    mask = torch.ones_like(ids)
    mask[1, 11:] = 0
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        out = BlockAdapter(model).forward(ids, mask)
    real = mask.bool()
    assert torch.allclose(out[real], ref[real], atol=1e-4, rtol=0), model_type
