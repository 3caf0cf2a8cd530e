"""One rank's slice of a global batch (data parallel), for every kind of batch; and its share of
the dev set (``DevShare``: the eval's sums are all-reduced, ``data/objectives.py``).

The ranks average their shard losses with one all-reduce. For a loss that is a mean over
examples (classify) equal slices of examples make that average the global loss. A token loss is
a mean over tokens, and the slices hold different numbers of tokens: each shard's loss is divided
by the global token count / world instead of its own (``TokenBatch.mean_over``), so the average
over ranks is again the mean over all of the batch's tokens.
"""
from __future__ import annotations

from dataclasses import replace

from workbench.data.batches import Batch
from workbench.data.classify import ChoiceBatch
from workbench.data.sequences import TokenBatch


def shard(batch: Batch | TokenBatch, rank: int, world: int) -> Batch | TokenBatch:
    """Rank ``rank``'s examples of ``batch`` (CPU tensors; the example count divides by
    ``world``): rows, and for a token batch its scored positions, rebased to the slice."""
    if isinstance(batch, Batch):
        per = len(batch.labels) // world
        lo, hi = rank * per, (rank + 1) * per
        return Batch(batch.input_ids[lo:hi], batch.attention_mask[lo:hi], batch.labels[lo:hi],
                     batch.label_ids)
    k = batch.k if isinstance(batch, ChoiceBatch) else 1  # rows per example
    examples = batch.input_ids.shape[0] // k
    per = examples // world
    lo, hi = rank * per * k, (rank + 1) * per * k
    keep = (batch.rows >= lo) & (batch.rows < hi)
    width = batch.input_ids.shape[1]
    fields = dict(input_ids=batch.input_ids[lo:hi], attention_mask=batch.attention_mask[lo:hi],
                  positions=batch.positions[keep] - lo * width, target_ids=batch.target_ids[keep],
                  rows=batch.rows[keep] - lo, padded=None)
    if isinstance(batch, ChoiceBatch):
        return replace(batch, **fields, labels=batch.labels[rank * per:(rank + 1) * per])
    return replace(batch, **fields, mean_over=batch.target_ids.numel() / world)


class DevShare:
    """One rank's share of a dev set under data parallel: examples ``[lo, hi)``, contiguous.

    ``world`` shares of n examples differ by one example at most when n does not divide (a rank
    may have none when n < world: it still takes part in the eval's all-reduce). The objective's
    ``evaluate`` reads ``eval_batches`` and, for completion data, ``prompts`` and ``references``;
    each is the share's slice of the whole set's."""

    def __init__(self, dev, rank: int, world: int):
        n = len(dev)
        self.dev, self.lo, self.hi = dev, rank * n // world, (rank + 1) * n // world

    def __len__(self) -> int:
        return self.hi - self.lo

    def eval_batches(self, batch_size: int):
        return self.dev.eval_batches(batch_size, self.lo, self.hi)

    @property
    def prompts(self) -> list[list[int]]:
        return self.dev.prompts[self.lo:self.hi]

    @property
    def references(self) -> list[str]:
        return self.dev.references[self.lo:self.hi]
