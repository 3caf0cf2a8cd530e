"""The config's vocabulary: each knob's allowed values (``Literal`` types), the
tables of which knobs apply where and which a resume may change, and ``ConfigError``.
Plain data and small helpers; every other module of ``workbench.config`` builds on it."""
from __future__ import annotations

import os
from dataclasses import fields
from pathlib import Path
from typing import Any, Literal, get_args

Method = Literal["mezo", "zo-offload", "fo", "fo-offload", "forward-grad"]
Device = Literal["cpu", "cuda"]
Amp = Literal["off", "bf16", "fp16"]
Rng = Literal["philox", "torch"]
Codec = Literal["fp32", "bf16", "fp16", "fp8-e4m3", "fp8-e5m2"]
Master = Literal["fp32", "compressed", "compressed-sr"]
Objective = Literal["classify", "completion", "lm"]
Peft = Literal["none", "lora"]
BaseCodec = Literal["fp32", "bf16", "fp16", "fp8-e4m3", "int8"]
StopOn = Literal["never", "diverged"]
Estimator = Literal["central", "one-sided"]
#: the ZO directions z: standard normals (MeZO), or Rademacher signs +-1 (FZOO), the sign of
#: the very normal drawn for the same element (``engine/zo/perturb.py``)
Directions = Literal["gaussian", "rademacher"]
ZOOptimizer = Literal["sgd", "sign", "momentum", "adam", "hizoo"]
#: fo-offload's update stride: "auto", or k != 0 (``plan/placement.py::make_schedule``)
Stride = Literal["auto"] | int
#: fo-offload's Adam moments on the host: fp32, or bf16 with stochastic rounding
AdamStateDtype = Literal["fp32", "bf16"]
#: fo-offload's CPU AdamW kernel: torch's fused one, or the one-pass kernel that reads bf16
#: gradients and writes the bf16 weights in the same pass (``engine/fo/adamw16.py``); auto:
#: one-pass where it applies (amp=bf16, fp32 moments) and builds
CpuAdamw = Literal["auto", "torch", "one-pass"]
#: fo-offload's subgroup size: "auto" (``plan/placement.py::subgroup_sizes``), or parameters
#: (the same type as ``Stride``: one check, one parser)
Size = Literal["auto"] | int
#: zo-offload's GPU block slots: the master's bf16 / fp16 with the forward's form computed from
#: it (compute), fp32 (the decoded master), or compute where it applies on a GPU (auto)
SlotDtype = Literal["auto", "fp32", "compute"]

#: Methods that stream transformer blocks host <-> GPU.
STREAMING_METHODS = ("zo-offload", "forward-grad")
ZO_METHODS = ("mezo", "zo-offload", "forward-grad")

REPO_ROOT = Path(__file__).resolve().parents[2]

#: Knobs only some methods read: set away from its default for another method, one would be
#: ignored without a word, so it is refused instead.
METHOD_KNOBS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("overlap", "reuse_buffers", "fused_update", "resident_blocks",
                     "prefetch_depth", "block_slots", "host_share"), STREAMING_METHODS),
    **dict.fromkeys(("codec", "master"), (*STREAMING_METHODS, "mezo")),  # mezo: half weights
    "rng": ZO_METHODS,
    **dict.fromkeys(("eps", "queries", "estimator", "zo_optimizer", "directions"),
                    ("mezo", "zo-offload")),
    **dict.fromkeys(("subgroup_size", "update_stride", "gpu_resident_ratio", "update_threads",
                     "adam_state_dtype", "cpu_adamw"), ("fo-offload",)),
    **dict.fromkeys(("adam_beta1", "adam_beta2", "adam_eps"),
                    ("fo", "fo-offload", "mezo", "zo-offload")),  # ZO: zo_optimizer=adam
    **dict.fromkeys(("momentum", "hessian_smooth"), ("mezo", "zo-offload")),
    **dict.fromkeys(("slot_dtype", "stream_embeddings"), ("zo-offload",)),
}
#: Knobs a resumed run may change; every other one is fixed by the run's first start (it
#: shapes the trajectory or where the checkpoints are). The scheduler knobs are bit-identical.
RESUMABLE = ("steps", "lr", "weight_decay", "eval_every", "eval_samples", "device", "data_dir",
             "overlap", "reuse_buffers", "fused_update", "resident_blocks", "prefetch_depth",
             "slot_dtype", "block_slots",
             "telemetry", "sample_hz", "keep_steps", "checkpoint_every", "keep_last",
             "digest_check_every", "host_share", "cpu_adamw", "gpu_mem_limit_gb",
             "max_new_tokens",
             "checkpoint_dir", "data_changed_ok", "stop_on", "save_final",
             "report_to")
