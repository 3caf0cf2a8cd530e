"""Memory arithmetic the method plans share: what one pass holds, what backward saves, how
much host memory a pinned buffer takes, and what the end-of-run digest holds.

Activations. Hidden states stay fp32 under autocast (embeddings, layer norms and residual adds
are fp32): 4 B x B x T x D each. On top, the largest moment of one pass, from the Hugging Face
OPT / Llama layer code (``moments``): linear outputs in the compute dtype; sdpa
memory-efficient kernels (no T x T); under autocast a bf16 copy of the weight in use (not
cached: our parameters do not require grad); the head on B rows. Prompt data is padded: a
(B, 1, T, T) bool mask lives all step and sdpa converts it to the query dtype; synthetic data
has none.
"""
from __future__ import annotations

from workbench.presets import Preset

#: A CUDA process's device memory outside torch's allocator (context, cuBLAS and kernel modules):
#: NVML sees it, torch does not. H100, torch 2.11: 769-789 MiB over torch's reserved bytes in
#: three zo-offload runs (``benchmarks/nvml_probe.py``).
CONTEXT_BYTES = 800 * 2**20
WORKSPACE_BYTES = 32 * 2**20  # cuBLAS workspace (Hopper default), allocated through torch

MiB = 2 ** 20
#: Pinned host buffers of this many bytes and more are page-locked at their exact size
#: (``engine/device/pinned.py``); smaller ones come from torch's caching host allocator.
PIN_EXACT = 64 * MiB
#: GPU slots a transfer keeps beyond prefetch_depth, by kind (``engine/stream``): plain and
#: mirror, the block computing and the one whose offload still reads its slot; sr, one (the slot
#: is free once encoded); a frozen base, one (the wire the next copy may fill while the last
#: is still to be decoded); compute-dtype slots, two (the slot goes down as it is).
SPARE_SLOTS = {"plain": 2, "mirror": 2, "sr": 1, "frozen": 1, "compute": 2}
#: The recipe evaluates in batches of max(batch_size, EVAL_ROWS) rows
EVAL_ROWS = 16


def block_slot_count(cfg, kind: str) -> int:
    """GPU block slots of a streamed run: ``block_slots``, or auto's prefetch_depth + the
    transfer's ``SPARE_SLOTS``."""
    return cfg.prefetch_depth + SPARE_SLOTS[kind] if cfg.block_slots == "auto" \
        else int(cfg.block_slots)


def embed_rows(cfg) -> int:
    """Rows of the token table a streamed embedding's compute-dtype form holds at most
    (``engine/stream/embed_rows.py``): one per token of the largest forward a run makes, an
    evaluation batch of max(batch_size, EVAL_ROWS) rows of a seq_len prompt and the
    max_new_tokens it generates (the table's own rows where it has fewer)."""
    return max(cfg.batch_size, EVAL_ROWS) * (cfg.seq_len + cfg.max_new_tokens)


def form_bytes(n: int, n_mat: int, item: int = 2) -> int:
    """``FrozenForm.nbytes``: n_mat matrix elements in ``item`` B, padded to 16 B, the rest fp32."""
    return (item * n_mat + 15) // 16 * 16 + 4 * (n - n_mat)


def ends_work_bytes(cfg, p: Preset) -> tuple[int, int]:
    """(the head's form, the embedding's row form) in bytes, under compute-dtype slots with
    stream_embeddings: the head's matrix (V x proj) in the compute dtype, the rest fp32; the
    token table's rows a forward looks up (``embed_rows``, at most V) in fp32, and the
    embedding's other entries whole."""
    proj = p.hf.get("word_embed_proj_dim", p.hidden)
    ne, nh, table = p.embed_params(), p.head_params(), p.vocab * proj
    return (form_bytes(nh, min(table, nh)),
            4 * (min(p.vocab, embed_rows(cfg)) * proj + max(ne - table, 0)))


#: Threads that hash and square pieces of a group at most (``engine/groups.py::fingerprint``).
FINGERPRINT_THREADS = 32
#: Host bytes a fingerprint thread holds beside the group while it squares a piece: numpy's
#: einsum casts each of its two operands to fp64 through one 8192-element buffer.
SCRATCH_BYTES = 2 * 8192 * 8
#: fp64 cast buffers of the digest's threads, all of them at once
FINGERPRINT_SCRATCH_BYTES = FINGERPRINT_THREADS * SCRATCH_BYTES


def pinned_bytes(nbytes: int, cuda: bool) -> int:
    """Host bytes of a pinned request: buffers of 64 MiB and more are page-locked at their exact
    size (``engine/device/pinned.py``, from ``PIN_EXACT`` up); smaller ones come from torch's
    caching host allocator, which
    rounds up to a power of two. No pinning, no rounding, on the CPU."""
    if not cuda or nbytes <= 1 or nbytes >= PIN_EXACT:
        return nbytes
    return 1 << (nbytes - 1).bit_length()


def moments(p: Preset, rows: int, t: int, amp: bool, masked: bool,
             cast: bool = True) -> dict[str, int]:
    """Bytes of the largest moment of one pass of the embedding, a block and the head, on top of
    the fp32 hidden states held outside it (``cast``: autocast casts the block's weights; not
    those of a frozen block held in the compute dtype)."""
    a, wc = (2, 2) if amp else (4, 0)  # activation bytes; bf16 copy of the weight in use
    n, d, f, v = rows * t, p.hidden, p.ffn, p.vocab
    kv = p.hf.get("num_key_value_heads", p.heads) / p.heads
    mask = n * t * (2 * a + 1) if masked else 0  # bool mask -> additive float (+ aligned copy)
    if p.family == "opt":
        wb = wc * cast  # the weight's cast copy
        attn = n * d * (4 + 5 * a) + mask + wb * d * d  # ln out, q k v, sdpa out + its copy
        mlp = max(n * d * (8 + wc) + a * n * f + wb * d * f,  # fc1: h_mid, ln out (+cast), out
                  4 * n * d + 2 * a * n * f)  # relu: input and output beside h_mid
        embed = 12 * n * d  # token + position embeddings + their sum
    else:  # ln out, q k v, rotary q k (fp32 by type promotion) + temporaries, sdpa casts, out
        wb = wc * cast
        attn = n * d * (4 + a * (2 + 3 * kv) + 4 * (1 + kv) + 4 + a) + mask + wb * d * d
        mlp = 8 * n * d + 3 * a * n * f + wb * d * f  # h_mid, ln out, silu(gate), up, product
        embed = 4 * n * d
    head = 8 * rows * d + wc * v * p.hf.get("word_embed_proj_dim", d) + a * rows * v
    return {"embed": int(embed), "block": int(max(attn, mlp)), "head": int(head)}


def saved_activations(p: Preset, rows: int, t: int, amp: bool) -> int:
    """Activations one block saves for backward (fo): norm and linear inputs (the q, k, v
    projections each save their own bf16 cast under amp), q k v + output for sdpa, MLP outputs."""
    a, n = (2 if amp else 4), rows * t
    per_d = 4 + (6 if amp else 4) + 5 * a + 4 + (2 if amp else 4)
    return n * p.hidden * per_d + n * p.ffn * (a if p.family == "opt" else 4 * a)
