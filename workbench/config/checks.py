"""The checks a ``RunConfig`` passes when it is made: each field's type and range, then the
combinations of knobs (what applies to which method, amp, master, adapters, trackers),
every problem as one line "knob: what is allowed"; ``check_environment``: those that need
the machine (run before anything is built)."""
from __future__ import annotations

import math
from dataclasses import Field, fields
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from workbench.config.kinds import (METHOD_KNOBS, TRACKERS, ZO_METHODS, ZO_STATE_SLOTS,
                                    ConfigError, Stride, default_of, resolve_type)
from workbench.config.knobs import Knobs, in_range, range_text
from workbench.config.task import (HUB_ID, check_task, model_folder_problems, model_positions,
                                   tiny_problems)


def check_types(cfg: Knobs) -> list[str]:
    """Each field against its type: a choice among its Literal's, a whole number, ... ."""
    return [p for f in fields(cfg) if (p := _type_problem(f.name, f.type, getattr(cfg, f.name)))]


def value_problems(name: str, value: Any) -> list[str]:
    """One knob's value on its own: its type, then its range (a sweep's axis is checked so
    before any point runs, as ``--set`` is)."""
    f = next(f for f in fields(Knobs) if f.name == name)
    problem = _type_problem(name, f.type, value) or _range_problem(f, value)
    return [problem] if problem else []


def _type_problem(name: str, annotation: Any, value: Any) -> str:
    """What is wrong with ``value`` for a field of this annotation ('' when nothing is)."""
    t = resolve_type(annotation)
    if t is Stride:
        if value != "auto" and (isinstance(value, bool) or not isinstance(value, int)
                                or value == 0):
            return f"{name}: {value!r} is not 'auto' or a non-zero whole number"
    elif get_origin(t) is Literal:
        allowed = get_args(t)
        if value not in allowed:
            return f"{name}: {value!r} is not one of {', '.join(allowed)}"
    elif t is bool and not isinstance(value, bool):
        return f"{name}: {value!r} is not true or false"
    elif t is int and (isinstance(value, bool) or not isinstance(value, int)):
        return f"{name}: {value!r} is not a whole number"
    elif t is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
        return f"{name}: {value!r} is not a number"
    elif t is float and not math.isfinite(value):
        return f"{name}: {value!r} is not a finite number"
    elif t is str and not isinstance(value, str):
        return f"{name}: {value!r} is not text"
    return ""


def _range_problem(f: Field, value: Any) -> str:
    """``value`` outside the field's range ('' when inside, or the field has none)."""
    lo, hi = f.metadata.get("lo"), f.metadata.get("hi")
    if value == "auto" or (lo is None and hi is None) or in_range(f.metadata, value):
        return ""  # subgroup_size=auto: the range is for a number
    unit = f" {f.metadata['unit']}" if f.metadata.get("unit") else ""
    return f"{f.name}: {value!r} is outside {range_text(f.metadata)}{unit}"


