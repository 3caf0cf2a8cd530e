"""A weight tied between the embedding and the LM head, as zo-offload's head reads it.

zo-offload runs the "+" and "-" passes side by side, block by block, so the embedding group is
perturbed to p, looked up, moved to m and looked up again long before the head runs; the head's
"+" pass then needs the tied weight at p once more. ``TiedHead`` keeps that one weight (not the
whole embedding group: position embeddings are not tied) for every pass but the last (one copy
for one query; 2q - 1 for q central queries, q one-sided), in the head's compute dtype: bf16 /
fp16 under amp, which is exactly the cast autocast would make in the head's matmul (so losses
equal MeZO's bit for bit, in half the memory, and the head casts nothing), fp32 otherwise.
"""
from __future__ import annotations

import torch
from torch import nn

from workbench.engine.storage import Group

#: the dtype the head's matmul reads its weight in, per ``RunConfig.amp``
HEAD_DTYPE = {"off": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class TiedHead:
    """Args:
        embed: the embedding group (on the GPU) holding the tied weight.
        head_modules: the adapter's head modules; those owning the weight read the copy.
        amp: the run's amp knob (the copy's dtype, ``HEAD_DTYPE``).
        copies: passes of a step less one (the last pass reads the group itself).
    """

    def __init__(self, embed: Group, head_modules: list[nn.Module], amp: str, copies: int = 1):
        heads = {id(m) for m in head_modules}
        self.embed = embed
        self.index = next(k for k, e in enumerate(embed.layout.entries)
                          if any(id(m) in heads for m, _ in e.owners))
        entry = embed.layout.entries[self.index]
        self.owners = [(m, slot) for m, slot in entry.owners if id(m) in heads]
        self.bufs = [torch.empty(entry.shape, dtype=HEAD_DTYPE[amp], device=embed.flat.device)
                     for _ in range(copies)]
        self._params = [nn.Parameter(b, requires_grad=False) for b in self.bufs]

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.bufs)

    def keep(self, k: int = 0) -> None:
        """Copy the tied weight as the embedding group holds it now into copy ``k`` (cast to
        the head's dtype; call it during the embedding's pass k)."""
        self.bufs[k].copy_(self.embed.layout.views(self.embed.flat)[self.index])

    def bind_for(self, k: int, last: bool = False) -> None:
        """Point the head at the tied weight of pass ``k``: its copy, or (``last``) the group
        itself, which is still at that pass (cast into copy 0, whose pass has run, under amp,
        so the head casts nothing)."""
        if last and self.bufs[0].dtype == torch.float32:
            self.embed.bind()
            return
        if last:
            self.keep(0)
            k = 0
        for module, slot in self.owners:
            module._parameters[slot] = self._params[k]

    def unbind(self) -> None:
        """Every owner back on the embedding group's own buffer."""
        self.embed.bind()
