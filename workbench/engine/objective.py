"""The objective as the engines see it: the one place between every engine and ``data/objectives``.

What a batch's loss is and what evaluation measures is data (``data/objectives.py``: classify,
completion, lm; built with the task by ``data/task.py``). An engine runs embed -> blocks and hands
the final hidden states (B, T, D) here; the objective runs the head, chunked where it scores many
positions. For evaluation an engine hands over its ``Forward`` (input ids and mask -> final hidden
states with the current weights: every block resident, or streamed through the GPU), and the
objective runs its metrics, greedy decoding included, through it. A new objective is a class in
``data/objectives.py`` and a case in ``data/task.py::make_objective``: no engine changes.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from workbench.config import RunConfig
from workbench.data.batches import Batch
from workbench.data.objectives import Objective, Total
from workbench.data.task import make_objective
from workbench.engine.precision import autocast
from workbench.models.adapter import BlockAdapter
from workbench.models.generate import Forward, adapter_forward
from workbench.models.head_loss import Head

__all__ = ["Objective", "Total", "evaluate", "head_loss", "label_loss", "objective_for"]


def label_loss(logits_last: torch.Tensor, batch: Batch) -> torch.Tensor:
    """Cross-entropy over the label words' logits; logits_last (B, V) -> 0-d float32 (the
    classify loss of one-token label words, as an independent reference for tests)."""
    return F.cross_entropy(logits_last[:, batch.label_ids].float(), batch.labels)


def objective_for(cfg: RunConfig, vocab: int) -> Objective:
    """The run's objective without a tokenizer: enough to train (the loss reads only token ids);
    the recipe hands the engine the task's own objective, which also decodes for evaluation."""
    return make_objective(cfg, None, vocab)


def head_loss(objective: Objective, adapter: BlockAdapter, hidden: torch.Tensor,
              batch) -> torch.Tensor:
    """The training loss (0-d float32 device tensor) from the final hidden states (B, T, D), with
    the head weights bound now (a ZO engine's +eps or -eps copy, a dual tensor, a leaf)."""
    return objective.loss(hidden, batch, adapter.head)


@torch.no_grad()
def evaluate(objective: Objective, adapter: BlockAdapter, dev, device: torch.device, amp: str,
             batch_size: int, forward: Forward | None = None,
             total: Total | None = None, head: Head | None = None) -> dict[str, float]:
    """The objective's metrics over every example of ``dev`` with the current weights;
    ``forward``: how the engine runs the blocks (default: all resident on ``device``);
    ``total``: data parallel's sum over ranks (``dev`` is then this rank's share); ``head``:
    how it runs the head (default ``adapter.head``: resident)."""
    with autocast(device, amp):
        return objective.evaluate(dev, forward or adapter_forward(adapter), head or adapter.head,
                                  device, batch_size, total)
