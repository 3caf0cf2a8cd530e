"""Training objectives: what a batch's loss is, and how a model is evaluated on dev data.

Engine integration (the engines call only these; nothing here knows an engine)
- Build once: ``task = build_task(cfg, tok, vocab)`` (``data/task.py``) gives ``task.objective``,
  ``task.train`` (``batch_for_step(step, batch_size, seed)``) and ``task.dev`` (or None).
- Loss, at the head of every forward pass (training, +eps / -eps, fo backward):
  ``objective.loss(hidden, batch, head)`` -> 0-d float32 tensor, no host sync.
  ``hidden`` is the last block's output (R, T, D), before any head module; ``head`` maps hidden
  states (n, D) -> logits (n, V) with the weights of this pass (``BlockAdapter.head`` without a
  ctx, after binding the head group; a tied head must see the embedding it is tied to). The loss
  never builds R x T x V logits: token losses run the head ``chunk`` positions at a time
  (``models/head_loss.py``), and with autograd each chunk is recomputed in backward.
- Eval: ``objective.evaluate(task.dev, forward, head, device, batch_size, total)`` -> dict of
  floats (``metric_names``). ``forward(input_ids, attention_mask)`` -> final hidden states
  (R, T, D) with the current weights (a streaming engine streams its blocks inside it;
  ``adapter_forward`` is the resident version). Completion eval also decodes greedily through the
  same ``forward``. Every metric is a ratio of sums (token losses and token count, correct or
  matched answers and example count); under data parallel ``dev`` is one rank's share
  (``data/shard.py::DevShare``) and ``total`` sums those sums over ranks before the ratios, so
  the metrics are the whole dev set's, token-weighted (never a mean of the ranks' means).
- Decoding alone: ``models/generate.py::greedy_decode(forward, head, prompts, max_new_tokens,
  eos_id, pad_id, device)``: one ``forward`` over the whole batch per new token (no KV cache).
- Batches: classify gives ``Batch`` (every label word one token: logits at the last position,
  bit-identical to ``engine/objective.py::label_loss``) or ``ChoiceBatch``; completion and lm give
  ``TokenBatch``. All have ``.to(device)`` and ``.tokens``. Data parallel must split a
  ``TokenBatch`` by rows and rebase ``positions`` / ``rows`` (and mean token losses over all ranks'
  tokens, not per rank, to equal the single-process loss).
"""
from __future__ import annotations

import math
from typing import Callable, Iterable, Protocol

import torch
import torch.nn.functional as F

from workbench.data.answers import exact_match, token_f1
from workbench.data.batches import Batch
from workbench.data.classify import ChoiceBatch
from workbench.data.sequences import CompletionData, TokenBatch
from workbench.models.generate import Forward, greedy_decode
from workbench.models.head_loss import Head, token_logprobs

#: Sums each of a list of floats over the data-parallel ranks (every rank calls it, once per eval).
Total = Callable[[list[float]], list[float]]


class Objective(Protocol):
    name: str
    metric_names: tuple[str, ...]

    def loss(self, hidden: torch.Tensor, batch, head: Head) -> torch.Tensor:
        """0-d float32 training loss of ``batch`` from the final hidden states (R, T, D)."""

    def evaluate(self, dev, forward: Forward, head: Head, device: torch.device | str,
                 batch_size: int, total: Total | None = None) -> dict[str, float]:
        """Metrics over every dev example with the current weights; with ``total``, ``dev`` is
        this rank's share and the metrics are of every rank's examples."""


def _summed(total: Total | None, sums: list[float]) -> list[float]:
    """``sums`` over every rank (data parallel: one all-reduce), else as they are."""
    return total(sums) if total is not None else sums


def row_sums(values: torch.Tensor, rows: torch.Tensor, n_rows: int) -> torch.Tensor:
    """(n_rows,) sums of ``values`` (P,) by their ``rows`` (P,) ids, in the same order on every run.

    ``index_add`` would be shorter, but on CUDA it adds with atomics in whatever order the
    threads arrive: the last bits of a row's sum, and so MeZO's projected gradient, changed from
    run to run (two identical tiny-opt runs on an H100 ended with different digests). Here each
    value is written to its own cell of a (n_rows, P) zero matrix (no two writes share a cell)
    and each row is reduced in a fixed order. On the CPU ``index_add`` adds in index order, one
    thread, so it stays: every CPU run keeps the sums, and the trajectory, it had."""
    if values.device.type == "cpu":
        return values.new_zeros(n_rows).index_add(0, rows, values)
    return cell_sums(values, rows, n_rows)


def cell_sums(values: torch.Tensor, rows: torch.Tensor, n_rows: int) -> torch.Tensor:
    """``row_sums`` off the CPU: each value in its own cell of a (n_rows, P) zero matrix, each
    row then reduced in a fixed order."""
    cells = values.new_zeros((n_rows, values.shape[0]))
    cells[rows, torch.arange(values.shape[0], device=values.device)] = values
    return cells.sum(dim=1)


