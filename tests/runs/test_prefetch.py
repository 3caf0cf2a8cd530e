"""runs/prefetch.py and the copies around it: each step's batch is loaded once, in step
order, one step ahead; a batch moves whole (every field, tensor or not); on a GPU the
prefetched batch and the losses copied back on a side stream hold the right values even when
the side stream's copy is queued behind long work."""
from __future__ import annotations

import pytest
import torch

from workbench.data.batches import SyntheticData
from workbench.data.classify import ChoiceBatch
from workbench.engine.timing import Deferred
from workbench.runs.prefetch import BatchPrefetch


def _loader(calls: list[int]):
    data = SyntheticData(100, 8)

    def load(t: int):
        calls.append(t)
        batch = data.batch_for_step(t, 2, 0)
        return batch, batch.tokens

    return data, load


def test_each_step_is_loaded_once_one_step_ahead():
    calls: list[int] = []
    data, load = _loader(calls)
    batches = BatchPrefetch(torch.device("cpu"), load)
    batch, tokens = batches.get(0, ahead=True)
    assert calls == [0, 1]  # step 1's batch is on its way before step 0 runs
    assert torch.equal(batch.input_ids, data.batch_for_step(0, 2, 0).input_ids) and tokens == 16
    batch, _ = batches.get(1, ahead=False)  # the last step: nothing more is loaded
    assert calls == [0, 1] and torch.equal(batch.input_ids, data.batch_for_step(1, 2, 0).input_ids)
    batches.get(5, ahead=False)  # a step out of turn (a resumed run's first) is loaded then
    assert calls == [0, 1, 5]


def test_a_batch_moves_whole():
    ids = torch.tensor([[5, 6, 1], [7, 1, 1]])
    mask = (ids != 1).long()
    batch = ChoiceBatch(ids, mask, torch.tensor([0, 1]), torch.tensor([5, 6]),
                        torch.tensor([0, 1]), labels=torch.tensor([1]), k=2, mean_over=3.0)
    moved = batch.to("cpu")
    assert type(moved) is ChoiceBatch and moved.padded is True
    assert (moved.k, moved.mean_over) == (2, 3.0)
    assert len(moved.tensors()) == 6 and all(torch.equal(a, b) for a, b in
                                             zip(moved.tensors(), batch.tensors()))


@pytest.mark.gpu
def test_prefetched_batches_and_deferred_losses_hold_their_values_on_the_gpu():
    calls: list[int] = []
    data, load = _loader(calls)
    dev = torch.device("cuda")
    batches = BatchPrefetch(dev, load)
    big = torch.randn(4096, 4096, device=dev)
    for t in range(4):
        for _ in range(20):  # long work on the compute stream before each step reads its batch
            big = (big @ big).tanh()  # bounded: the values below stay finite
        batch, _ = batches.get(t, ahead=t < 3)
        want = data.batch_for_step(t, 2, 0)
        assert torch.equal(batch.input_ids.cpu(), want.input_ids)
        loss = (batch.input_ids.float().sum() + big[0, 0] * 0).reshape(())
        got = Deferred(loss, loss * 2).get()  # copied on the side stream after ``big``
        assert got == [float(want.input_ids.sum()), 2 * float(want.input_ids.sum())]
    assert calls == [0, 1, 2, 3]
