"""How many tokens a model reads, from its Hugging Face config: what an export writes as its
tokenizer's limit, so tokenizer and model agree."""
from __future__ import annotations

#: Config keys that give a model's positions, by family.
POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "n_ctx",
                 "max_seq_len", "seq_length")


def max_positions(config) -> int | None:
    """The most tokens ``config``'s model reads (its text part's), or None where it names no
    limit (a state-space or recurrent model)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for key in POSITION_KEYS:
        value = getattr(text, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None
