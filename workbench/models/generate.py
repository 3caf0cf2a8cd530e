"""Greedy decoding over the block adapter's pieces, with no KV cache.

Each new token is one pass over all the blocks for the whole batch (the prompts plus what has been
generated so far), so an engine that streams blocks through the GPU decodes with the same block
order it trains with: ``forward`` may upload, run and drop each block as it likes. The cost is
O(new tokens x sequence) instead of a cache's O(new tokens), acceptable for evaluation on short
answers.
"""
from __future__ import annotations

from typing import Callable

import torch

from workbench.models.adapter import BlockAdapter
from workbench.models.head_loss import Head

#: Token ids (B, T) and attention mask (B, T) -> final hidden states (B, T, D), before the head.
Forward = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def adapter_forward(adapter: BlockAdapter) -> Forward:
    """``Forward`` of a model whose blocks are all resident: embed, then every block."""

    def forward(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden, ctx = adapter.embed(input_ids, attention_mask)
        for block in adapter.blocks:
            hidden = adapter.run_block(block, hidden, ctx)
        return hidden

    return forward


@torch.no_grad()
def greedy_decode(forward: Forward, head: Head, prompts: list[list[int]], max_new_tokens: int,
                  eos_id: int | None, pad_id: int,
                  device: torch.device | str = "cpu") -> list[list[int]]:
    """The argmax continuation of each prompt, up to ``max_new_tokens`` tokens or EOS.

    Rows are right-padded; a row's next token is read at its own last position and written just
    after it, so rows of different lengths decode together. Returns each row's new tokens, the EOS
    included when one was produced.
    """
    n = len(prompts)
    lengths = [len(p) for p in prompts]
    ids = torch.full((n, max(lengths) + max_new_tokens), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, p in enumerate(prompts):
        ids[r, :len(p)] = torch.tensor(p, dtype=torch.long)
        mask[r, :len(p)] = 1
    out: list[list[int]] = [[] for _ in range(n)]
    live = set(range(n))
    for _ in range(max_new_tokens):
        width = max(lengths)
        hidden = forward(ids[:, :width].to(device), mask[:, :width].to(device))
        rows = torch.arange(n, device=hidden.device)
        last = hidden[rows, torch.tensor(lengths, device=hidden.device) - 1]
        nxt = head(last).argmax(-1).tolist()  # the host picks the rows that go on: a sync per token
        for r in sorted(live):
            out[r].append(nxt[r])
            ids[r, lengths[r]], mask[r, lengths[r]] = nxt[r], 1
            lengths[r] += 1
            if nxt[r] == eos_id:
                live.discard(r)
        if not live:
            break
    return out
