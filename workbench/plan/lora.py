"""Planner arithmetic of encoded blocks and adapter runs (``peft=lora``): a codec's bytes,
adapter sizes, a frozen block's encoded bytes, and the frozen stream's memory, PCIe traffic and
step time. Pure arithmetic, as ``planner.py`` (which calls ``frozen_stream`` after the
method's plan).

Per block (n elements, D hidden, F ffn, kv the key/value width, r the LoRA rank):
  Adapters: r x (in + out) per target module, fp32, resident on the GPU in every method.
  Base bytes by ``base_codec`` (as ``engine/codecs/base.py``): fp32 4n, bf16 / fp16 2n,
  fp8-e4m3 codec bytes (1 B + an fp32 scale per 256), int8 1 B per matrix element (padded to
  4) + 4 B per matrix row + 4 B per 1-D element (biases, norms stay fp32).
  Device form of a base block (``engine/codecs/frozen_form.py``, every method): fp32 4n for
  base_codec=fp32; else the matrices in the amp dtype (2 B, fp32 without amp), padded to 16 B,
  then the 1-D tail in fp32. Under amp those matrices are not cast again in each pass (no
  autocast weight copy, 2 B read per weight instead of 4 + a cast).
  zo-offload: H2D = streamed blocks x base bytes per step, D2H = 0 (nothing goes down; an
  unfused update touches only the resident adapters). A streamed block costs max(its two
  passes + the adapter perturbation + its decode, its upload) with overlap (the link runs one
  way, at the H2D rate; compressed blocks are decoded on the compute stream), their sum
  without. Host: the encoded base, pinned. GPU: prefetch_depth + 1 slots
  (``FrozenTransfer.spare_slots``): fp32 slots, or for compressed codecs one wire buffer per
  slot and one decoded block in its device form shared by all (fresh ones per block in flight
  without reuse_buffers); no tied head weight copy (the embedding is frozen, never perturbed);
  the adapters. Resident blocks and mezo's blocks are held in the device form too.
  forward-grad streams the same way; its jvp runs primal and tangent through the frozen base
  (2x forward FLOPs: no weight tangent but the adapters'), regenerates z twice per element
  (tangent, update), and holds one block's adapter tangent (4 B/param).
  fo / fo-offload: ``fo.plan_fo`` plans AdamW over the adapters (backward = input gradients,
  1x forward); the frozen base lies on the device as mezo holds it (blocks in their device
  form), and under autocast the bf16 / fp16 casts of its fp32-held weights (embedding, head;
  the blocks too with base_codec=fp32) are saved for backward (2 B/param).
"""
from __future__ import annotations

from typing import Any

from workbench.config import ZO_STATE_SLOTS, RunConfig, zo_passes
from workbench.plan.memory import block_slot_count, pinned_bytes
from workbench.plan.wire import codec_bytes, zo_regens
from workbench.presets import Preset

DEFAULT_TARGETS = ("q_proj", "v_proj")  # as ``models/lora.py`` for both families


