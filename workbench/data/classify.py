"""k-way prompt classification: ``template`` filled with the text, scored by k label words.

A candidate's score is the summed log-probability of its word's tokens after the prompt. The
words' common leading tokens (a shared space with a byte tokenizer) belong to the prompt. When
every word is then one token, one sequence per example suffices and the scores are the k label
tokens' logits at the last position (the same cross-entropy as log-probabilities, which differ
from logits by one constant per row): ``Batch``, exactly today's SST-2 batches and loss. Otherwise
each example becomes k sequences, prompt + word c, in a ``ChoiceBatch``.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from workbench.config import ConfigError
from workbench.config import split_words as config_split_words
from workbench.data.batches import Batch, Lazy, StepData, fit, pad
from workbench.data.fields import Example
from workbench.data.sequences import TokenBatch, token_batch
from workbench.data.files import DataError
from workbench.models.tokenizer import Tokenizer


@dataclass
class ChoiceBatch(TokenBatch):
    """B examples x k candidates as R = B * k rows (row b * k + c: example b, word c).

    ``labels`` (B,) int64 is the right candidate; ``rows`` maps each scored token to its row,
    so a candidate's score is the sum of its tokens' log-probabilities.
    """

    labels: torch.Tensor = None  # type: ignore[assignment]
    k: int = 2


def split_words(label_words: str) -> list[str]:
    """``" terrible, great"`` -> ``[" terrible", " great"]``: split at each comma and nothing
    else; every other character is part of a word, spaces included (``config.split_words``)."""
    return config_split_words(label_words)


def word_tokens(tok: Tokenizer, words: list[str]) -> tuple[list[int], list[list[int]]]:
    """(the words' common leading tokens, each word's remaining tokens).

    Raises:
        ConfigError: two words the tokenizer makes the same ids of (a normalising tokenizer:
            case, unicode forms), or one word's tokens beginning another's.
    """
    ids = [tok.encode_plain(w) for w in words]
    for a, b in itertools.combinations(range(len(words)), 2):
        if ids[a] == ids[b]:
            raise ConfigError([f"label_words: {words[a]!r} and {words[b]!r} tokenize to the "
                               f"same ids {ids[a]}; the model could not tell the labels apart"])
    k = 0
    while all(len(i) > k for i in ids) and len({i[k] for i in ids}) == 1:
        k += 1
    rest = [i[k:] for i in ids]
    if any(not r for r in rest):
        short = words[next(i for i, r in enumerate(rest) if not r)]
        raise ConfigError([f"label_words: the tokens of {short!r} begin another word's; the "
                           f"tokenizer cannot tell {words!r} apart"])
    return ids[0][:k], rest


class ClassifyData(StepData):
    """Tokenised prompts of one split.

    Args:
        examples: (text, label) pairs, labels in ``0..k-1``.
        template: the prompt, ``{text}`` filled with each example's text.
        label_words: comma-separated words of labels 0..k-1.
        seq_len: most tokens of a sequence; prompts are cut from the left of the text (the
            leading special token is kept), never the label word.
    """

    def __init__(self, examples: list[Example], tok: Tokenizer, seq_len: int,
                 template: str = "{text} It was", label_words: str = " terrible, great"):
        prefix, self.words = word_tokens(tok, split_words(label_words))
        self.k = len(self.words)
        self.single = all(len(w) == 1 for w in self.words)
        room = seq_len - max(len(w) for w in self.words) * (not self.single)
        if room < 2:
            raise DataError(f"seq_len: {seq_len} tokens leave no room for a prompt before the "
                            f"label words ({max(map(len, self.words))} tokens)")
        self.pad_id = tok.pad_id
        texts = [ex.text for ex in examples]  # tokenised when a batch first draws the example
        self.ids = Lazy(len(texts), lambda i: fit(tok.encode(template.format(text=texts[i]))
                                                  + prefix, room))
        self.labels = [ex.label for ex in examples]

    def __len__(self) -> int:
        return len(self.ids)

    def collate(self, idx: list[int]) -> Batch | ChoiceBatch:
        labels = torch.tensor([self.labels[i] for i in idx])
        if self.single:
            ids, mask = pad([self.ids[i] for i in idx], self.pad_id)
            return Batch(ids, mask, labels, torch.tensor([w[0] for w in self.words]))
        seqs = [self.ids[i] + w for i in idx for w in self.words]
        starts = [len(self.ids[i]) for i in idx for _ in self.words]
        return ChoiceBatch(**token_batch(seqs, starts, self.pad_id), labels=labels, k=self.k)
