"""Names of runs shown side by side: their directory and the settings that differ between them.

    runs/lr4 (mezo, lr=1e-4), runs/lr3 (mezo, lr=1e-3) -> "lr4: mezo lr=1e-4", "lr3: mezo lr=1e-3"
    runs/demo/mezo, runs/demo/zo-offload               -> "mezo", "zo-offload"

The method always leads (it is what a reader asks first); then each setting whose value is not
the same in every run, as ``knob=value`` under its one name (the ``--set`` key). The directory
is put in front unless it only repeats the settings (a sweep's ``overlap-true`` folders, the
demo's ``mezo``); what it says already is not repeated after it (the panel's
``20261125-021208-zo-offload`` runs read "20261125-021208-zo-offload: tiny-opt"). A run named
explicitly (``info["name"]``: a sweep's point) keeps its name. Runs that still share a label
are numbered. ``compare``, the report, the dashboard and sweeps all call ``run_labels``.

A setting is one part of the label however many words its value has (``template={text}
Category B`` stays whole: only a whole part the folder says already is left out). Labels are
short enough for a chart's legend: a long value shows where the runs' values differ
(``template=…Category B``), at most ``VALUE_CHARS``, and a label longer than ``LABEL_CHARS``
keeps its first settings and counts the rest ("+2 more"); ``compare`` and the report list
every differing setting in full.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Sequence

from workbench.telemetry.record import RunRecord

#: Settings named first when they differ (after the method, which always leads), by their
#: value alone ("mezo opt-1.3b", not "mezo model=opt-1.3b").
LEAD = ("model",)
#: At most this many differing settings in a label; the rest are counted ("+2 more").
MAX_KEYS = 4
#: A value longer than this is cut to where the runs' values differ.
VALUE_CHARS = 24
#: A label's settings stop before this length (the rest counted).
LABEL_CHARS = 72


def differing(configs: Sequence[dict[str, Any]]) -> list[str]:
    """Settings whose values are not all equal across ``configs`` (a setting one config lacks
    differs), ``LEAD`` first, then in the first config's order. An empty config (a record
    whose config is null) is unknown, not different, and is left out."""
    configs = [c for c in configs if c]
    order = list(dict.fromkeys([*LEAD, *(k for c in configs for k in c)]))
    missing = object()
    return [k for k in order
            if len({_key(c.get(k, missing)) for c in configs}) > 1]


def settings_text(config: dict[str, Any], keys: Sequence[str]) -> str:
    """"mezo lr=1e-4 seed=1": the method, then ``keys`` (at most ``MAX_KEYS``; ``LEAD`` ones
    by their value alone)."""
    return " ".join(_parts(config, keys, {}))


def _parts(config: dict[str, Any], keys: Sequence[str], skip: dict[str, int]) -> list[str]:
    """The method, then a part per setting of ``keys``, a long value cut at the characters
    ``skip[key]`` its runs' values share first; within ``MAX_KEYS`` and ``LABEL_CHARS``."""
    keys = [k for k in keys if k != "method"]
    parts = [str(config.get("method", "?"))]
    for i, k in enumerate(keys):
        v = _cut(value_text(config.get(k)), skip.get(k, 0))
        v = f"'{v}'" if " " in v else v  # a value of several words reads as one
        part = v if k in LEAD else f"{k}={v}"
        more = len(keys) - i
        if i >= MAX_KEYS or (i and len(" ".join(parts + [part])) > LABEL_CHARS):
            parts.append(f"+{more} more")
            break
        parts.append(part)
    return parts


def _cut(text: str, shared: int) -> str:
    """``text`` within ``VALUE_CHARS``: from a little before the ``shared`` characters end
    (where the runs' values part), with "…" where something is left out."""
    if len(text) <= VALUE_CHARS:
        return text
    start = max(0, min(shared - 4, len(text) - VALUE_CHARS + 1))
    head = "…" if start > 0 else ""
    body = text[start:start + VALUE_CHARS - len(head)]
    return head + (body if start + len(body) >= len(text) else body[:-1] + "…")


def _shared(values: Sequence[str]) -> int:
    """Characters the values have in common at their start."""
    first = min(values, default="")
    last = max(values, default="")
    n = 0
    while n < len(first) and first[n] == last[n]:
        n += 1
    return n


def run_labels(recs: Sequence[RunRecord]) -> list[str]:
    """One distinct label per run (see the module docstring). A single run, and runs whose
    settings are all alike, are named by their directory, method and model."""
    keys = differing([r.config for r in recs]) or ["model"]  # one run, or runs alike
    skip = {k: _shared([value_text(r.config.get(k)) for r in recs if r.config]) for k in keys}
    labels = []
    for r in recs:
        if r.info.get("name"):
            labels.append(str(r.info["name"]))
            continue
        folder = Path(r.path).name if r.path else ""
        if not r.config:  # its settings are unknown: say so rather than "? model=None"
            labels.append(f"{folder or 'run'} (no config recorded)")
            continue
        parts = _parts(r.config, keys, skip)
        text = " ".join(parts)
        if folder and _slug(folder) not in _slug(text):
            # the folder, then the parts it does not say already ("20261125-zo-offload:
            # tiny-opt"); a part is a whole setting, never a word of its value
            rest = [p for p in parts if not _slug(p) or _slug(p) not in _slug(folder)]
            text = f"{folder}: {' '.join(rest)}" if rest else folder
        labels.append(text)
    return [f"{n} #{labels[:i].count(n) + 1}" if labels.count(n) > 1 else n
            for i, n in enumerate(labels)]


def value_text(v: Any) -> str:
    """A setting's value as a label shows it: 1e-4, true, 0.5, a file's name (not its path)."""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return short_number(v)
    text = str(v)
    return Path(text).name or text if "/" in text else text


def short_number(x: float) -> str:
    """1e-4 rather than 0.0001, 2.5e-3 rather than 0.0025; 0.5, 16, 1e+06 as ``:g`` has them."""
    if x != 0 and abs(x) < 0.01:
        m, e = f"{x:.1e}".split("e")
        return f"{m.rstrip('0').rstrip('.')}e{int(e)}"
    return f"{x:g}"


def _key(v: Any) -> str:
    return repr(v)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())
