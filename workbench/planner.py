"""Planner: predict a run's memory, PCIe traffic and step time from the preset, and refuse what
cannot fit. Pure arithmetic (no model is built, torch is not imported), so it plans opt-175b on a
laptop. Rates: ``workbench.calibration`` (the brief's H200 figures, a GPU table, or this machine).
Longer than our usual module on purpose: one arithmetic serves the memory model, the time model
and the fit advice, and a third of the file is the assumptions written out below.

Memory (n = elements of one block, B rows, T = seq_len, D hidden, F ffn, V vocab):
  Parameters as the engines hold them (their ``gpu_param_bytes``). mezo: every group in fp32.
    zo-offload: embedding + head + resident blocks; prefetch_depth + 2 fp32 slots of a block
    (+ 1 under master=compressed-sr: a slot is free once encoded); a copy of a tied LM-head
    weight in the head's compute dtype (``engine/zo/tied.py``: bf16 / fp16 under amp, else fp32).
    A compressed codec adds two wire buffers (one per direction, shared by the slots) and,
    with master=fp32 (the mirror transfer of ``engine/stream/transfers.py``), a bf16 delta per slot.
    reuse_buffers=false: fresh buffers, freed across streams only once their events complete,
    while the host enqueues a whole step: up to every streamed block at once (the allocator
    syncs rather than failing, so the fit check counts only the slots' number of them).
    forward-grad: zo-offload + an fp32 tangent for every group (``ForwardGradEngine`` leaves
    each group's weights bound as duals until the step's dual level ends, so the tangents of all
    blocks accumulate within a step; measured on CPU). fo: fp32 params, grads, AdamW m and v,
    and under autocast a bf16 copy of every weight (its cast cache keeps them for backward).
    fo-offload: compute weights + grads in the compute dtype (2 B under amp, else 4), up to
    three slots of min(subgroup_size, 8 Mi) elements (fp32 p, m, v, and g under amp), the
    gpu_resident_ratio share of p, m, v.
  Activations. Hidden states stay fp32 under autocast (embeddings, layer norms and residual adds
    are fp32): 4 B x B x T x D each. Live across blocks: mezo 1, zo-offload 2 (+ and - travel
    together), forward-grad 2 (primal, tangent). ``BlockAdapter.embed`` keeps its ``_Captured``
    exception, whose traceback cycle holds the embedding frame until the GC runs: 3 hidden states
    per embedding call for OPT (token + position embeddings + sum), 1 for Llama (measured on
    CPU). On top, the largest moment of one pass, from the Hugging Face OPT / Llama layer code
    (``_moments``): linear outputs in the compute dtype; sdpa memory-efficient kernels (no T x T;
    forward-grad uses the math backend: scores + probabilities, dual); under autocast a bf16 copy
    of the weight in use (not cached: our parameters do not require grad); the head on B rows.
    Prompt data is padded: a (B, 1, T, T) bool mask lives all step and sdpa converts it to the
    query dtype; synthetic data has none. Prompt batches are planned at T = seq_len (an upper
    bound). Evaluation (max(B, 16) rows, one pass) counts towards the peak as it does in a run.
    Without the fused kernel z is materialised (4 B per element of a group + philox temporaries).
    codec with master=compressed-sr: the stochastic rounding is one fused kernel with nothing
    extra (its torch path, without Triton: about 23 B per block element beside compute); the
    mirror transfer, a 4 B delta per element.
  ``peak_gpu_mem_bytes``: the torch allocator peak (what the run summary reports), with 32 MiB of
    cuBLAS workspace; ``nvml_gpu_mem_bytes`` adds ``CONTEXT_BYTES`` (800 MiB: context and
    libraries); no fragmentation (measured: 0.04-0.5 GB of reserved-but-free blocks).
    gpu_mem_limit_gb caps the NVML-level figure (GB = 10^9 bytes; figures here are in GiB).
  Host: the buffers above that live there; pinned ones of 64 MiB and more at their exact size
    (``engine/stream/pinned.py``), smaller ones rounded up to a power of two as torch's pinned
    allocator does. The save's digest and norm, and a resume, hold one group in fp32 at a
    time (plus 4 MiB of fp64 buffers). checkpoint_every > 0: a
    snapshot holds an fp32 copy of every group until it is written (pinned for GPU groups,
    pageable clones of streamed blocks). The fit check adds 3 GiB for the process (1 GiB on the
    CPU, without CUDA's libraries and context), and counts what the process already holds as
    available to it.
Time: a block pass takes max(FLOPs / effective FLOP/s, weight bytes / memory bandwidth), FLOPs =
  2 x params x tokens + QK^T and AV (half when causal). A step is max(device time, host launch
  time, the mirror codec's host pass). zo-offload, per streamed block: max(both passes + its
  perturbation, upload, offload) with overlap (both directions share the link at the measured
  both-at-once rate), their sum without; resident blocks, embedding and head add compute.
  Perturbation: 4 regenerations per element per step (forward-grad 2). fused_update=false: a second round trip and
  an update pass. reuse_buffers=false: transfers x ``reuse_off_factor``. fo: forward, backward
  (2x), AdamW. fo-offload: + the fp32 gradient flush (during backward) and the interleaved CPU /
  GPU update (GPU share from update_stride; auto balances both sides). Pipeline fill is hidden by
  the loop running ahead. ZO activation memory was checked against the engines on the CPU
  (profiler, exact to 1%); fo and fo-offload are structural estimates.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from workbench.calibration_shapes import host_key
from workbench.config import ConfigError, RunConfig
from workbench.flops import block_flops
from workbench.planner_lora import adapter_params, codec_bytes, frozen_stream, matrix_bytes
from workbench.presets import PRESETS, Preset

GiB, MiB = 2 ** 30, 2 ** 20
#: A CUDA process's device memory outside torch's allocator (context, cuBLAS and kernel modules):
#: NVML sees it, torch does not. H100, torch 2.11: 769-789 MiB over torch's reserved bytes in
#: three zo-offload runs (benchmarks/nvml_probe.py, 2026-11-23).
CONTEXT_BYTES = 800 * MiB
WORKSPACE_BYTES = 32 * MiB  # cuBLAS workspace (Hopper default), allocated through torch
HOST_PROCESS_BYTES = 3 * GiB  # Python, torch, CUDA libraries, transformers
HOST_PROCESS_CPU_BYTES = 1 * GiB  # without CUDA (a tiny CPU run peaks near 0.5 GiB)
EVAL_ROWS = 16  # the recipe evaluates in batches of max(batch_size, 16)
OP_LAUNCH_S = 5e-5  # host time of one perturbation kernel or one transfer launch
FO_SLOTS, FO_SLOT_ELEMS = 3, 1 << 23  # fo-offload's GPU slots (``engine/fo/offload.py``'s
#                                        N_SLOTS, SLOT_PIECE: a slot holds a piece of a subgroup)
FO_UPCAST_ELEMS = 1 << 24  # each of fo-offload's 2 fp32 gradient staging buffers (its CHUNK)
SAVE_KEY = "save / resume: one group as fp32"
# fp64 cast buffers of the digest's threads: ``engine.groups`` MAX_THREADS * SCRATCH_BYTES
FINGERPRINT_SCRATCH_BYTES = 32 * 2 * 8192 * 8
HOST_KEYS = ("adamw_cpu_per_s", "cpu_downcast_per_s", "host_update_per_s", "host_memcpy_bps",
             "host_ram_bytes", "host_mem_available_bytes")


class PlanError(ConfigError):
    """The run would not fit: each problem names what, by how much and the knob that helps."""


@dataclass(frozen=True)
class Plan:
    """Predictions for one run (bytes, seconds); ``*_breakdown``: name -> bytes."""

    method: str
    model: str
    device: str
    gpu: str | None
    params: int
    peak_gpu_mem_bytes: int
    nvml_gpu_mem_bytes: int
    gpu_param_bytes: int
    host_mem_bytes: int
    pinned_host_bytes: int
    h2d_bytes_per_step: int
    d2h_bytes_per_step: int
    pcie_bytes_per_step: int
    tokens_per_step: int
    step_seconds: float
    compute_seconds: float
    transfer_seconds: float
    tokens_per_s: float
    gpu_mem_available_bytes: int | None
    host_mem_available_bytes: int | None
    fits_gpu: bool
    fits_host: bool
    gpu_breakdown: dict
    host_breakdown: dict
    notes: tuple

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "notes": list(self.notes)}


def preset_of(model: str) -> Preset:
    """The preset, or a Preset read from the config.json of a local folder or a hub id."""
    if model in PRESETS:
        return PRESETS[model]
    from workbench.models.hub import config_path

    c = json.loads(config_path(model).read_text())
    opt = c.get("model_type") == "opt"
    hf = {k: c[k] for k in ("num_key_value_heads", "word_embed_proj_dim", "do_layer_norm_before")
          if k in c}
    hf["tie_word_embeddings"] = c.get("tie_word_embeddings", opt)
    try:
        return Preset("opt" if opt else "llama", c["hidden_size"], c["num_hidden_layers"],
                      c["num_attention_heads"], c.get("ffn_dim") or c["intermediate_size"],
                      c["vocab_size"], c.get("max_position_embeddings", 2048), "local", hf=hf)
    except KeyError as e:
        raise ConfigError([f"model: {model}: config.json has no {e.args[0]!r}, which the "
                           "planner needs"]) from None


PIN_EXACT = 64 * MiB  # ``engine.pinned.HostMemory.LARGE``: from here on, registered at exact size


def _pin(nbytes: int, cuda: bool) -> int:
    """Host bytes of a pinned request: buffers of 64 MiB and more are page-locked at their exact
    size (``engine/stream/pinned.py``); smaller ones come from torch's caching host allocator, which
    rounds up to a power of two. No pinning, no rounding, on the CPU."""
    if not cuda or nbytes <= 1 or nbytes >= PIN_EXACT:
        return nbytes
    return 1 << (nbytes - 1).bit_length()


def _moments(p: Preset, rows: int, t: int, amp: bool, masked: bool,
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


def _saved(p: Preset, rows: int, t: int, amp: bool) -> int:
    """Activations one block saves for backward (fo): norm and linear inputs (the q, k, v
    projections each save their own bf16 cast under amp), q k v + output for sdpa, MLP outputs."""
    a, n = (2 if amp else 4), rows * t
    per_d = 4 + (6 if amp else 4) + 5 * a + 4 + (2 if amp else 4)
    return n * p.hidden * per_d + n * p.ffn * (a if p.family == "opt" else 4 * a)


def _profile(cfg: RunConfig, gpu: str | None, calib: dict | None) -> tuple[dict, list[str]]:
    from workbench import calibration as cal

    notes, calib = [], calib or {}
    host = {k: calib[k] for k in HOST_KEYS if k in calib}
    try:
        table = cal.gpu_profile(gpu) if gpu else None
    except ValueError as e:
        raise ConfigError([str(e)]) from None
    if cfg.device == "cpu":
        if calib.get("device") != "cpu":
            notes.append("CPU rates are measure-free defaults (python -m workbench calibrate "
                         "--device cpu measures them)")
        return {**cal.cpu_profile(), **(calib if calib.get("device") == "cpu" else host)}, notes
    if table:
        return {**table, **host}, notes
    if calib.get("device") == "cuda":
        notes.append(f"rates and GPU memory from this machine's calibration "
                     f"({calib.get('gpu_name')})")
        if calib.get("method_version", 1) < cal.METHOD_VERSION:
            notes.append("the calibration was measured by an older method (bf16 block rates "
                         "paced by the host, both-way PCIe overstated): rerun python -m "
                         "workbench calibrate")
        return {**cal.gpu_profile("h200"), **calib}, notes
    notes.append("uncalibrated: the brief's H200 rates and 139 GiB (pass --gpu NAME or run "
                 "python -m workbench calibrate)")
    return cal.gpu_profile("h200"), notes


def _fo(cfg: RunConfig, p: Preset, prof: dict, e: dict, notes: list[str]) -> None:
    """First-order methods: fill e (memory parts, PCIe bytes, times)."""
    cuda, amp = cfg.device == "cuda", e["amp"]
    # Trained parameters P: with peft=lora the adapters (the frozen base: ``frozen_stream``),
    # whose backward is the input gradients alone (rank-r weight gradients are negligible).
    lora = cfg.peft == "lora"
    P, bwd = (adapter_params(cfg, p), 1) if lora else (p.total_params(), 2)
    cw = 2 if amp else 4  # compute-dtype bytes
    rr = cfg.gpu_resident_ratio if cfg.method == "fo-offload" else 1.0
    if cfg.method == "fo" or not cuda:
        e["dev"].update({"params + grads (fp32)": 8 * P, "AdamW m, v": 8 * P})
        e["dev"]["autocast weight copies"] = 2 * P * amp
        e["gpu_param_bytes"] = 4 * P * cuda
    else:
        piece = min(cfg.subgroup_size, FO_SLOT_ELEMS, P)  # a slot: p, m, v (+ fp32 grads)
        e["dev"].update({"compute weights + grads": 2 * cw * P, "resident optimizer share":
                         int(12 * rr * P), "subgroups in flight": min(FO_SLOTS, -(-P // piece))
                         * (12 + 4 * (cw == 2)) * piece,
                         "gradient upcast staging": 2 * 4 * min(FO_UPCAST_ELEMS, P) * (cw == 2)})
        e["host"]["fp32 master, m, v, grads"] = e["pinned"] = int(16 * (1 - rr) * P)
    e["dev"]["activations (saved + transient)"] = (
        p.num_layers * _saved(p, cfg.batch_size, cfg.seq_len, amp) + e["hb"]
        + 8 * cfg.batch_size * p.vocab + 2 * e["m"]["block"])
    fwd = p.num_layers * e["blk"] + e["eh"]
    e["compute"] = (1 + bwd) * fwd
    e["step"] = (1 + bwd) * fwd + P / prof["adamw_gpu_per_s" if cuda else "adamw_cpu_per_s"]
    if cfg.method == "fo-offload" and cuda:
        pn, k, duplex = (1 - rr) * P, cfg.update_stride, prof["duplex_bps"] / 2
        per_gpu = 12 / duplex + 1 / prof["adamw_gpu_per_s"]  # p, m, v up and down, then update
        per_cpu = 1 / prof["adamw_cpu_per_s"] + 1 / prof["cpu_downcast_per_s"]
        f = per_cpu / (per_gpu + per_cpu) if k == "auto" else (
            1 / int(k) if int(k) > 0 else -int(k) / (1 - int(k)))
        e["h2d"], e["d2h"] = pn * (12 * f + cw * (1 - f)), pn * (12 * f + 4 * (1 - f))
        update = max(f * pn * per_gpu, (1 - f) * pn * per_cpu, (1 - f) * pn * cw / prof["h2d_bps"])
        e["transfer"] = max(e["h2d"], e["d2h"]) / duplex
        e["step"] = (fwd + max(bwd * fwd, (1 - f) * pn * 4 / prof["d2h_bps"]) + update
                     + rr * P / prof["adamw_gpu_per_s"])
        notes.append(f"fo-offload: {f:.0%} of the optimizer subgroups updated on the GPU")
    e["host_t"] = prof["step_overhead_s"] + 3 * (p.num_layers + 2) * prof["launch_s"]


def _zo(cfg: RunConfig, p: Preset, prof: dict, e: dict, notes: list[str]) -> None:
    """ZO methods: fill e (memory parts, PCIe bytes, times)."""
    cuda, masked, rows, t = cfg.device == "cuda", e["masked"], cfg.batch_size, cfg.seq_len
    N, nb, ne, nh = p.num_layers, p.block_params(), p.embed_params(), p.head_params()
    hb, m, dev = e["hb"], e["m"], e["dev"]
    streaming, tied = cfg.method != "mezo", p.hf.get("tie_word_embeddings", True)
    fused = cfg.rng == "philox" and cuda and bool(prof.get("fused_kernel"))
    pr = prof["perturb_fused_per_s" if fused else
              "perturb_torch_per_s" if cfg.rng == "torch" else "perturb_philox_torch_per_s"]
    z = (lambda k: 0) if fused else (  # z materialised, + philox's int64 chunk temporaries
        lambda k: 4 * k + (0 if cfg.rng == "torch" else 80 * min((k + 3) // 4, 1 << 22)))
    r = min(cfg.resident_blocks, N) if streaming else N
    kind = "plain" if cfg.codec == "fp32" else ("sr" if cfg.master == "compressed-sr" else "mirror")
    spare = 1 if kind == "sr" else 2  # ``spare_slots`` of the transfer
    s, slots = N - r, (cfg.prefetch_depth + spare if streaming and r < N else 0)
    dev["embedding + head"] = 4 * (ne + nh)
    dev["resident blocks" if streaming else "blocks"] = 4 * r * nb
    tied_copy = 0
    if cfg.method == "zo-offload" and tied:  # the head's copy of the tied weight
        tied_copy = (2 if e["amp"] else 4) * p.vocab * p.hf.get("word_embed_proj_dim", p.hidden)
        dev["tied head weight copy"] = tied_copy
    up = codec_bytes(cfg.codec, nb)
    down = {"plain": 4 * nb, "sr": up, "mirror": 2 * nb}[kind]
    if slots:
        ahead = s if cuda and cfg.overlap and not cfg.reuse_buffers else slots
        dev["block slots" if cfg.reuse_buffers else "blocks in flight"] = 4 * ahead * nb
        e["elastic"] = 4 * (ahead - slots) * nb
        if kind != "plain":  # shared wires (one per direction) with reuse, else per block
            wires = {"sr": 2 * up, "mirror": up} if cfg.reuse_buffers else {
                "sr": slots * up, "mirror": slots * up}
            dev["codec wire buffers"] = wires[kind]
            if kind == "mirror":
                dev["mirror deltas"] = slots * 2 * nb
        e["pinned"] = s * {"plain": _pin(4 * nb, cuda), "sr": _pin(up, cuda),
                           "mirror": _pin(up, cuda) + _pin(2 * nb, cuda)}[kind]
        if kind == "mirror":  # a pageable fp32 master, a pinned mirror and delta
            e["host"]["block masters (fp32)"] = 4 * s * nb
            e["host"][f"{cfg.codec} mirrors + bf16 deltas"] = e["pinned"]
        else:
            e["host"][f"block masters ({cfg.codec})"] = e["pinned"]
        if cuda and e["pinned"] > 1.1 * s * (4 * nb if kind == "plain" else up + 2 * nb):
            notes.append("blocks under 64 MiB are pinned by torch's allocator, which rounds each "
                         "up to a power of two: pinned host memory is counted as rounded")
    extras = (dev.get("codec wire buffers", 0) + dev.get("mirror deltas", 0)
              if cfg.reuse_buffers else 0)
    e["gpu_param_bytes"] = cuda * (4 * (ne + nh + r * nb) + tied_copy
                                   + (4 * slots * nb + extras) * cfg.reuse_buffers)
    live = 1 if cfg.method == "mezo" else 2
    held = (3 if p.family == "opt" else 1) * hb * live  # embedding frames kept by the adapter
    # SR encode beside compute: the fused kernel holds nothing extra; the torch path about 23 B
    # per element (int64 noise words, int32 noise, mask, rounded, selected, cast)
    blockm = m["block"] + (0 if cuda and prof.get("fused_kernel") else 23 * nb) * (kind == "sr")
    if cfg.method == "forward-grad":  # dual tensors, math-backend attention (scores + probs)
        blockm = 2 * m["block"] + 4 * rows * p.heads * t * t * (2 if e["amp"] else 4)
        # embedding and head tangents live all step; a block's only while it computes
        dev["tangents (embedding, head, one block)"] = 4 * (ne + nh + nb)
        # forward-AD transients per block parameter (dual casts under autocast, the next
        # block's tangent): an empirical 16 B, fitted to the H200 peaks of opt-1.3b / 6.7b bf16
        # (benchmarks/results/methods-fgfix-*.json; the plan was 27-31% under without it)
        dev["forward-AD transients"] = 16 * nb
        notes.append("forward-grad: the embedding's and head's tangents live all step, a block's "
                     "only while it computes (4 B/param); jvp taken as 3x forward FLOPs")
    # the head reads the tied copy in its compute dtype: no autocast cast of that weight
    head_m = m["head"] - (2 * p.vocab * p.hf.get("word_embed_proj_dim", p.hidden)
                          if tied_copy and e["amp"] else 0)
    moments = [m["embed"] + (live - 1) * (hb + held // live), live * hb + held + blockm,
               live * hb + held + head_m]
    moments += [held + z(max(ne, nb, nh))] if not streaming else [  # held: not yet collected
        2 * hb + held + max(z(nb) + 4 * nb * (kind == "mirror"), z(ne))]  # (tied restore: last)
    act = max(moments) + rows * t * t * masked  # + the padding mask, alive all step
    if masked:  # evaluation: one pass over max(B, 16) rows
        er = max(rows, EVAL_ROWS)
        ehb = 4 * er * t * p.hidden
        em = max(_moments(p, er, t, e["amp"], True, e["cast"]).values())
        act = max(act, ehb + held // live * er // rows + em + er * t * t)
    dev["activations"] = act
    # time
    passes, regens = (3, 2) if cfg.method == "forward-grad" else (2, 4)
    c_blk = passes * e["blk"] + regens * nb / pr
    eh_t = passes * e["eh"] + regens * (ne + nh) / pr
    e["compute"] = eh_t + N * c_blk
    # this machine's host seconds per step and per block (a GPU's; on a CPU host time is compute)
    measured = prof.get("host_costs_s", {}).get(host_key(cfg.method, bool(e["amp"]))) \
        if cuda else None
    if measured is not None:
        e["host_t"] = measured[0] + N * measured[1]
    else:
        e["host_t"] = prof["step_overhead_s"] + (N + 2) * (passes * prof["launch_s"]
                                                           + 3 * OP_LAUNCH_S)
    e["step"] = e["compute"]
    if not slots:
        return
    overlap, bw = cfg.overlap and cuda, prof["gpu_mem_bps"]
    if not cuda:  # the CPU engine copies master <-> slot in host memory
        bu = bd = prof["host_memcpy_bps"] / 2
    else:  # with overlap both directions run at once and share the link
        bu, bd = ((prof["duplex_bps"] / 2,) * 2 if overlap else (prof["h2d_bps"], prof["d2h_bps"]))
    factor = 1.0 if cfg.reuse_buffers or not cuda else prof["reuse_off_factor"]
    x_up = factor * up / bu + (up + 4 * nb) / bw * (kind != "plain")  # + decode on the GPU
    x_dn = factor * down / bd + {"plain": 0, "sr": 30 * nb, "mirror": 14 * nb}[kind] / bw
    rounds = [(c_blk, x_up, x_dn)]
    if not cfg.fused_update:  # flush(): a second round trip with an update pass
        rounds = [(c_blk, x_up, 0.0 if kind == "mirror" else x_dn), (nb / pr, x_up, x_dn)]
        e["compute"] += (ne + nh + N * nb) / pr
        eh_t += (ne + nh + r * nb) / pr
    per = sum(max(c, u, w) if overlap else c + u + w for c, u, w in rounds)
    e["step"] = eh_t + r * c_blk + s * per
    e["h2d"], e["d2h"] = s * up * len(rounds), s * down * (1 if kind == "mirror" else len(rounds))
    e["transfer"] = s * max(sum(u for _, u, _ in rounds), sum(w for _, _, w in rounds))
    if measured is None:  # the measured per-block cost holds the transfers'
        e["host_t"] += s * len(rounds) * 3 * OP_LAUNCH_S
    elif len(rounds) > 1:  # fused_update off: a second streamed pass
        e["host_t"] += s * 3 * OP_LAUNCH_S
    if kind == "mirror":  # one host thread: master += delta, re-encode the mirror
        e["host_t"] = max(e["host_t"], s * nb / prof["host_update_per_s"])
    if not cfg.reuse_buffers and cuda:
        notes.append(f"reuse_buffers=false: transfers {factor:.2f}x slower (the paper's 0.37x "
                     f"ablation; our caching allocator may do better); fits with {slots} in flight")


def _plan(cfg: RunConfig, gpu: str | None, calib: dict | None,
          gpu_avail: int | None = None, host_avail: int | None = None) -> Plan:
    p, cuda, amp = preset_of(cfg.model), cfg.device == "cuda", cfg.amp != "off"
    prof, notes = _profile(cfg, gpu, calib)
    rows, t, masked = cfg.batch_size, cfg.seq_len, cfg.data != "synthetic"
    held = matrix_bytes(cfg)  # a frozen base held in the compute dtype is read, never cast
    cast, wb = amp and held is None, 2 if amp and held else 10 if amp else 4
    rate, bw, proj = prof["flops_bf16" if amp else "flops_fp32"], prof["gpu_mem_bps"], \
        p.hf.get("word_embed_proj_dim", p.hidden)
    # a block runs at its own shape's measured rate where the calibration has it
    blk_rate = prof.get("block_flops_by_shape", {}).get(p.block_key(), {}).get(
        "bf16" if amp else "off", rate)
    e: dict[str, Any] = dict(
        dev={}, host={}, pinned=0, h2d=0, d2h=0, transfer=0.0, elastic=0, gpu_param_bytes=0,
        amp=amp, masked=masked, hb=4 * rows * t * p.hidden, cast=cast,
        m=_moments(p, rows, t, amp, masked, cast),
        blk=max(block_flops(p, rows, t, not masked) / blk_rate,
                p.block_params() * wb / bw),  # fp32 read (+ bf16 cast)
        eh=max(2 * rows * p.vocab * proj / rate, p.vocab * proj * (10 if amp else 4) / bw)
        + 12 * rows * t * p.hidden / bw)  # head on B rows (reads its weight) + embedding gather
    (_fo if cfg.method in ("fo", "fo-offload") else _zo)(cfg, p, prof, e, notes)
    if cfg.peft == "lora":
        frozen_stream(cfg, p, prof, e, notes, _pin)
    step = max(e["step"], e["host_t"]) if cuda else e["step"] + e["host_t"]
    dev, host = e["dev"], e["host"]
    if cuda:
        dev["cuBLAS workspace"] = WORKSPACE_BYTES
    else:  # everything lives in host memory
        host.update({f"{k} (device=cpu)": v for k, v in dev.items()})
        dev = {}
    if cfg.checkpoint_every > 0:  # a snapshot holds a master copy of every group until written
        nb, ne, nh, n = p.block_params(), p.embed_params(), p.head_params(), p.num_layers
        r = min(cfg.resident_blocks, n) if cfg.method in ("zo-offload", "forward-grad") else n
        on_gpu = _pin(4 * ne, cuda) + _pin(4 * nh, cuda) + r * _pin(4 * nb, cuda)  # pinned
        streamed = 2 if cfg.master == "compressed-sr" and cfg.method == "zo-offload" else 4
        host["checkpoint snapshot (master copy)"] = on_gpu + streamed * (n - r) * nb
    # End of run (digest + norm) and resume: one group at a time as fp32 on the host, plus the
    # threads' fp64 buffers (``engine.groups.fingerprint``; a streamed engine decodes a block only
    # when it is reached). It was the whole model once: opt-30b was OOM-killed in its save.
    host[SAVE_KEY] = 4 * max(p.embed_params(), p.block_params(), p.head_params()) + FINGERPRINT_SCRATCH_BYTES
    peak, host_bytes = sum(dev.values()), sum(host.values())
    nvml = peak + CONTEXT_BYTES if cuda else 0
    if cuda:
        gpu_avail = int(prof["gpu_mem_total_bytes"] if gpu_avail is None else gpu_avail)
        if cfg.gpu_mem_limit_gb > 0:
            gpu_avail = min(gpu_avail, int(cfg.gpu_mem_limit_gb * 1e9))
            notes.append(f"gpu_mem_limit_gb={cfg.gpu_mem_limit_gb:g} caps GPU memory at "
                         f"{cfg.gpu_mem_limit_gb * 1e9 / GiB:.2f} GiB (GB = 10^9 B)")
    if host_avail is None:
        host_avail = prof.get("host_mem_available_bytes")
    if host_avail is None:
        import psutil

        host_avail = psutil.virtual_memory().available
    if masked:
        notes.append("prompt data: planned at T = seq_len; real prompts are shorter, so the run "
                     "will use less memory and time")
    tokens = rows * t
    return Plan(cfg.method, cfg.model, cfg.device, (gpu or prof.get("gpu_name")) if cuda else None,
                p.total_params(), peak, nvml, e["gpu_param_bytes"], host_bytes, e["pinned"] * cuda,
                int(e["h2d"]), int(e["d2h"]), int(e["h2d"] + e["d2h"]), tokens, step,
                e["compute"], e["transfer"], tokens / step, gpu_avail if cuda else None, host_avail,
                not cuda or nvml - e["elastic"] <= gpu_avail,
                host_bytes + _process_bytes(cfg) <= host_avail, dev, host, tuple(notes))


def plan(cfg: RunConfig, gpu: str | None = None, calibration: dict | None = None) -> Plan:
    """Predict memory, PCIe bytes and step time of ``cfg``.

    Args:
        cfg: the run (any method, preset or local folder, any knob).
        gpu: a GPU table name (``calibration.GPUS``: h200, h100, a100-40gb, a100-80gb, rtx-4090,
            24gb); None: the calibration's GPU, else the H200.
        calibration: a ``calibrate()`` result (rates, GPU and host memory).
    Raises:
        ConfigError: an unknown ``gpu`` (the message lists the known ones).
    """
    return _plan(cfg, gpu, calibration)


def check_fits(cfg: RunConfig, calibration: dict | None = None, gpu: str | None = None) -> Plan:
    """The plan, or PlanError when GPU or host memory would not fit (GPU not checked for
    device=cpu). Without ``calibration`` it reads this machine's cached one and its available
    RAM (psutil); without ``gpu``, the free GPU memory (``torch.cuda.mem_get_info``, imported
    here only, for device=cuda with CUDA present)."""
    import psutil

    # This process is already part of what the plan counts (_process_bytes): what it holds
    # is available to the run as much as what is free.
    host_avail = None if calibration else (psutil.virtual_memory().available
                                           + psutil.Process().memory_info().rss)
    if calibration is None and gpu is None:
        from workbench.calibration import load_calibration

        calibration = load_calibration(cfg.device)
    gpu_avail = None
    if cfg.device == "cuda" and gpu is None:
        import torch

        if torch.cuda.is_available():
            gpu_avail = torch.cuda.mem_get_info()[0] + CONTEXT_BYTES  # ours is out of 'free'
    pl = _plan(cfg, gpu, calibration, gpu_avail, host_avail)
    problems = _problems(cfg, pl, lambda c: _plan(c, gpu, calibration, gpu_avail, host_avail))
    if problems:
        raise PlanError(problems)
    return pl


def _process_bytes(cfg: RunConfig) -> int:
    """Host memory of the process itself, beside the plan's buffers."""
    return HOST_PROCESS_BYTES if cfg.device == "cuda" else HOST_PROCESS_CPU_BYTES