def block_matrices(p: Preset) -> dict[str, tuple[int, int]]:
    """(out, in) of each linear module of a block, by module name."""
    d, f = p.hidden, p.ffn
    if p.family == "opt":
        return {"q_proj": (d, d), "k_proj": (d, d), "v_proj": (d, d), "out_proj": (d, d),
                "fc1": (f, d), "fc2": (d, f)}
    kv = p.hf.get("num_key_value_heads", p.heads) * (d // p.heads)
    return {"q_proj": (d, d), "k_proj": (kv, d), "v_proj": (kv, d), "o_proj": (d, d),
            "gate_proj": (f, d), "up_proj": (f, d), "down_proj": (d, f)}


def lora_block_params(cfg: RunConfig, p: Preset) -> int:
    """Adapter elements of one block: r x (in + out) per target."""
    mats = block_matrices(p)
    names = [t.strip() for t in cfg.lora_targets.split(",")] if cfg.lora_targets \
        else DEFAULT_TARGETS
    return sum(cfg.lora_rank * sum(mats[t]) for t in names if t in mats)


def adapter_params(cfg: RunConfig, p: Preset) -> int:
    """Adapter elements of the whole model."""
    return p.num_layers * lora_block_params(cfg, p)


def base_block_bytes(codec: str, p: Preset) -> int:
    """Encoded bytes of one frozen block in ``codec``."""
    n = p.block_params()
    if codec != "int8":
        return codec_bytes(codec, n)
    mats = block_matrices(p).values()
    n_mat = sum(o * i for o, i in mats)
    return (n_mat + 3) // 4 * 4 + 4 * sum(o for o, _ in mats) + 4 * (n - n_mat)


def form_bytes(cfg: RunConfig, p: Preset) -> int:
    """Device bytes of one frozen base block in its form (as ``FrozenForm.nbytes``)."""
    n = p.block_params()
    item = matrix_bytes(cfg)
    if item is None:
        return 4 * n
    n_mat = sum(o * i for o, i in block_matrices(p).values())
    return (item * n_mat + 15) // 16 * 16 + 4 * (n - n_mat)


def matrix_bytes(cfg: RunConfig) -> int | None:
    """Bytes per matrix weight of a frozen block on the device (``frozen_form.matrix_dtype``):
    None where no form applies (no adapters, or base_codec=fp32)."""
    if cfg.peft != "lora" or cfg.base_codec == "fp32":
        return None
    return 2 if cfg.amp != "off" else 4


def frozen_stream(cfg: RunConfig, p: Preset, prof: dict, e: dict[str, Any],
                  notes: list[str]) -> None:
    """Turn ``zo.plan_zo``'s (or ``fo.plan_fo``'s) plan of the same run into the adapter run's
    (``e`` in place)."""
    cuda, dev, n_blocks, nb = cfg.device == "cuda", e["dev"], p.num_layers, p.block_params()
    held = form_bytes(cfg, p)  # one base block on the device (``FrozenForm``)
    if cfg.method in ("fo", "fo-offload"):  # the adapters are ``_fo``'s trained parameters
        cast = matrix_bytes(cfg) != 2  # blocks not held in the compute dtype are cast
        held32 = p.embed_params() + p.head_params() + (n_blocks * nb if cast else 0)
        dev["frozen base"] = 4 * (p.embed_params() + p.head_params()) + n_blocks * held
        e["gpu_param_bytes"] += cuda * dev["frozen base"]
        # autocast's casts of the fp32-held base, saved by autograd for the input gradients
        dev["autocast weight copies"] = dev.get("autocast weight copies", 0) + 2 * held32 * e["amp"]
        return
    nl = adapter_params(cfg, p)
    pr = prof["perturb_fused_per_s" if cuda and prof.get("fused_kernel") else
              "perturb_torch_per_s" if cfg.rng == "torch" else "perturb_philox_torch_per_s"]
    dev["adapters (fp32)"] = 4 * nl
    e["gpu_param_bytes"] += cuda * 4 * nl
    if ZO_STATE_SLOTS[cfg.zo_optimizer]:  # momentum / adam: fp32 state beside the adapters
        dev["optimizer state"] = 4 * ZO_STATE_SLOTS[cfg.zo_optimizer] * nl
        e["gpu_param_bytes"] += cuda * dev["optimizer state"]
    # z per adapter element and query: + (with the update), -2, + (restore) (one-sided: the
    # update, +, - (restore)); a pass per query and sign (one-sided: per query, and one clean)
    passes = zo_passes(cfg.queries, cfg.estimator, cfg.zo_optimizer)
    regens = zo_regens(cfg.queries, cfg.estimator)
    if cfg.method == "forward-grad":  # ... or tangent and update; tangents of one block only
        passes, regens = 2, 2
        for item in ("tangents (embedding, head, one block)", "forward-AD transients"):
            dev.pop(item, None)
        dev["tangents (one block's adapters)"] = 4 * nl // n_blocks
        dev["forward-AD transients"] = 16 * nl // n_blocks  # as ``zo.plan_zo``, per dual param
        notes[:] = [n for n in notes if not n.startswith("forward-grad:")]
        notes.append("forward-grad: only the adapters carry a tangent, one block's at a time; "
                     "jvp taken as 2x forward FLOPs through the frozen base")
    # the passes (or primal + tangent) through the frozen base + the adapters' z
    c_blk = passes * e["blk"] + regens * nl / n_blocks / pr
    e["compute"] = passes * e["eh"] + n_blocks * c_blk
    if cfg.method == "mezo":  # every block in its device form
        e["gpu_param_bytes"] -= cuda * n_blocks * (4 * nb - held)
        dev["blocks"] = n_blocks * held
        e["step"] = e["compute"]
        return
    r = min(cfg.resident_blocks, n_blocks)
    s = n_blocks - r
    e["gpu_param_bytes"] -= cuda * r * (4 * nb - held)
    dev["resident blocks"] = r * held
    if "tied head weight copy" in dev:  # the head reads the frozen embedding itself
        e["gpu_param_bytes"] -= cuda * dev.pop("tied head weight copy")
    up = base_block_bytes(cfg.base_codec, p)
    e["host"].pop("block masters (fp32)", None)
    e["pinned"] = s * pinned_bytes(up, cuda)
    e["host"] = {f"block base ({cfg.base_codec})": e["pinned"], **e["host"]}
    notes.append("frozen stream: H2D only (the base never goes back down)")
    slots = block_slot_count(cfg, "frozen") if s else 0  # ``plan_zo``: a plain one's
    compressed = cfg.base_codec != "fp32"
    if "block slots" in dev:  # reuse_buffers: allocated once
        e["gpu_param_bytes"] -= cuda * dev["block slots"]
        dev["block slots"] = held if compressed else 4 * slots * nb
        dev.update({"codec wire buffers": slots * up} if compressed else {})
        e["gpu_param_bytes"] += cuda * (dev["block slots"] + dev.get("codec wire buffers", 0))
    elif slots:  # fresh buffers for every block in flight (``zo.plan_zo``'s count of them)
        ahead = s if cuda and cfg.overlap else slots
        dev["blocks in flight"] = ahead * held
        e["elastic"] = (ahead - slots) * (held + up * compressed)
        dev.update({"codec wire buffers": ahead * up} if compressed else {})
    e["h2d"], e["d2h"] = s * up, 0
    bu = prof["h2d_bps"] if cuda else prof["host_memcpy_bps"] / 2
    x_up = up / bu
    decode = (up + held) / prof["gpu_mem_bps"] * compressed  # on the compute stream
    overlap = cfg.overlap and cuda
    per = max(c_blk + decode, x_up) if overlap else c_blk + decode + x_up
    e["step"] = passes * e["eh"] + r * c_blk + s * per
    e["transfer"] = s * x_up
