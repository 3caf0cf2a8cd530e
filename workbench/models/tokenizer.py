"""Tokenizers: a byte-level one for the tiny presets, Hugging Face ones for real models."""
from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

from workbench.config import ConfigError
from workbench.presets import lookup


class Tokenizer(Protocol):
    pad_id: int
    eos_id: int  # ends a completion and separates packed texts

    def encode(self, text: str) -> list[int]:
        """Ids with the model's leading special token, if it uses one."""

    def encode_plain(self, text: str) -> list[int]:
        """Ids with no special tokens (for label words)."""

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids``, special tokens left out."""


class ByteTokenizer:
    """UTF-8 bytes shifted past four specials (<pad>=0, <s>=1, </s>=2, <unk>=3): vocab 260.

    The tiny presets use it so the demo needs no tokenizer files at all.
    """

    pad_id, bos_id, eos_id = 0, 1, 2
    vocab_size = 260

    def encode(self, text: str) -> list[int]:
        return [self.bos_id] + self.encode_plain(text)

    def encode_plain(self, text: str) -> list[int]:
        return [b + 4 for b in text.encode("utf-8")]

    def decode(self, ids: list[int]) -> str:
        return bytes(i - 4 for i in ids if 4 <= i < 260).decode("utf-8", errors="replace")


class HFTokenizer:
    """A ``transformers`` tokenizer behind the two calls the data pipeline makes."""

    def __init__(self, tok):
        self.tok = tok
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        self.pad_id = int(pad if pad is not None else 0)
        self.eos_id = int(tok.eos_token_id if tok.eos_token_id is not None else self.pad_id)

    def encode(self, text: str) -> list[int]:
        return list(self.tok(text)["input_ids"])

    def encode_plain(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)


def load_tokenizer(model: str, data_dir: Path) -> Tokenizer:
    """The tokenizer a model preset or folder uses; local files first, the Hub only when online.
    A local folder's tokenizer never runs code of its own (trust_remote_code=False).

    Raises:
        ConfigError: no usable tokenizer (one line).
    """
    try:
        with _quiet_hub():
            return _load(model, data_dir)
    except (OSError, ValueError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0].split(". ")[0][:200]
        raise ConfigError([f"model: no usable tokenizer for {model} ({first})"]) from None


@contextmanager
def _quiet_hub() -> Iterator[None]:
    """Hub warnings held back while a tokenizer loads: offline, huggingface_hub logs two lines
    per retry (22 lines for one tokenizer) before the one-line error ``load_tokenizer`` gives."""
    hub = logging.getLogger("huggingface_hub")
    level = hub.level
    hub.setLevel(logging.ERROR)
    try:
        yield
    finally:
        hub.setLevel(level)


def _load(model: str, data_dir: Path) -> Tokenizer:
    from transformers import AutoTokenizer

    preset = lookup(model)
    if preset is None:
        from workbench.models.hub import model_folder

        return HFTokenizer(AutoTokenizer.from_pretrained(model_folder(model),
                                                         trust_remote_code=False))
    if preset.tokenizer == "byte":
        return ByteTokenizer()
    if preset.tokenizer == "opt":
        local = data_dir / "opt-tokenizer"
        return HFTokenizer(AutoTokenizer.from_pretrained(local if local.is_dir()
                                                         else "facebook/opt-125m"))
    from workbench.models.smollm2 import smollm2_folder

    return HFTokenizer(AutoTokenizer.from_pretrained(smollm2_folder()))
