"""Tokenizer loading: a tokenizer that cannot be had is one line, with the Hub's retry warnings
held back (offline, huggingface_hub logs two lines per retry)."""
from __future__ import annotations

import logging

import pytest

from workbench.config import ConfigError
from workbench.models.tokenizer import ByteTokenizer, load_tokenizer


def test_an_unreachable_hub_gives_one_line_and_no_retry_noise(tmp_path, monkeypatch, capfd):
    import transformers
    from huggingface_hub.utils import _http

    def offline(name, **_):
        for k in range(1, 6):  # what huggingface_hub's backoff logs with no network
            _http.logger.warning(f"'[Errno -2] Name or service not known' thrown while "
                                 f"requesting HEAD https://huggingface.co/{name}/config.json")
            _http.logger.warning(f"Retrying in {2 ** (k - 1)}s [Retry {k}/5].")
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files. "
                      "Check your connection")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", offline)
    hub = logging.getLogger("huggingface_hub")
    before = hub.level
    with pytest.raises(ConfigError) as e:
        load_tokenizer("opt-125m", tmp_path)  # no opt-tokenizer/ here: the Hub is asked
    assert str(e.value).count("\n") == 0
    assert "model: no usable tokenizer for opt-125m (We couldn't connect" in str(e.value)
    err = capfd.readouterr().err
    assert "Retrying" not in err and "thrown while requesting" not in err
    assert hub.level == before  # warnings are held back only while the tokenizer loads


def test_the_tiny_presets_need_no_files(tmp_path):
    tok = load_tokenizer("tiny-opt", tmp_path)
    assert isinstance(tok, ByteTokenizer) and tok.decode(tok.encode("héllo")) == "héllo"
