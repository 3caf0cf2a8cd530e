"""Typed examples from rows: which field holds the text, label, prompt or completion, and checks.

Field names are settings (``text_field``, ``label_field``, ``prompt_field``, ``completion_field``);
left empty, the first column whose name is in the defaults below is used. Every bad value is
refused in one line naming the file, the line (or row) and the field; so is a split whose texts
(or completions) are all blank.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workbench.data.files import DataError, Rows
from workbench.data.labels import name_of

DEFAULT_FIELDS = {
    "text_field": ("text", "sentence", "content", "document", "review", "passage"),
    "label_field": ("label", "labels", "class", "target"),
    "prompt_field": ("prompt", "question", "instruction", "input", "source", "query"),
    "completion_field": ("completion", "answer", "output", "response", "target", "reply"),
}


@dataclass(frozen=True)
class Example:
    """A classify example: ``text`` fills the template; ``label`` indexes ``label_words``."""

    text: str
    label: int


@dataclass(frozen=True)
class Pair:
    """A completion example: the loss covers ``completion``'s tokens only."""

    prompt: str
    completion: str


def field_name(rows: Rows, setting: str, value: str) -> str:
    """The column a field setting names, or the first default name among the columns."""
    if value:
        if value not in rows.columns:
            raise DataError(f"{rows.origin}: no field {value!r} (set by {setting}); the fields are "
                            f"{', '.join(map(str, rows.columns))}")
        return value
    lower = {str(c).lower(): c for c in rows.columns}
    for name in DEFAULT_FIELDS[setting]:
        if name in lower:
            return lower[name]
    raise DataError(f"{rows.origin}: no {setting.removesuffix('_field')} field among "
                    f"{', '.join(map(str, rows.columns))} (looked for "
                    f"{', '.join(DEFAULT_FIELDS[setting])}); set {setting}=NAME")


def _value(rows: Rows, i: int, name: str) -> Any:
    row = rows.rows[i]
    if name not in row or row[name] is None:
        raise DataError(f"{rows.where(i)}: field {name!r} is missing")
    return row[name]


def _text(rows: Rows, i: int, name: str) -> str:
    value = _value(rows, i, name)
    if not isinstance(value, str):
        raise DataError(f"{rows.where(i)}: field {name!r} is {value!r}, not text")
    return value


def _label(rows: Rows, i: int, name: str, k: int, names: dict[str, int] | None = None) -> int:
    value = _value(rows, i, name)
    if names is not None:  # named classes (``labels.py``): scored by name, never by position
        found = name_of(rows, i, name, value)
        if found is None or found not in names:
            raise DataError(f"{rows.where(i)}: field {name!r} is {value!r}, not one of the label "
                            f"names {', '.join(names)}; write every label the same way")
        return names[found]
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int):
        raise DataError(f"{rows.where(i)}: field {name!r} is {value!r}, not a whole number")
    if not 0 <= value < k:
        raise DataError(f"{rows.where(i)}: field {name!r} is {value}, outside 0..{k - 1} "
                        f"(label_words has {k} words)")
    return value


def _some_text(rows: Rows, name: str, values: list[str], why: str) -> list[str]:
    """``values`` (field ``name`` of every row), refused when every one is blank: such a split
    trains on nothing, or scores any model perfectly."""
    if values and not any(v.strip() for v in values):
        first, last = rows.numbers[0], rows.numbers[-1]
        span = f"{rows.unit}s {first}-{last}" if len(values) > 1 else f"{rows.unit} {first}"
        raise DataError(f"{rows.origin}: field {name!r} is blank in all {len(values)} examples "
                        f"({span}): {why}")
    return values


def classify_examples(rows: Rows, k: int, text_field: str = "", label_field: str = "",
                      names: dict[str, int] | None = None) -> list[Example]:
    """(text, label) examples with labels checked to lie in ``0..k-1``; with ``names`` (class
    name -> word index, ``labels.label_map``) every label is a name, mapped through it."""
    text = field_name(rows, "text_field", text_field)
    label = field_name(rows, "label_field", label_field)
    texts = _some_text(rows, text, [_text(rows, i, text) for i in range(len(rows.rows))],
                       "every prompt would be the template alone")
    return [Example(t, _label(rows, i, label, k, names)) for i, t in enumerate(texts)]


def completion_examples(rows: Rows, prompt_field: str = "",
                        completion_field: str = "") -> list[Pair]:
    prompt = field_name(rows, "prompt_field", prompt_field)
    completion = field_name(rows, "completion_field", completion_field)
    if prompt == completion:
        raise DataError(f"{rows.origin}: prompt_field and completion_field are both {prompt!r}")
    prompts = [_text(rows, i, prompt) for i in range(len(rows.rows))]
    answers = _some_text(rows, completion,
                         [_text(rows, i, completion) for i in range(len(rows.rows))],
                         "nothing to learn, and an empty answer would score exact match 1.0")
    return [Pair(p, c) for p, c in zip(prompts, answers)]


def text_examples(rows: Rows, text_field: str = "") -> list[str]:
    """Plain texts (the ``lm`` objective)."""
    text = field_name(rows, "text_field", text_field)
    return _some_text(rows, text, [_text(rows, i, text) for i in range(len(rows.rows))],
                      "the model would learn end-of-text tokens only")
