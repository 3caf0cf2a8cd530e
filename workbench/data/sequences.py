"""Token-level batches: prompt -> completion pairs and packed plain text (causal-LM losses).

A ``TokenBatch`` names the positions whose next token is scored, as flat indices into R x T, so
a loss can gather just those hidden states (no boolean mask, hence no host sync on a GPU) and run
the head on them in chunks. Position t of row r predicts the token at t + 1: for a completion
these are the completion's tokens (and the EOS after it); for packed text, every token but the
first of each row.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from workbench.data.batches import Lazy, PaddedRows, StepData, fit, pad
from workbench.data.fields import Pair
from workbench.models.tokenizer import Tokenizer


@dataclass
class TokenBatch(PaddedRows):
    """Right-padded rows and their scored positions.

    Shapes: ``input_ids`` / ``attention_mask`` (R, T) int64; ``positions`` (N,) flat index
    r * T + t of each position that predicts a token; ``target_ids`` (N,) that token;
    ``rows`` (N,) the row r of each. ``padded``: whether any row is shorter than T, known on the
    host (as ``Batch.padded``). ``mean_over``: the count a token loss is divided by (0: this
    batch's own N); a data-parallel shard carries the global batch's N / world, so the ranks'
    mean of their shard losses is the loss of the whole batch.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    positions: torch.Tensor
    target_ids: torch.Tensor
    rows: torch.Tensor
    padded: bool | None = None
    mean_over: float = 0.0

    @property
    def scored(self) -> int:
        """Tokens the loss covers."""
        return int(self.target_ids.numel())


def token_batch(seqs: list[list[int]], starts: list[int], pad_id: int) -> dict[str, torch.Tensor]:
    """Fields of a TokenBatch whose row r scores ``seqs[r][starts[r]:]`` (``starts[r] >= 1``)."""
    ids, mask = pad(seqs, pad_id)
    width = ids.shape[1]
    positions, targets, rows = [], [], []
    for r, (seq, start) in enumerate(zip(seqs, starts)):
        positions += range(r * width + start - 1, r * width + len(seq) - 1)
        targets += seq[start:]
        rows += [r] * (len(seq) - start)
    return dict(input_ids=ids, attention_mask=mask,
                positions=torch.tensor(positions, dtype=torch.long),
                target_ids=torch.tensor(targets, dtype=torch.long),
                rows=torch.tensor(rows, dtype=torch.long))


class CompletionData(StepData):
    """Prompt -> completion pairs: ``encode(prompt) + encode_plain(completion) + [eos]``.

    Too long for ``seq_len``: the completion keeps at most ``seq_len - 2`` tokens (cut at its
    end) and the prompt is cut from the left, keeping its leading special token.
    """

    def __init__(self, pairs: list[Pair], tok: Tokenizer, seq_len: int):
        self.pad_id, self.eos_id = tok.pad_id, tok.eos_id
        self.references = [p.completion for p in pairs]

        def pair(i: int) -> tuple[list[int], int]:  # (prompt + completion, where it starts)
            completion = (tok.encode_plain(pairs[i].completion) + [tok.eos_id])[:seq_len - 2]
            prompt = fit(tok.encode(pairs[i].prompt), seq_len - len(completion))
            return prompt + completion, len(prompt)

        # each tokenised when a batch first draws it (``Lazy``)
        self._pairs = Lazy(len(pairs), pair)
        self.seqs = Lazy(len(pairs), lambda i: self._pairs[i][0])
        self.starts = Lazy(len(pairs), lambda i: self._pairs[i][1])
        # for greedy decoding: the prompt alone
        self.prompts = Lazy(len(pairs), lambda i: fit(tok.encode(pairs[i].prompt), seq_len))

    def __len__(self) -> int:
        return len(self.seqs)

    def collate(self, idx: list[int]) -> TokenBatch:
        return TokenBatch(**token_batch([self.seqs[i] for i in idx],
                                        [self.starts[i] for i in idx], self.pad_id))


class PackedText(StepData):
    """Plain texts, each ``encode_plain(text) + [eos]``, concatenated and cut into rows of
    ``seq_len`` tokens; a last shorter row is kept if it has at least two tokens."""

    def __init__(self, texts: list[str], tok: Tokenizer, seq_len: int):
        self.pad_id = tok.pad_id
        stream: list[int] = []
        for text in texts:
            stream += tok.encode_plain(text) + [tok.eos_id]
        self.seqs = [stream[i:i + seq_len] for i in range(0, len(stream), seq_len)]
        if self.seqs and len(self.seqs[-1]) < 2:
            self.seqs.pop()

    def __len__(self) -> int:
        return len(self.seqs)

    def collate(self, idx: list[int]) -> TokenBatch:
        return TokenBatch(**token_batch([self.seqs[i] for i in idx], [1] * len(idx), self.pad_id))


class SyntheticTokens:
    """Random full-length rows (B, seq_len); ``lm`` scores every position, ``completion`` the
    second half. For speed and memory runs: no dev split."""

    def __init__(self, vocab: int, seq_len: int, objective: str):
        self.vocab, self.seq_len = vocab, seq_len
        self.start = 1 if objective == "lm" else seq_len // 2

    def batch_for_step(self, step: int, batch_size: int, seed: int) -> TokenBatch:
        gen = torch.Generator().manual_seed(seed * 104729 + step)
        ids = torch.randint(4, self.vocab, (batch_size, self.seq_len), generator=gen)
        rows = ids.tolist()
        return TokenBatch(**token_batch(rows, [self.start] * batch_size, 0))

    def __len__(self) -> int:
        return 0
