"""The training objective: what the engines minimise and what evaluation reads, in one place.

Every engine runs embed -> blocks -> head's input and hands the final hidden states (B, T, D)
and the block context to the objective; the objective runs the head. A new loss (an LM or
completion loss over every position, say) is a new class here and a case in ``objective_for``:
no engine changes.
"""
from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

from workbench.config import RunConfig
from workbench.data.batches import Batch
from workbench.engine.zo_common import autocast
from workbench.models.adapter import BlockAdapter, BlockContext


def label_loss(logits_last: torch.Tensor, batch: Batch) -> torch.Tensor:
    """Cross-entropy over the two label words' logits; logits_last (B, V) -> 0-d float32."""
    return F.cross_entropy(logits_last[:, batch.label_ids].float(), batch.labels)


class Objective(Protocol):
    def loss(self, adapter: BlockAdapter, hidden: torch.Tensor, ctx: BlockContext,
             batch: Batch) -> torch.Tensor:
        """The training loss, a 0-d fp32 device tensor."""

    def logits(self, adapter: BlockAdapter, hidden: torch.Tensor, ctx: BlockContext,
               batch: Batch) -> torch.Tensor:
        """(B, 2) fp32 label-word logits that evaluation scores."""


class LabelWords:
    """Prompt classification: cross-entropy over the two label words' logits at each prompt's
    last real token (MeZO's SST-2 setting)."""

    def loss(self, adapter: BlockAdapter, hidden: torch.Tensor, ctx: BlockContext,
             batch: Batch) -> torch.Tensor:
        return label_loss(adapter.head(hidden, ctx), batch)

    def logits(self, adapter: BlockAdapter, hidden: torch.Tensor, ctx: BlockContext,
               batch: Batch) -> torch.Tensor:
        return adapter.head(hidden, ctx)[:, batch.label_ids].float()


def objective_for(cfg: RunConfig) -> Objective:
    """The run's objective (label words is the only one so far; a config knob picks here)."""
    return LabelWords()


@torch.no_grad()
def predict_on_device(adapter: BlockAdapter, objective: Objective, batch: Batch,
                      device: torch.device, amp: str) -> torch.Tensor:
    """``objective.logits`` with every weight already bound on the device (one forward)."""
    with autocast(device, amp):
        hidden, ctx = adapter.embed(batch)
        for block in adapter.blocks:
            hidden = adapter.run_block(block, hidden, ctx)
        return objective.logits(adapter, hidden, ctx, batch)
