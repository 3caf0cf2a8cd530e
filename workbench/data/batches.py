"""MeZO's prompt format and deterministic batches.

Each example becomes ``"<sentence> It was"`` and is scored by the logits of the two label words
(" terrible" / " great") at its last token: the training loss is cross-entropy over those two
logits, eval accuracy their argmax. The batch of step t is a pure function of (seed, t), so a
resumed run sees exactly the batches a straight run would.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, fields
from typing import TypeVar

import torch

from workbench.data.sources import Example
from workbench.models.tokenizer import Tokenizer

TEMPLATE = "{sentence} It was"
LABEL_WORDS = (" terrible", " great")
T = TypeVar("T")


class PaddedRows:
    """What every batch of right-padded rows knows of itself: ``padded`` read from the mask
    while it is on the CPU, and its real token count. Needs ``attention_mask`` (R, T) and a
    ``padded`` field."""

    attention_mask: torch.Tensor
    padded: bool | None

    def __post_init__(self) -> None:
        if self.padded is None and self.attention_mask.device.type == "cpu":
            self.padded = bool((self.attention_mask == 0).any())

    @property
    def tokens(self) -> int:
        """Real (non-pad) tokens in the batch (call before moving it to a GPU)."""
        return int(self.attention_mask.sum())

    def to(self, device: torch.device | str, stream: "torch.cuda.Stream | None" = None):
        """The batch (a dataclass of this mixin) on ``device``. To a GPU every tensor goes
        through pinned memory, so the copies queue behind the GPU's work instead of the host
        waiting for it (a copy from pageable memory blocks the host); on ``stream`` when given
        (the caller orders its own stream after that one: ``runs/prefetch.py``)."""
        cuda = torch.device(device).type == "cuda"
        place = torch.cuda.stream(stream) if cuda and stream is not None else nullcontext()
        with place:
            moved = {f.name: _moved(getattr(self, f.name), device, cuda) for f in fields(self)}
        return type(self)(**moved)

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor field."""
        return [v for f in fields(self) if isinstance(v := getattr(self, f.name), torch.Tensor)]


def _moved(value, device: torch.device | str, cuda: bool):
    if not isinstance(value, torch.Tensor):
        return value
    if cuda and value.is_cpu:
        return value.pin_memory().to(device, non_blocking=True)
    return value.to(device)


