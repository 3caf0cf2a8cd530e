"""The training loop, not only the engine's step, never makes the host wait for the GPU after
warm-up except where it bounds its run-ahead (an event's wait, which sync debug mode allows).

The engine's steps are checked alone in ``tests/engine/test_host_sync.py``; here the recipe's
own per-step work runs too (the batch's copy up, the losses' copy down, step timing, telemetry
and the sampler thread, run.json writes, the end-of-loop flush) under
``torch.cuda.set_sync_debug_mode("error")`` from step 3 on: a stream or device sync, an
``.item()`` or a pageable copy anywhere in it raises. A per-step sync would stop the host from
queueing the next step's first upload behind the last compute (issue 16)."""
from __future__ import annotations

import pytest
import torch

from workbench.config import RunConfig
from workbench.recipes.train import TrainRecipe

PRECISIONS = {"fp32": {}, "bf16-sr": {"amp": "bf16", "codec": "bf16", "master": "compressed-sr"}}


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["mezo", "zo-offload"])
@pytest.mark.parametrize("precision", list(PRECISIONS))
def test_the_training_loop_never_syncs_after_warmup(tmp_path, method, precision):
    extra = PRECISIONS[precision] if method == "zo-offload" else {
        k: v for k, v in PRECISIONS[precision].items() if k == "amp"}
    cfg = RunConfig(model="tiny-opt", method=method, device="cuda", data="synthetic",
                    batch_size=2, seq_len=16, steps=10, eval_samples=0, **extra)
    recipe = TrainRecipe(cfg, tmp_path / "run", progress=False)
    recipe.setup()
    recipe.dev_data = None  # evaluation reads metrics on the host by design
    batches = recipe.train_data.batch_for_step
    armed = []

    def batch_for_step(t, *args):
        if t == 3 and not armed:  # steps 0-2 warm the allocator, cuBLAS and the host caches
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            armed.append(t)
        return batches(t, *args)

    recipe.train_data.batch_for_step = batch_for_step
    try:
        rec = recipe.train()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    try:
        assert armed and rec.status == "done" and recipe.step == 10
        recipe.save(digest_params=False)
    finally:
        recipe.cleanup()