def check_values(cfg: Knobs) -> list[str]:
    """Ranges, the model named, the task, and the knobs that must go together."""
    from workbench.presets import PRESETS, TINY_PREFIX  # plain data: no heavy imports

    problems = [p for f in fields(cfg) if (p := _range_problem(f, getattr(cfg, f.name)))]
    if cfg.model.startswith(TINY_PREFIX):
        problems += tiny_problems(cfg)
    elif (cfg.model not in PRESETS and not Path(cfg.model).expanduser().is_dir()
            and not HUB_ID.fullmatch(cfg.model)):
        problems.append(f"model: {cfg.model!r} is neither a preset ({', '.join(PRESETS)}), "
                        "tiny:<model_type>, a local folder nor a hub id org/name")
    elif cfg.model in PRESETS and cfg.seq_len > PRESETS[cfg.model].max_positions:
        problems.append(f"seq_len: {cfg.seq_len} exceeds the {PRESETS[cfg.model].max_positions} "
                        f"positions of {cfg.model}")
    elif Path(cfg.model).expanduser().is_dir():
        problems += model_folder_problems(cfg)
    problems += check_task(cfg)
    positions = model_positions(cfg)
    reach = cfg.seq_len + cfg.max_new_tokens - 1  # a dev prompt of seq_len, then the answer
    if cfg.objective == "completion" and cfg.data != "synthetic" and positions and \
            reach > positions:
        problems.append(f"max_new_tokens: {cfg.max_new_tokens} new tokens after a prompt of up "
                        f"to seq_len={cfg.seq_len} reach position {reach}, beyond the "
                        f"{positions} positions of {cfg.model}; lower max_new_tokens or seq_len")
    if cfg.gpu_mem_limit_gb and cfg.device != "cuda":
        problems.append(f"gpu_mem_limit_gb: {cfg.gpu_mem_limit_gb:g} applies only with "
                        f"device=cuda (this run has device={cfg.device}); leave it at 0")
    if cfg.eval_every and cfg.data == "synthetic":  # every other source has a dev split
        problems.append("eval_every: data=synthetic has no dev split to evaluate on; set "
                        "eval_every=0 or use a data set")
    for name, methods in METHOD_KNOBS.items():
        value = getattr(cfg, name)
        if cfg.method not in methods and value != default_of(cfg, name):
            problems.append(f"{name}: {value!r} does not apply to method={cfg.method} (only to "
                            f"{', '.join(methods)}); leave it at its default")
    if cfg.checkpoint_every and cfg.method not in ZO_METHODS:
        problems.append(checkpoint_problem(cfg.method))
    if cfg.cpu_adamw == "one-pass" and (cfg.amp != "bf16" or cfg.adam_state_dtype != "fp32"):
        problems.append(f"cpu_adamw: one-pass needs amp=bf16 and adam_state_dtype=fp32 (here "
                        f"amp={cfg.amp}, adam_state_dtype={cfg.adam_state_dtype}); use auto or "
                        f"torch")
    if cfg.eps == 0 and cfg.method in ("mezo", "zo-offload"):
        problems.append("eps: must be > 0 for ZO methods (it divides the loss difference)")
    if cfg.estimator == "one-sided" and cfg.queries < 2:
        problems.append(f"estimator: one-sided divides the step by the spread of the queries' "
                        f"losses and needs queries >= 2 (this run has queries={cfg.queries})")
    problems += _check_zo_optimizer(cfg)
    if cfg.master != "fp32" and cfg.codec == "fp32":
        problems.append(f"master: {cfg.master} needs a compressed codec (bf16, fp16, fp8-e4m3, "
                        "fp8-e5m2); use master=fp32 with codec=fp32")
    if cfg.master != "fp32" and cfg.codec.startswith("fp8"):
        what = ("holds mezo's weights in bf16/fp16" if cfg.method == "mezo" else
                "stores bf16/fp16 on the host")
        problems.append(f"master: {cfg.master} {what}; with an fp8 codec use master=fp32")
    problems += _check_half_weights(cfg)
    problems += _check_slot_dtype(cfg)
    problems += _check_streaming(cfg)
    problems += _check_peft(cfg)
    problems += [f"report_to: {name!r} is not one of {', '.join(TRACKERS)} (comma-separated)"
                 for name in cfg.trackers if name not in TRACKERS]
    if len(set(cfg.trackers)) < len(cfg.trackers):
        problems.append(f"report_to: {cfg.report_to!r} names a tracker twice")
    preset = PRESETS.get(cfg.model)
    if preset is not None and cfg.streaming and cfg.resident_blocks > preset.num_layers:
        problems.append(f"resident_blocks: {cfg.resident_blocks} exceeds the {preset.num_layers} "
                        f"blocks of {cfg.model}")
    return problems


def checkpoint_problem(method: str) -> str:
    """Why a first-order run takes no checkpoints (refused with the config, before a run
    directory is claimed; the engines refuse a snapshot the same way)."""
    return (f"checkpoint_every: method {method} keeps AdamW moments that checkpoints do not "
            f"hold; checkpoints and resume are for {', '.join(ZO_METHODS)} (use "
            "checkpoint_every=0)")


