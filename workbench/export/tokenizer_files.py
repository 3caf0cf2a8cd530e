"""The tokenizer files of an exported folder: what ``AutoTokenizer.from_pretrained`` loads.

A model with a Hugging Face tokenizer saves that tokenizer. The tiny presets' byte tokenizer
(``models/tokenizer.py``: UTF-8 bytes shifted past <pad>, <s>, </s>, <unk>) has no files, so it
is written as an equivalent ``tokenizers`` pipeline: a byte-level BPE with no merges whose
vocabulary is the four specials then the 256 bytes in order, ``<s>`` prepended. It encodes
every text to the ids ``ByteTokenizer`` gives (special-token strings in the text included:
``split_special_tokens``), so an exported tiny model is fine-tuned or evaluated again from its
folder with the same ids.
"""
from __future__ import annotations

from pathlib import Path

from workbench.models.tokenizer import ByteTokenizer, HFTokenizer, load_tokenizer
from workbench.presets import PRESETS, lookup

SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")  # ids 0..3, as ``ByteTokenizer``


def save_tokenizer(model: str, data_dir: Path, folder: Path,
                   max_positions: int | None = None) -> dict[str, int]:
    """Write the tokenizer of ``model`` (a preset, folder or hub id) into ``folder``; returns
    its special ids {"bos_token_id", "eos_token_id", "pad_token_id"} (those it has).
    ``max_positions``: the model's positions, saved as the tokenizer's ``model_max_length``
    where the tokenizer claims more (so ``truncation=True`` cuts a text to what the model
    reads; None: a model without a position limit, the tokenizer's own is kept).

    Raises:
        ConfigError: the model has no usable tokenizer (``load_tokenizer``'s line).
    """
    preset = lookup(model)
    tok = ByteTokenizer() if preset is not None and preset.tokenizer == "byte" \
        else load_tokenizer(model, data_dir)
    hf = byte_tokenizer() if isinstance(tok, ByteTokenizer) else tok.tok
    if max_positions is not None and not hf.model_max_length <= max_positions:
        hf.model_max_length = int(max_positions)
    hf.save_pretrained(folder)
    ids = {"bos_token_id": hf.bos_token_id, "eos_token_id": hf.eos_token_id,
           "pad_token_id": tok.pad_id if isinstance(tok, (ByteTokenizer, HFTokenizer)) else None}
    return {k: int(v) for k, v in ids.items() if v is not None}


def byte_tokenizer():
    """``ByteTokenizer`` as a ``PreTrainedTokenizerFast`` (same ids for every text); its
    ``model_max_length`` is the longest byte-tokenizer preset's (``save_tokenizer`` cuts it to
    the exported model's)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    chars = _byte_chars()
    vocab = {s: i for i, s in enumerate(SPECIALS)}
    vocab.update((chars[b], b + len(SPECIALS)) for b in range(256))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", ByteTokenizer.bos_id)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", unk_token="<unk>",
                                   split_special_tokens=True,
                                   model_max_length=max(p.max_positions for p in PRESETS.values()
                                                        if p.tokenizer == "byte"))


def _byte_chars() -> list[str]:
    """The printable character byte-level BPE stands each byte in (GPT-2's table), by byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]
