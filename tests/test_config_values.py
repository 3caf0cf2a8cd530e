"""Values are taken as typed: a setting given in TOML and the same text given with ``--set``
resolve to the same config (or the same refusal), for text with leading and trailing spaces,
commas, quotes, backslashes, tabs and non-ASCII characters. A seeded generator (no extra test
dependency) draws the values; every failure prints the value that broke it.
"""
from __future__ import annotations

import random

import pytest

from workbench.config import (ConfigError, RunConfig, load_config, parse_sets, resume_base,
                              split_words, unknown_setting)
from workbench.data.classify import word_tokens
from workbench.models.tokenizer import ByteTokenizer

#: characters values are drawn from: the ones parsers like to eat, and some that are not ASCII
ALPHABET = list("ab xyz,,  \"'\\\t{}=#[]") + ["é", "ü", "日本", "\u00a0", "\u2028", "😀", "ß"]
#: text settings and a wrapper that makes a drawn text a valid value (or not) of each
FIELDS = {
    "label_words": lambda t: t,  # split at commas: blanks and repeats are refused
    "template": lambda t: t + "{text}" + t,  # must hold {text}; stray braces are refused
    "text_field": lambda t: t,
    "data_dir": lambda t: t,
}


def toml_string(text: str) -> str:
    """``text`` as a TOML basic string (escapes for quotes, backslashes and control
    characters; everything else as it is)."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ch in "\u007f\u2028":
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def draw(rng: random.Random) -> str:
    n = rng.choice([0, 1, 2, 5, 12])
    text = "".join(rng.choice(ALPHABET) for _ in range(n))
    return rng.choice(["", " ", "  "]) + text + rng.choice(["", " ", "\t"])


def resolved(load) -> tuple[str, object]:
    try:
        return "config", load().to_dict()
    except ConfigError as e:
        return "refused", e.problems


@pytest.mark.parametrize("name", FIELDS)
def test_toml_and_set_give_the_same_config(tmp_path, name):
    rng = random.Random(f"values-{name}")
    path = tmp_path / "run.toml"
    outcomes = set()
    for _ in range(150):
        value = FIELDS[name](draw(rng))
        extra = {"text_field": "text"} if name != "text_field" else {}
        extra_toml = "".join(f"{k} = {toml_string(v)}\n" for k, v in extra.items())
        path.write_text(f"[run]\n{extra_toml}{name} = {toml_string(value)}\n", encoding="utf-8")
        by_toml = resolved(lambda: load_config(path))
        sets = [f"{k}={v}" for k, v in extra.items()] + [f"{name}={value}"]
        by_set = resolved(lambda: load_config(None, parse_sets(sets)))
        assert by_toml == by_set, repr(value)
        if by_toml[0] == "config":
            assert by_toml[1][name] == value, repr(value)  # exactly as typed: nothing stripped
        outcomes.add(by_toml[0])
    # the draw reaches both sides where the config can refuse a text (label words, templates)
    assert outcomes == ({"config", "refused"} if name in ("label_words", "template")
                        else {"config"})


def test_the_readme_example_keeps_its_spaces():
    cfg = load_config(None, parse_sets(["label_words= bad, fine, great"]))
    assert split_words(cfg.label_words) == [" bad", " fine", " great"]
    with pytest.raises(ConfigError, match="repeats a word"):
        load_config(None, parse_sets(["label_words= bad, bad"]))
    with pytest.raises(ConfigError, match="non-blank words"):
        load_config(None, parse_sets(["label_words= bad, , great"]))
    # TOML's quotes typed inside the shell's ('label_words=" bad, great"') reach the value
    with pytest.raises(ConfigError, match="is wrapped in quotes"):
        load_config(None, parse_sets(['label_words=" bad, great"']))


def test_label_words_the_tokenizer_cannot_tell_apart_are_refused():
    class Lower(ByteTokenizer):  # a normalising tokenizer: case is lost
        def encode_plain(self, text):
            return super().encode_plain(text.lower())

    with pytest.raises(ConfigError, match="' Great' and ' great' tokenize to the same ids"):
        word_tokens(Lower(), [" Great", " great"])
    with pytest.raises(ConfigError, match="the tokens of ' good' begin another word's"):
        word_tokens(ByteTokenizer(), [" good", " goodness"])
    assert word_tokens(ByteTokenizer(), [" bad", " good"])[1] == [[102, 101, 104], [107, 115,
                                                                                      115, 104]]


@pytest.mark.parametrize("typed, meant", [("stpes", "steps"), ("batch-size", "batch_size"),
                                          ("learning_rate", "lr"), ("Seq_Len", "seq_len"),
                                          ("check_point_every", "checkpoint_every")])
def test_an_unknown_setting_says_what_was_meant(typed, meant):
    line = unknown_setting(typed)
    assert line.startswith(f"{typed}: unknown setting; did you mean {meant}")
    assert len(line) < 120  # not the list of every setting
    with pytest.raises(ConfigError) as err:
        load_config(None, {typed: "1"})
    assert err.value.problems == [line]
    assert "no setting has a similar name" in unknown_setting("qqqqq")


def test_a_resume_does_not_inherit_one_start_knobs():
    recorded = {**RunConfig().to_dict(), "data_changed_ok": True, "gone_in_this_version": 1}
    base = resume_base(recorded)
    assert base["data_changed_ok"] is False and "gone_in_this_version" not in base
    assert RunConfig(**base) == RunConfig()
