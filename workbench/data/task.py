"""A run's task from its config: the objective, and its train and dev data.

``build_task`` reads the ``data`` source (``data/sources.py``), picks the fields
(``data/fields.py``), keeps ``train_samples`` / ``eval_samples`` of the examples (texts, for
``lm``) and tokenises them for the objective. Every problem is one ``DataError`` line, raised
before any model weight is touched.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from workbench.config import RunConfig
from workbench.data.batches import SyntheticData
from workbench.data.classify import ClassifyData, split_words
from workbench.data.fields import (classify_examples, completion_examples, field_name,
                                   text_examples)
from workbench.data.files import DataError
from workbench.data.labels import label_map, mapping_record
from workbench.data.objectives import LM, Classify, Completion, Objective
from workbench.data.sequences import CompletionData, PackedText, SyntheticTokens
from workbench.data.sources import load_rows
from workbench.models.head_loss import chunk_rows
from workbench.models.tokenizer import Tokenizer


@dataclass
class Task:
    """What to train on: ``train.batch_for_step(step, batch_size, seed)``; ``dev`` is None for
    synthetic data."""

    objective: Objective
    train: Any
    dev: Any | None
    #: split -> (where its rows came from, their content digest); empty for synthetic data
    sources: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: classify: each label (a class name, or a number) -> the word it is scored by
    labels: dict[str, str] = field(default_factory=dict)

    def examples(self) -> dict[str, int]:
        """Examples per split after ``train_samples`` / ``eval_samples`` (sequences, for
        ``lm``); empty for synthetic data."""
        if self.dev is None:
            return {}
        return {"train": len(self.train), "dev": len(self.dev)}


def make_objective(cfg: RunConfig, tok: Tokenizer | None, vocab: int) -> Objective:
    chunk = chunk_rows(vocab)
    if cfg.objective == "classify":
        return Classify(chunk)
    if cfg.objective == "lm":
        return LM(chunk)
    return Completion(tok, cfg.max_new_tokens, chunk)


def build_task(cfg: RunConfig, tok: Tokenizer | None, vocab: int) -> Task:
    """The objective and data of ``cfg`` (``tok`` may be None for synthetic data)."""
    objective = make_objective(cfg, tok, vocab)
    if cfg.data == "synthetic":
        train = (SyntheticData(vocab, cfg.seq_len) if cfg.objective == "classify"
                 else SyntheticTokens(vocab, cfg.seq_len, cfg.objective))
        return Task(objective, train, None)
    rows = load_rows(cfg.data, cfg.resolved_data_dir, cfg.objective)
    sources = {name: (r.origin, r.digest) for name, r in zip(("train", "dev"), rows)}
    labels: dict[str, str] = {}
    if cfg.objective == "classify":
        words = split_words(cfg.label_words)
        names = label_map(list(rows), field_name(rows[0], "label_field", cfg.label_field), words)
        labels = mapping_record(names, words)
        train, dev = (classify_examples(r, len(words), cfg.text_field, cfg.label_field, names)
                      for r in rows)
    elif cfg.objective == "completion":
        train, dev = (completion_examples(r, cfg.prompt_field, cfg.completion_field) for r in rows)
    else:
        train, dev = (text_examples(r, cfg.text_field) for r in rows)
    train = train[:cfg.train_samples] if cfg.train_samples else train
    dev = dev[:cfg.eval_samples] if cfg.eval_samples else dev
    return Task(objective, *(_dataset(cfg, tok, split, name) for split, name in
                             ((train, "train"), (dev, "dev"))), sources, labels)


def _dataset(cfg: RunConfig, tok: Tokenizer, examples: list, split: str):
    if cfg.objective == "classify":
        return ClassifyData(examples, tok, cfg.seq_len, cfg.template, cfg.label_words)
    if cfg.objective == "completion":
        return CompletionData(examples, tok, cfg.seq_len)
    data = PackedText(examples, tok, cfg.seq_len)
    if not len(data):
        raise DataError(f"{cfg.data}: the {split} split has no text to train on")
    return data
