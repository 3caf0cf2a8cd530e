"""Chunked head + cross-entropy equals the unchunked computation, and never builds R x T x V."""
import pytest
import torch

from workbench.models.adapter import BlockAdapter
from workbench.models.head_loss import chunk_rows, token_logprobs


@pytest.mark.parametrize("name", ["tiny-opt", "tiny-llama"])
def test_chunked_equals_unchunked_values_and_gradients(name, tiny_model):
    model = tiny_model(name)
    adapter = BlockAdapter(model)
    gen = torch.Generator().manual_seed(5)
    hidden = torch.randn(3, 11, 64, generator=gen)
    positions = torch.randperm(33, generator=gen)[:20]
    targets = torch.randint(0, 260, (20,), generator=gen)
    calls = []

    def head(h):
        calls.append(h.shape[0])
        return adapter.head(h)

    results = []
    for chunk in (10**6, 7, 3):
        model.zero_grad()
        h = hidden.clone().requires_grad_()
        lp = token_logprobs(h, positions, targets, head, chunk)
        lp.sum().backward()
        results.append((lp.detach(), h.grad, model.lm_head.weight.grad.clone()))
        assert max(calls) <= chunk
        calls.clear()
    ref = results[0]
    # an independent reference: the full (N, V) log-softmax
    with torch.no_grad():
        full = adapter.head(hidden.reshape(-1, 64)[positions]).float().log_softmax(-1)
    assert torch.allclose(ref[0], full[torch.arange(20), targets], atol=1e-6, rtol=0)
    for got in results[1:]:
        for a, b in zip(got, ref):
            assert torch.allclose(a, b, atol=1e-6, rtol=1e-6)
    model.zero_grad(set_to_none=True)


def test_chunk_rows_bounds_the_logits_bytes():
    assert chunk_rows(50272) * 50272 * 4 <= 1 << 28 < (chunk_rows(50272) + 1) * 50272 * 4
    assert chunk_rows(10**12) == 1
