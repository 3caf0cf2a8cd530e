"""Exact match and token F1 of a generated answer against the reference (SQuAD's definitions).

Both compare normalised text: lower case, punctuation and the articles a / an / the removed,
runs of whitespace collapsed. Token F1 is the harmonic mean of precision and recall of the
normalised words, counted with multiplicity; two empty answers agree.
"""
from __future__ import annotations

import re
import string
from collections import Counter

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize(text: str) -> str:
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCT)).split())


def exact_match(prediction: str, reference: str) -> float:
    """1.0 if the normalised texts are equal, else 0.0."""
    return float(normalize(prediction) == normalize(reference))


def token_f1(prediction: str, reference: str) -> float:
    """F1 in [0, 1] of the normalised words."""
    pred, ref = normalize(prediction).split(), normalize(reference).split()
    if not pred or not ref:
        return float(pred == ref)
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)
