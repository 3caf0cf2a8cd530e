"""A streamed embedding's form under compute-dtype slots: the fp32 rows the batch looks up.

Under autocast ``F.embedding`` is not cast: the token embedding is read in fp32, so its
forward form is fp32 values, not the compute dtype a block's matrices take
(``codecs/frozen_form.py``). A table of V x D fp32 is what the streamed embedding exists to keep
off the GPU, so the form holds only the rows a forward pass uses: at most one per token of the
batch (``plan/memory.py::embed_rows``; rows a batch repeats are filled again, so no
data-dependent size ever needs a host sync). A forward pre-hook on the embedding module fills
them from the master (``zo/chain.py::ChainRunner.fill_spans``: each row's contiguous elements,
the value the fp32 slot would hold, bit for bit) and hands the module compact indices, the
token at position t of the flattened batch reading row t. The group's other entries (position
embeddings, a norm) follow in fp32, whole. A table with no more rows than that capacity is
filled whole and looked up as it is.
"""
from __future__ import annotations

import torch
from torch import nn

from workbench.engine.groups import Entry, GroupLayout

#: (element offsets of each span's start (S,) int64, elements per span, the (S x length,)
#: fp32 destination): one contiguous run of the group's elements per span
Spans = list[tuple[torch.Tensor, int, torch.Tensor]]


class EmbedRows:
    """Args:
        layout: the embedding group's layout.
        module: its token embedding module (``weight``: (V, D)).
        capacity: rows the form holds at most (tokens of the largest forward).

    Units: ``numel`` elements, ``nbytes`` bytes of the form."""

    def __init__(self, layout: GroupLayout, module: nn.Module, capacity: int):
        self.layout = layout
        found = [e for e in layout.entries
                 if any(m is module and slot == "weight" for m, slot in e.owners)]
        if len(found) != 1 or len(found[0].shape) != 2:
            raise ValueError("stream_embeddings: the model's input embedding is not one (V, D) "
                             "weight of its embedding group; use stream_embeddings=false")
        self.entry: Entry = found[0]
        self.vocab, self.dim = self.entry.shape
        self.capacity = min(capacity, self.vocab)
        self.whole = self.capacity == self.vocab  # the table itself, looked up as it is
        self.rest = [e for e in layout.entries if e is not self.entry]
        self.numel = self.capacity * self.dim + sum(e.numel for e in self.rest)
        self.nbytes = 4 * self.numel
        self._const: dict[tuple, torch.Tensor] = {}  # per device / shape, made once

    def _fp32(self, buf: torch.Tensor) -> torch.Tensor:
        return buf[:self.nbytes].view(torch.float32)

    def views(self, buf: torch.Tensor) -> list[torch.Tensor]:
        """One view per layout entry (the token table as (capacity, D)) in ``buf``."""
        fp, at, out = self._fp32(buf), self.capacity * self.dim, []
        for e in self.layout.entries:
            if e is self.entry:
                out.append(fp[:self.capacity * self.dim].view(self.capacity, self.dim))
            else:
                out.append(fp[at:at + e.numel].view(e.shape))
                at += e.numel
        return out

    def make_params(self, buf: torch.Tensor) -> list[nn.Parameter]:
        return [nn.Parameter(v, requires_grad=False) for v in self.views(buf)]

    def check(self, ids: torch.Tensor) -> None:
        if not self.whole and ids.numel() > self.capacity:
            raise ValueError(f"stream_embeddings: a forward of {ids.numel()} tokens needs more "
                             f"than the {self.capacity} embedding rows planned (max(batch_size, "
                             "16) x (seq_len + max_new_tokens)); raise seq_len or batch_size")

    def spans(self, ids: torch.Tensor, buf: torch.Tensor) -> Spans:
        """What a forward over ``ids`` needs filled in ``buf``: the rows it looks up (or the
        whole table), then every other entry whole."""
        fp, dev = self._fp32(buf), buf.device
        if self.whole:
            out = [(self._starts(self.entry.offset, dev), self.entry.numel,
                    fp[:self.entry.numel])]
        else:
            n = ids.numel()
            starts = self.entry.offset + ids.reshape(-1).to(torch.int64) * self.dim
            out = [(starts, self.dim, fp[:n * self.dim])]
        at = self.capacity * self.dim
        for e in self.rest:
            out.append((self._starts(e.offset, dev), e.numel, fp[at:at + e.numel]))
            at += e.numel
        return out

    def compact(self, ids: torch.Tensor) -> torch.Tensor:
        """Indices into the filled rows, shaped as ``ids``: token t of the flattened batch
        reads row t."""
        key = ("compact", ids.device, tuple(ids.shape))
        if key not in self._const:
            self._const[key] = torch.arange(ids.numel(), device=ids.device).view(ids.shape)
        return self._const[key]

    def _starts(self, offset: int, device: torch.device) -> torch.Tensor:
        key = ("start", device, offset)
        if key not in self._const:
            self._const[key] = torch.full((1,), offset, dtype=torch.int64, device=device)  # a
            # fill on the device: no host copy inside a step
        return self._const[key]
