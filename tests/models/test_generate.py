"""KV-free greedy decoding over the adapter's pieces equals the resident model's ``generate``."""
import pytest
import torch

from workbench.models.adapter import BlockAdapter
from workbench.models.generate import adapter_forward, greedy_decode


@pytest.mark.parametrize("name", ["tiny-opt", "tiny-llama"])
def test_greedy_decode_equals_hf_generate(name, tiny_model, hf_greedy):
    model = tiny_model(name)
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(4, 260, (n,), generator=gen).tolist() for n in (5, 9, 3, 7)]
    adapter = BlockAdapter(model)
    passes = []
    forward = adapter_forward(adapter)

    def counting_forward(ids, mask):
        passes.append(ids.shape)
        return forward(ids, mask)

    eos = model.config.eos_token_id
    ours = greedy_decode(counting_forward, adapter.head, prompts, 10, eos, 0)
    assert len(passes) == 10 and all(s[0] == 4 for s in passes)  # one pass per token, whole batch
    assert ours == hf_greedy(model, prompts, 10, eos)
    assert len({tuple(o) for o in ours}) == 4  # distinct continuations: not a constant


def test_decoding_stops_each_row_at_eos(tiny_model):
    model = tiny_model("tiny-opt")
    adapter = BlockAdapter(model)
    forward = adapter_forward(adapter)
    free = greedy_decode(forward, adapter.head, [[5, 6, 7], [9]], 6, None, 0)
    stop = free[0][-1]  # call row 0's last token the EOS
    out = greedy_decode(forward, adapter.head, [[5, 6, 7], [9]], 6, stop, 0)
    for row, full in zip(out, free):
        assert row == (full[:full.index(stop) + 1] if stop in full else full)
    assert sum(len(r) for r in out) < sum(len(r) for r in free) or free[0].index(stop) == 5