class Classify:
    """Cross-entropy over the k candidates' scores; eval: accuracy and that loss."""

    name = "classify"
    metric_names = ("accuracy", "loss")

    def __init__(self, chunk: int = 1024):
        self.chunk = chunk

    def scores(self, hidden: torch.Tensor, batch: Batch | ChoiceBatch, head: Head) -> torch.Tensor:
        """(B, k) float32: label-word logits at the last position (``Batch``), or each
        candidate's summed token log-probabilities (``ChoiceBatch``)."""
        if isinstance(batch, Batch):
            last = batch.attention_mask.sum(dim=1) - 1
            logits = head(hidden[torch.arange(hidden.shape[0], device=hidden.device), last])
            return logits[:, batch.label_ids].float()
        lp = token_logprobs(hidden, batch.positions, batch.target_ids, head, self.chunk)
        return row_sums(lp, batch.rows, batch.input_ids.shape[0]).view(-1, batch.k)

    def loss(self, hidden: torch.Tensor, batch: Batch | ChoiceBatch, head: Head) -> torch.Tensor:
        return F.cross_entropy(self.scores(hidden, batch, head), batch.labels)

    @torch.no_grad()
    def evaluate(self, dev, forward: Forward, head: Head, device, batch_size: int,
                 total: Total | None = None) -> dict[str, float]:
        correct = count = 0
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        for batch in dev.eval_batches(batch_size):
            batch = batch.to(device)
            scores = self.scores(forward(batch.input_ids, batch.attention_mask), batch, head)
            loss_sum += F.cross_entropy(scores, batch.labels, reduction="sum")
            correct += int((scores.argmax(-1) == batch.labels).sum())
            count += len(batch.labels)
        correct, loss, count = _summed(total, [correct, float(loss_sum), count])
        return {"accuracy": correct / max(count, 1), "loss": loss / max(count, 1)}


class LM:
    """Causal-LM loss: mean negative log-likelihood of the scored tokens (``lm``: every token
    of the packed text); eval: that loss over all dev tokens, and its perplexity."""

    name = "lm"
    metric_names = ("loss", "perplexity")

    def __init__(self, chunk: int = 1024):
        self.chunk = chunk

    def loss(self, hidden: torch.Tensor, batch: TokenBatch, head: Head) -> torch.Tensor:
        lp = token_logprobs(hidden, batch.positions, batch.target_ids, head, self.chunk)
        return -(lp.sum() / batch.mean_over if batch.mean_over else lp.mean())

    def _nll(self, dev, forward: Forward, head: Head, device, batch_size: int) -> list[float]:
        """[summed negative log-likelihood of the scored tokens, their count] over ``dev``."""
        nll = torch.zeros((), dtype=torch.float64, device=device)
        count = 0
        for batch in dev.eval_batches(batch_size):
            count += batch.scored
            batch = batch.to(device)
            hidden = forward(batch.input_ids, batch.attention_mask)
            nll -= token_logprobs(hidden, batch.positions, batch.target_ids, head, self.chunk).sum()
        return [float(nll), count]

    @staticmethod
    def _loss(nll: float, count: float) -> dict[str, float]:
        """Mean token loss and its perplexity from the (summed) NLL and token count."""
        loss = nll / max(count, 1)
        return {"loss": loss, "perplexity": math.exp(min(loss, 700.0))}

    @torch.no_grad()
    def evaluate(self, dev, forward: Forward, head: Head, device, batch_size: int,
                 total: Total | None = None) -> dict[str, float]:
        return self._loss(*_summed(total, self._nll(dev, forward, head, device, batch_size)))


class Completion(LM):
    """The loss covers the completion's tokens (and its EOS) only; eval adds exact match and
    token F1 of greedy decoding (``max_new_tokens``) against the reference completion."""

    name = "completion"
    metric_names = ("loss", "perplexity", "exact_match", "token_f1")

    def __init__(self, tok, max_new_tokens: int, chunk: int = 1024):
        super().__init__(chunk)
        self.tok, self.max_new_tokens = tok, max_new_tokens

    @torch.no_grad()
    def evaluate(self, dev: CompletionData, forward: Forward, head: Head, device,
                 batch_size: int, total: Total | None = None) -> dict[str, float]:
        sums = self._nll(dev, forward, head, device, batch_size)
        answers = self.decode(dev.prompts, forward, head, device, batch_size)
        em = [exact_match(a, r) for a, r in zip(answers, dev.references)]
        f1 = [token_f1(a, r) for a, r in zip(answers, dev.references)]
        nll, count, em, f1, n = _summed(total, [*sums, sum(em), sum(f1), len(answers)])
        return {**self._loss(nll, count), "exact_match": em / max(n, 1),
                "token_f1": f1 / max(n, 1)}

    def decode(self, prompts: Iterable[list[int]], forward: Forward, head: Head, device,
               batch_size: int) -> list[str]:
        """Greedy answers as text (stopped at EOS, which is left out)."""
        if self.tok is None:
            raise ValueError("completion: decoding needs the task's tokenizer (build the "
                             "objective with data/task.py::build_task)")
        prompts, texts = list(prompts), []
        for start in range(0, len(prompts), batch_size):
            new = greedy_decode(forward, head, prompts[start:start + batch_size],
                                self.max_new_tokens, self.tok.eos_id, self.tok.pad_id, device)
            texts += [self.tok.decode(t[:-1] if t and t[-1] == self.tok.eos_id else t) for t in new]
        return texts