#: Knobs that answer one question of one start (is changed data all right?): a resumed run
#: does not inherit them, so the next resume asks again.
ONE_START = ("data_changed_ok",)


def zo_passes(queries: int, estimator: str, rule: str = "sgd") -> int:
    """Forward passes of a ZO step (mezo, zo-offload): 2 per query (central), + 1 clean pass
    for HiZOO's curvature (``rule``: the run's zo_optimizer), or the queries and one clean
    pass (one-sided)."""
    return 2 * queries + (rule == "hizoo") if estimator == "central" else queries + 1


def default_data_dir() -> str:
    """Where local data sets live: ``$WORKBENCH_DATA_DIR``, else ``../shared/data`` beside the
    repo."""
    return os.environ.get("WORKBENCH_DATA_DIR", str(REPO_ROOT.parent / "shared" / "data"))


class ConfigError(ValueError):
    """One or more invalid settings; ``problems`` lists each as 'field: what is allowed'."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("; ".join(problems))


#: A field's annotation (text, under ``from __future__ import annotations``) -> its type; every
#: type above is here, or its knob would go unchecked and show no choices in the panel
#: (``resolve_type`` raises for a name missing here, so such a knob cannot go unnoticed).
_TYPES = {"Method": Method, "Device": Device, "Amp": Amp, "Rng": Rng, "Codec": Codec,
          "Master": Master, "Objective": Objective, "Peft": Peft, "BaseCodec": BaseCodec,
          "StopOn": StopOn, "Estimator": Estimator, "Directions": Directions,
          "ZOOptimizer": ZOOptimizer, "Stride": Stride,
          "AdamStateDtype": AdamStateDtype, "CpuAdamw": CpuAdamw, "Size": Size,
          "SlotDtype": SlotDtype, "int": int, "float": float, "str": str, "bool": bool}


def resolve_type(t: Any) -> Any:
    """A field's type from its annotation's text (``_TYPES``); a type as given."""
    if isinstance(t, str) and t not in _TYPES:
        raise TypeError(f"config field type {t!r} is not in kinds._TYPES")
    return _TYPES[t] if isinstance(t, str) else t


def read_stride(value: Any) -> Any:
    """``update_stride`` as "auto" or an int when it is spelled as text; anything else as given
    (``check_types`` then says what is allowed)."""
    if isinstance(value, str) and value.strip() != "auto":
        try:
            return int(value)
        except ValueError:
            return value
    return value.strip() if isinstance(value, str) else value


PEFT_METHODS = get_args(Method)  # every method trains adapters
#: report_to's trackers -> the module each needs (installed by the extra of the same name).
TRACKERS = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
#: zo_optimizer -> per-weight state tensors the rule keeps (momentum: m; adam: m and v; hizoo:
#: the Hessian diagonal's excess over its start, H - 1).
ZO_STATE_SLOTS = {"sgd": 0, "sign": 0, "momentum": 1, "adam": 2, "hizoo": 1}


def default_of(config: Any, name: str) -> Any:
    """The default of knob ``name`` (``config``: a config class or one of its instances)."""
    return {f.name: f.default for f in fields(config)}[name]