def _gib(x: float) -> str:
    return f"{x / GiB:,.1f} GiB"


def _problems(cfg: RunConfig, pl: Plan, replan) -> list[str]:
    """What does not fit, by how much, and each knob that helps (with its own plan's figure)."""
    out, n = [], preset_of(cfg.model).num_layers

    def alt(**changes) -> Plan | None:
        try:
            return replan(cfg.replace(**changes))
        except ConfigError:
            return None

    def report(what, need, avail, where, parts, extra, cands, key, fits) -> str:
        big = sorted(parts.items(), key=lambda kv: -kv[1])[:3]
        top = ", ".join(f"{k} {_gib(v)}" for k, v in big)
        tips = [f"{why} ({_gib(getattr(q, key))}{', fits' if getattr(q, fits) else ''})"
                for why, ch in cands if (q := alt(**ch)) and getattr(q, key) < getattr(pl, key)]
        return (f"{what}: {cfg.method} on {cfg.model} needs {_gib(need)} (largest: {top}; {extra})"
                f" but {_gib(avail)} are available{where}: short by {_gib(need - avail)}; "
                + ("try " + "; ".join(tips) if tips else "no single knob makes it fit"))

    if not pl.fits_gpu:
        cands = []
        if cfg.method in ("mezo", "fo"):
            cands.append(("method=zo-offload streams the blocks", {"method": "zo-offload"}))
        if cfg.method == "fo":
            cands.append(("method=fo-offload keeps AdamW on the host", {"method": "fo-offload"}))
        if cfg.resident_blocks and cfg.method in ("zo-offload", "forward-grad"):
            r = min(cfg.resident_blocks, n)
            best = max([k for k in range(r) if (q := alt(resident_blocks=k)) and q.fits_gpu] or [0])
            cands.append((f"resident_blocks={r} keeps {r} blocks on the GPU: set resident_blocks="
                          f"{best}", {"resident_blocks": best}))
        if cfg.prefetch_depth > 1:
            spare = 1 if cfg.codec != "fp32" and cfg.master == "compressed-sr" else 2
            cands.append((f"prefetch_depth=1 ({1 + spare} slots, not "
                          f"{cfg.prefetch_depth + spare})", {"prefetch_depth": 1}))
        if cfg.codec != "fp32":
            cands.append(("codec=fp32 drops the wire buffers beside the slots",
                          {"codec": "fp32", "master": "fp32"}))
        if cfg.amp == "off":
            cands.append(("amp=bf16 halves activation intermediates", {"amp": "bf16"}))
        if cfg.batch_size > 1:
            cands.append(("a smaller batch_size", {"batch_size": max(1, cfg.batch_size // 4)}))
        cap = (f" (gpu_mem_limit_gb={cfg.gpu_mem_limit_gb:g} caps it; 0 = the whole GPU)"
               if cfg.gpu_mem_limit_gb > 0 else "")
        out.append(report("gpu memory", pl.nvml_gpu_mem_bytes, pl.gpu_mem_available_bytes,
                          f" on {pl.gpu}{cap}", pl.gpu_breakdown, "+ CUDA context", cands,
                          "nvml_gpu_mem_bytes", "fits_gpu"))
    if not pl.fits_host:
        cands = []
        if cfg.device == "cpu":
            cands.append(("device=cuda with method=zo-offload keeps only block masters here",
                          {"device": "cuda", "method": "zo-offload"}))
        if cfg.checkpoint_every:
            cands.append(("checkpoint_every=0 drops the self-copy", {"checkpoint_every": 0}))
        if cfg.method in ("zo-offload", "forward-grad") and cfg.master == "fp32":
            cands.append(("codec=bf16 master=compressed-sr stores bf16 masters",
                          {"codec": "bf16", "master": "compressed-sr"}))
        if cfg.method == "fo-offload":
            cands.append(("method=zo-offload needs no optimizer state", {"method": "zo-offload"}))
        out.append(report("host memory", pl.host_mem_bytes + _process_bytes(cfg),
                          pl.host_mem_available_bytes, "", pl.host_breakdown,
                          f"+ {_gib(_process_bytes(cfg))} for the process", cands,
                          "host_mem_bytes", "fits_host"))
    return out


def suggest(cfg: RunConfig, gpu_mem_budget_bytes: int, gpu: str | None = None,
            calibration: dict | None = None, device: str = "cuda") -> list[dict[str, Any]]:
    """zo-offload settings (resident_blocks 0..N x codec / master) whose NVML-level GPU memory
    fits ``gpu_mem_budget_bytes``, best predicted tokens/s first; other knobs as in ``cfg``.
    ``device="cpu"`` ranks them for a CPU run (no GPU memory: every setting fits)."""
    base = cfg.replace(method="zo-offload", device=device, gpu_mem_limit_gb=0.0)
    keys = ("tokens_per_s", "step_seconds", "peak_gpu_mem_bytes", "nvml_gpu_mem_bytes",
            "host_mem_bytes", "pcie_bytes_per_step", "fits_host")
    out = []
    for codec, master in [("fp32", "fp32"), ("bf16", "fp32"), ("bf16", "compressed-sr"),
                          ("fp16", "fp32"), ("fp16", "compressed-sr"), ("fp8-e4m3", "fp32"),
                          ("fp8-e5m2", "fp32")]:
        for r in range(preset_of(cfg.model).num_layers + 1):
            pl = plan(base.replace(codec=codec, master=master, resident_blocks=r), gpu, calibration)
            if pl.nvml_gpu_mem_bytes > gpu_mem_budget_bytes:
                break  # more resident blocks only need more
            out.append({"codec": codec, "master": master, "resident_blocks": r,
                        **{k: getattr(pl, k) for k in keys}})
    return sorted(out, key=lambda d: (-d["tokens_per_s"], d["nvml_gpu_mem_bytes"]))
