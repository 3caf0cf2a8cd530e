"""``python -m workbench plan --models``: what ``model=`` can name, in one screen."""
from __future__ import annotations

import textwrap

from workbench.presets import PRESETS, TINY_PREFIX


def models_text(width: int = 96) -> str:
    """The presets (with their sizes), then the model types the adapter has checked: each as
    ``tiny:<model_type>``, and any Hugging Face folder or hub id of one of those types."""
    from workbench.models.tiny import supported_types

    lines = ["presets (random weights unless marked; sizes in parameters):"]
    for name, p in PRESETS.items():
        real = f", pretrained ({p.pretrained})" if p.pretrained else ""
        lines.append(f"  {name:<16} {p.family:<8} {_size(p.total_params())}{real}")
    types = supported_types()
    lines.append(f"model types checked against their own forward ({len(types)}): a run takes "
                 f"{TINY_PREFIX}<model_type> (a tiny random model of it), or a folder or hub id "
                 "whose config.json names one of them:")
    lines += textwrap.wrap(", ".join(types), width=width, initial_indent="  ",
                           subsequent_indent="  ", break_on_hyphens=False)
    lines.append("others are refused in one line saying why "
                 "(e.g. model=tiny:bert: an encoder stack)")
    return "\n".join(lines)


def _size(n: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return str(n)