def trackers(cfg: Knobs) -> tuple[str, ...]:
    """The trackers ``report_to`` names, in order (empty: none): ``cfg.trackers``."""
    return cfg.trackers


def _check_half_weights(cfg: Knobs) -> list[str]:
    """mezo's codec and master: its weights in bf16 / fp16 on the device (``zo/half.py``)."""
    if cfg.method != "mezo" or cfg.codec == "fp32":
        return []
    if cfg.master == "fp32":
        return [f"codec: {cfg.codec} with master=fp32 leaves mezo's weights in fp32 (nothing "
                "travels to compress); set master=compressed or compressed-sr to hold them in "
                f"{cfg.codec}, or codec=fp32"]
    if cfg.codec.startswith("fp8"):
        return []  # refused above, as for the streamed masters
    problems = []
    if cfg.amp != cfg.codec:
        problems.append(f"amp: mezo's {cfg.codec} weights (master={cfg.master}) compute in "
                        f"{cfg.codec}; set amp={cfg.codec}")
    if ZO_STATE_SLOTS[cfg.zo_optimizer]:
        problems.append(f"zo_optimizer: {cfg.zo_optimizer} keeps per-weight state that mezo's "
                        f"{cfg.codec} weights do not carry; use sgd or sign, or master=fp32 "
                        "with codec=fp32")
    return problems


def _compute_slot_needs(cfg: Knobs) -> list[str]:
    """What ``slot_dtype=compute`` needs that this run lacks (empty: it applies)."""
    needs = [f"master=compressed or compressed-sr (this run has master={cfg.master})"
             if cfg.master == "fp32" or cfg.codec not in ("bf16", "fp16") else "",
             "amp=bf16 or fp16 (this run has amp=off)" if cfg.amp == "off" else "",
             f"zo_optimizer=sgd (this run has {cfg.zo_optimizer}: its update is not recorded)"
             if cfg.zo_optimizer != "sgd" else "",
             "peft=none (an adapter run's base has its own form: base_codec)"
             if cfg.peft != "none" else "",
             "directions=gaussian (the chain kernel draws normals)"
             if cfg.directions != "gaussian" else ""]
    return [n for n in needs if n]


def compute_slots(cfg: Knobs) -> bool:
    """Whether zo-offload's streamed blocks sit in compute-dtype slots
    (``engine/stream/compute_slots.py``): ``slot_dtype=compute``, or auto where it applies on
    a GPU."""
    if cfg.method != "zo-offload" or cfg.slot_dtype == "fp32":
        return False
    # auto: one query (measured 1.06x faster at opt-13b / 30b on an H100); with q queries each
    # forward's fill recomputes every earlier direction (0.86x at q = 2), so fp32 slots stay
    return cfg.slot_dtype == "compute" or (cfg.device == "cuda" and cfg.queries == 1
                                           and not _compute_slot_needs(cfg))


def _check_slot_dtype(cfg: Knobs) -> list[str]:
    if cfg.slot_dtype != "compute" or cfg.method != "zo-offload":
        return []
    return [f"slot_dtype: compute needs {' and '.join(_compute_slot_needs(cfg))}; use "
            "slot_dtype=fp32 or auto"] if _compute_slot_needs(cfg) else []


def min_block_slots(cfg: Knobs) -> int:
    """The fewest GPU block slots a correct schedule needs: the ``prefetch_depth`` blocks
    uploaded ahead and the one computing (an upload into the slot of the block still computing
    would overwrite it; every transfer waits for its slot's last offload before writing)."""
    return cfg.prefetch_depth + 1