@dataclass
class Batch(PaddedRows):
    """Right-padded prompts. Shapes: ids / mask (B, T); labels (B,); label_ids (2,).
    ``padded``: whether any row is shorter than T, known on the host (read from the mask while
    it is on the CPU, then carried along), so the model never reads the mask back from the GPU
    to decide which attention kernel to use."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor
    label_ids: torch.Tensor
    padded: bool | None = None


def label_token_ids(tok: Tokenizer) -> tuple[list[int], list[int]]:
    """(shared prefix, [id of word 0, id of word 1]).

    With BPE the words are single tokens and the prefix is empty; with the byte tokenizer
    " terrible" and " great" share the space, which then belongs to the prompt.
    """
    a, b = (tok.encode_plain(w) for w in LABEL_WORDS)
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    if k >= min(len(a), len(b)):
        raise ValueError("data: the tokenizer cannot tell the label words apart")
    return a[:k], [a[k], b[k]]


class Lazy(Sequence[T]):
    """``make(i)`` for i in ``range(n)``, each made when first read and kept: a split is
    tokenised in the order its batches are drawn, so a short run over a large file touches
    only the rows it trains on (a million-row file no longer waits for every row)."""

    def __init__(self, n: int, make: Callable[[int], T]):
        self._n, self._make, self._made = n, make, {}

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(self._n))]
        if not -self._n <= i < self._n:
            raise IndexError(i)
        i %= self._n
        if i not in self._made:
            self._made[i] = self._make(i)
        return self._made[i]


class StepData:
    """Deterministic batches over ``len(self)`` items that ``collate`` turns into a batch."""

    def __len__(self) -> int:
        raise NotImplementedError

    def collate(self, idx: list[int]):
        raise NotImplementedError

    def batch_for_step(self, step: int, batch_size: int, seed: int):
        """Items ``[step*B, (step+1)*B)`` of the epoch-wise shuffled order."""
        return self.collate(step_indices(len(self), step, batch_size, seed))

    def eval_batches(self, batch_size: int, lo: int = 0, hi: int | None = None):
        """Every item of ``[lo, hi)`` (default: all) once, in order."""
        hi = len(self) if hi is None else hi
        for start in range(lo, hi, batch_size):
            yield self.collate(list(range(start, min(start + batch_size, hi))))


def step_indices(n: int, step: int, batch_size: int, seed: int) -> list[int]:
    """Indices of positions ``[step*B, (step+1)*B)`` in the concatenation of per-epoch
    permutations of ``range(n)`` (epoch e shuffled by (seed, e)): a pure function of its args."""
    idx = []
    for pos in range(step * batch_size, (step + 1) * batch_size):
        epoch, k = divmod(pos, n)
        idx.append(int(_permutation(n, seed, epoch)[k]))
    return idx


class PromptDataset(StepData):
    """Tokenised prompts of one split, truncated from the left of the sentence to ``seq_len``."""

    def __init__(self, examples: list[Example], tok: Tokenizer, seq_len: int):
        prefix, self.label_ids = label_token_ids(tok)
        self.pad_id = tok.pad_id
        self.ids: list[list[int]] = []
        for ex in examples:
            self.ids.append(fit(tok.encode(TEMPLATE.format(sentence=ex.text)) + prefix, seq_len))
        self.labels = [ex.label for ex in examples]

    def __len__(self) -> int:
        return len(self.ids)

    def collate(self, idx: list[int]) -> Batch:
        ids, mask = pad([self.ids[i] for i in idx], self.pad_id)
        return Batch(ids, mask, torch.tensor([self.labels[i] for i in idx]),
                     torch.tensor(self.label_ids))


def pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and their attention mask, both (len(seqs), longest) int64."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for row, seq in enumerate(seqs):
        ids[row, :len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask[row, :len(seq)] = 1
    return ids, mask


def fit(ids: list[int], room: int) -> list[int]:
    """``ids`` cut to ``room`` tokens from the left, keeping the leading special token."""
    return ids if len(ids) <= room else ids[:1] + ids[len(ids) - room + 1:]


_PERM_CACHE: dict[tuple[int, int, int], torch.Tensor] = {}


def _permutation(n: int, seed: int, epoch: int) -> torch.Tensor:
    key = (n, seed, epoch)
    if key not in _PERM_CACHE:
        if len(_PERM_CACHE) > 4:
            _PERM_CACHE.clear()
        gen = torch.Generator().manual_seed(seed * 7919 + epoch)
        _PERM_CACHE[key] = torch.randperm(n, generator=gen)
    return _PERM_CACHE[key]


class SyntheticData:
    """Random full-length token batches (B, seq_len) with random labels, for speed and memory."""

    def __init__(self, vocab: int, seq_len: int):
        self.vocab, self.seq_len = vocab, seq_len
        self.label_ids = [min(5, vocab - 2), min(6, vocab - 1)]

    def batch_for_step(self, step: int, batch_size: int, seed: int) -> Batch:
        gen = torch.Generator().manual_seed(seed * 104729 + step)
        ids = torch.randint(4, self.vocab, (batch_size, self.seq_len), generator=gen)
        labels = torch.randint(0, 2, (batch_size,), generator=gen)
        return Batch(ids, torch.ones_like(ids), labels, torch.tensor(self.label_ids))

    def eval_batches(self, batch_size: int):
        yield self.batch_for_step(-1, batch_size, 0)

    def __len__(self) -> int:
        return 0
