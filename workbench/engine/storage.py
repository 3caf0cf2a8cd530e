"""A group's storage: its layout and the flat buffer holding its weights on one device."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from workbench.engine.codecs.frozen_form import FrozenForm
from workbench.engine.groups import GroupLayout


@dataclass
class Group:
    """A layout and the flat fp32 buffer holding it on one device (bf16 / fp16 for MeZO's half
    weights: ``zo/half.py``), plus cached param views.
    A frozen base block may instead be held in a ``form`` (``frozen_form.py``: matrices in the
    compute dtype), ``flat`` then being the form's byte buffer."""

    layout: GroupLayout
    flat: torch.Tensor
    form: FrozenForm | None = None
    _params: dict = field(default_factory=dict)

    def values(self) -> torch.Tensor:
        """The weights held, as fp32 (n,) (a new tensor for a form or half weights, else
        ``flat`` itself)."""
        return self.flat.float() if self.form is None else self.form.to_fp32(self.flat)

    def load(self, values: torch.Tensor) -> None:
        """Set the weights from fp32 ``values`` (n,) (a form rounds its matrices)."""
        if self.form is None:
            self.flat.copy_(values)
        else:
            self.form.fill(self.flat, values)

    def bind(self, flat: torch.Tensor | None = None) -> None:
        """Point the model at ``flat`` (default: this group's own buffer; a long-lived buffer
        such as a scratch copy), with the parameter views cached per buffer."""
        flat = self.flat if flat is None else flat
        key = (flat.data_ptr(), flat.numel())
        if key not in self._params:
            make = self.layout.make_params if self.form is None else self.form.make_params
            self._params[key] = make(flat)
        self.layout.bind(self._params[key])


def materialise(layout: GroupLayout, source, seed: int, device: torch.device,
                pin: bool = False, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A flat buffer for ``layout`` on ``device``, filled by ``source``: fp32, or ``dtype``
    (MeZO's half weights), filled in fp32 and rounded to nearest once, as MeZO's half-precision
    loading does (one group's fp32 beside it, never the model's)."""
    flat = torch.empty(layout.numel, dtype=torch.float32, device=device, pin_memory=pin)
    if layout.numel:
        source.fill(layout.name, layout.named_views(flat), seed)
    return flat if dtype == torch.float32 else flat.to(dtype)