def _check_streaming(cfg: Knobs) -> list[str]:
    """block_slots against the schedule's minimum; stream_embeddings' refusals (a tied head
    is refused where the model is known: presets here, every model when the engine builds)."""
    from workbench.presets import PRESETS  # plain data: no heavy imports

    problems = []
    if isinstance(cfg.block_slots, int) and 2 <= cfg.block_slots \
            and cfg.block_slots < min_block_slots(cfg):
        problems.append(f"block_slots: {cfg.block_slots} is below the {min_block_slots(cfg)} a "
                        f"correct schedule needs (prefetch_depth={cfg.prefetch_depth} blocks "
                        "ahead + the one computing); use auto or more")
    if not cfg.stream_embeddings or cfg.method != "zo-offload":
        return problems
    if cfg.peft != "none":
        problems.append("stream_embeddings: streams trained embedding and head weights; with "
                        f"peft={cfg.peft} they are a frozen base: use stream_embeddings=false")
    preset = PRESETS.get(cfg.model)
    if preset is not None and preset.hf.get("tie_word_embeddings", True):
        problems.append(f"stream_embeddings: {cfg.model} ties its LM head to the embedding "
                        "(one weight in two groups); use stream_embeddings=false")
    return problems


def _check_zo_optimizer(cfg: Knobs) -> list[str]:
    """The ZO optimizers' own knobs, and the host formats that can carry their state."""
    if cfg.method not in ("mezo", "zo-offload"):
        return []
    own = {"momentum": ("momentum",), "adam": ("adam_beta1", "adam_beta2", "adam_eps"),
           "hizoo": ("hessian_smooth",)}
    problems = [f"{name}: applies only with zo_optimizer={rule} (this run has "
                f"zo_optimizer={cfg.zo_optimizer})" for rule, names in own.items()
                if cfg.zo_optimizer != rule for name in names
                if getattr(cfg, name) != default_of(cfg, name)]
    if cfg.zo_optimizer == "hizoo" and (cfg.queries != 1 or cfg.estimator != "central"):
        problems.append(f"zo_optimizer: hizoo estimates one curvature from one central query "
                        f"and a clean pass; use queries=1 and estimator=central (this run has "
                        f"queries={cfg.queries}, estimator={cfg.estimator})")
    if ZO_STATE_SLOTS[cfg.zo_optimizer] and cfg.method == "zo-offload" and \
            cfg.master == "fp32" and cfg.codec != "fp32":
        problems.append(f"zo_optimizer: {cfg.zo_optimizer} keeps per-weight state, which the "
                        f"fp32 master's {cfg.codec} mirror does not carry; use "
                        "master=compressed-sr "
                        f"(state stored as {cfg.codec}) or codec=fp32")
    return problems


def _check_peft(cfg: Knobs) -> list[str]:
    if cfg.peft == "none":
        return [f"{name}: applies only with peft=lora" for name in
                ("lora_rank", "lora_alpha", "lora_targets", "base_codec")
                if getattr(cfg, name) != default_of(cfg, name)]
    problems = []
    if not all(t.strip() for t in cfg.lora_targets.split(",")) and cfg.lora_targets:
        problems.append(f"lora_targets: {cfg.lora_targets!r} has an empty name")
    for name in ("codec", "master"):
        if getattr(cfg, name) != default_of(cfg, name):
            problems.append(f"{name}: with peft=lora the adapters stay on the GPU and the base "
                            "never goes down; set the base's format with base_codec")
    return problems


def check_environment(cfg: Knobs) -> None:
    """Checks that need the machine (run before building anything; the planner skips them)."""
    import torch

    problems = []
    if cfg.device == "cuda" and not torch.cuda.is_available():
        problems.append("device: cuda was asked for but this machine has no CUDA GPU; use "
                        "device=cpu")
    if cfg.method in ("fo", "fo-offload") and cfg.amp == "fp16" and cfg.device == "cpu":
        problems.append("amp: fp16 first-order training needs a GPU loss scaler; use amp=bf16 "
                        "or off on the CPU")
    import importlib.util

    problems += [f"report_to: {name} is not installed; pip install 'zo-workbench[{name}]'"
                 for name in cfg.trackers
                 if name in TRACKERS and importlib.util.find_spec(TRACKERS[name]) is None]
    if problems:
        raise ConfigError(problems)
