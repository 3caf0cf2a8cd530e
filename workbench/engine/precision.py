"""The compute precision of a pass: autocast to bf16 / fp16 (``amp``) or none."""
from __future__ import annotations

from contextlib import nullcontext
from typing import ContextManager

import torch


def autocast(device: torch.device, amp: str) -> ContextManager:
    """``torch.autocast`` in ``amp``'s dtype on ``device``, or a no-op for amp=off."""
    if amp == "off":
        return nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16 if amp == "bf16" else torch.float16)
