"""A weight tied between the embedding and the LM head, as zo-offload's head reads it.

zo-offload runs the "+" and "-" passes side by side, block by block, so the embedding group is
perturbed to p, looked up, moved to m and looked up again long before the head runs; the head's
"+" pass then needs the tied weight at p once more. ``TiedHead`` keeps that one weight (not the
whole embedding group: position embeddings are not tied) in the head's compute dtype: bf16 /
fp16 under amp, which is exactly the cast autocast would make in the head's matmul (so losses
equal MeZO's bit for bit, in half the memory, and the head casts nothing), fp32 otherwise.
"""
from __future__ import annotations

import torch
from torch import nn

from workbench.engine.storage import Group
from workbench.engine.zo.step import MINUS

#: the dtype the head's matmul reads its weight in, per ``RunConfig.amp``
HEAD_DTYPE = {"off": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class TiedHead:
    """Args:
        embed: the embedding group (on the GPU) holding the tied weight.
        head_modules: the adapter's head modules; those owning the weight read the copy.
        amp: the run's amp knob (the copy's dtype, ``HEAD_DTYPE``).
    """

    def __init__(self, embed: Group, head_modules: list[nn.Module], amp: str):
        heads = {id(m) for m in head_modules}
        self.embed = embed
        self.index = next(k for k, e in enumerate(embed.layout.entries)
                          if any(id(m) in heads for m, _ in e.owners))
        entry = embed.layout.entries[self.index]
        self.owners = [(m, slot) for m, slot in entry.owners if id(m) in heads]
        self.buf = torch.empty(entry.shape, dtype=HEAD_DTYPE[amp], device=embed.flat.device)
        self._param = nn.Parameter(self.buf, requires_grad=False)

    @property
    def nbytes(self) -> int:
        return self.buf.numel() * self.buf.element_size()

    def keep(self) -> None:
        """Copy the tied weight as the embedding group holds it now (cast to the head's
        dtype; call it with the group at p, during the embedding's "+" pass)."""
        self.buf.copy_(self.embed.layout.views(self.embed.flat)[self.index])

    def bind_for(self, sign: int) -> None:
        """Point the head at the tied weight of pass ``sign``: the copy kept at p, or (MINUS) the
        group itself, at m (cast into the copy under amp, so the head casts nothing)."""
        if sign == MINUS and self.buf.dtype == torch.float32:
            self.embed.bind()
            return
        if sign == MINUS:
            self.keep()
        for module, slot in self.owners:
            module._parameters[slot] = self._param

    def unbind(self) -> None:
        """Every owner back on the embedding group's own buffer."""
        self.embed.bind()
