"""Run configuration: one frozen, validated dataclass shared by the CLI, the recipes and the UI.

Every knob has one name everywhere (config field, ``--set`` key, widget label, report). Field
metadata carries the help text, the unit and the valid range, so the knob panel can build the
right control and the validator can say what is allowed.

Longer than our usual module (about 600 lines): every knob's field, help, range and checks, and
the reading of TOML files and ``--set`` values into them, are one concept read in one place.
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import re
import string
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, Mapping, get_args, get_origin

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

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
ZOOptimizer = Literal["sgd", "sign", "momentum", "adam"]
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

REPO_ROOT = Path(__file__).resolve().parent.parent

#: Knobs only some methods read: set away from its default for another method, one would be
#: ignored without a word, so it is refused instead.
METHOD_KNOBS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("overlap", "reuse_buffers", "fused_update", "resident_blocks",
                     "prefetch_depth", "block_slots", "host_share"), STREAMING_METHODS),
    **dict.fromkeys(("codec", "master"), (*STREAMING_METHODS, "mezo")),  # mezo: half weights
    "rng": ZO_METHODS,
    **dict.fromkeys(("eps", "queries", "estimator", "zo_optimizer"), ("mezo", "zo-offload")),
    **dict.fromkeys(("subgroup_size", "update_stride", "gpu_resident_ratio", "update_threads",
                     "adam_state_dtype", "cpu_adamw"), ("fo-offload",)),
    **dict.fromkeys(("adam_beta1", "adam_beta2", "adam_eps"),
                    ("fo", "fo-offload", "mezo", "zo-offload")),  # ZO: zo_optimizer=adam
    "momentum": ("mezo", "zo-offload"),
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


def zo_passes(queries: int, estimator: str) -> int:
    """Forward passes of a ZO step (mezo, zo-offload): 2 per query (central), or the
    queries and one clean pass (one-sided)."""
    return 2 * queries if estimator == "central" else queries + 1


def default_data_dir() -> str:
    """Where local data sets live: ``$WORKBENCH_DATA_DIR``, else ``../shared/data`` beside the repo."""
    return os.environ.get("WORKBENCH_DATA_DIR", str(REPO_ROOT.parent / "shared" / "data"))


def _knob(default: Any, help: str, *, lo: float | None = None, hi: float | None = None,
          unit: str = "", live: bool = False, group: str = "run") -> Any:
    """A config field with its help text, valid range and unit.

    ``live`` knobs may change between steps of a running job; the others are fixed for a run.
    """
    return field(default=default, metadata={"help": help, "lo": lo, "hi": hi, "unit": unit,
                                            "live": live, "group": group})


class ConfigError(ValueError):
    """One or more invalid settings; ``problems`` lists each as 'field: what is allowed'."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("; ".join(problems))


@dataclass(frozen=True)
class RunConfig:
    """A training run. Units are in the field help; ranges are checked in ``__post_init__``."""

    # what to train
    method: Method = _knob("mezo", "training method")
    model: str = _knob("tiny-opt", "model preset, a local Hugging Face folder or a hub id org/name")
    data: str = _knob("embedded", "embedded | sst2 | synthetic | hf:NAME[:CONFIG] | a .jsonl/.csv/"
                      ".tsv/.parquet file | a folder of train.*/dev.* files or from save_to_disk")
    data_dir: str = _knob("", "folder holding sst2/ and opt-tokenizer/ (empty: $WORKBENCH_DATA_DIR "
                          "or ../shared/data)")
    train_samples: int = _knob(0, "training examples used (0 = all)", lo=0, hi=10_000_000)
    eval_samples: int = _knob(500, "dev examples evaluated (0 = all)", lo=0, hi=10_000_000)
    # the task (issue 18): objective, prompt format and field names ("" = found by name)
    objective: Objective = _knob("classify", "classify: label words after a template; completion: "
                                 "prompt -> completion; lm: plain text", group="task")
    template: str = _knob("{text} It was", "classify prompt; {text} is the example's text",
                          group="task")
    label_words: str = _knob(" terrible, great", "classify: the words of labels 0, 1, .., split "
                             "at each comma and nothing else (spaces are part of a word)",
                             group="task")
    text_field: str = _knob("", "field with the text (classify, lm)", group="task")
    label_field: str = _knob("", "field with the integer label (classify)", group="task")
    prompt_field: str = _knob("", "field with the prompt (completion)", group="task")
    completion_field: str = _knob("", "field with the completion (completion)", group="task")
    max_new_tokens: int = _knob(16, "completion eval: greedy tokens generated per example", lo=1,
                                hi=4096, unit="tokens", group="task")
    # schedule
    steps: int = _knob(20, "training steps", lo=1, hi=10_000_000, unit="steps")
    batch_size: int = _knob(8, "examples per step", lo=1, hi=4096, unit="examples")
    seq_len: int = _knob(64, "maximum tokens per example", lo=4, hi=32768, unit="tokens")
    lr: float = _knob(1e-6, "learning rate", lo=0.0, hi=10.0, live=True, group="optim")
    eps: float = _knob(1e-3, "ZO perturbation scale", lo=0.0, hi=1.0, group="optim")
    queries: int = _knob(1, "ZO perturbations per step, all evaluated during one visit of each "
                         "block; the update is their mean", lo=1, hi=64, group="optim")
    estimator: Estimator = _knob("central", "ZO estimate per query: central (L+ - L-) / 2 eps, "
                                 "2 forward passes each; one-sided (L_j - L_0) / eps against one "
                                 "clean pass, the step divided by the spread of the q losses "
                                 "(FZOO; queries >= 2)", group="optim")
    zo_optimizer: ZOOptimizer = _knob("sgd", "ZO update of the estimate d = sum_j c_j z_j: sgd "
                                      "w -= lr (d + wd w); sign w -= lr (sign(d) + wd w) "
                                      "(ZO-SGD-Sign); momentum m = momentum m + d, w -= lr (m + "
                                      "wd w); adam AdamW on d (adam_beta1, adam_beta2, adam_eps); "
                                      "momentum and adam keep per-weight state in the master's "
                                      "format, streamed with each block", group="optim")
    momentum: float = _knob(0.9, "ZO-SGD momentum coefficient (zo_optimizer=momentum)", lo=0.0,
                            hi=0.999999, group="optim")
    weight_decay: float = _knob(0.0, "decoupled weight decay (not applied to biases and norms)",
                                lo=0.0, hi=1.0, live=True, group="optim")
    seed: int = _knob(0, "seed for init, data order and perturbations", lo=0, hi=2**31 - 1)
    device: Device = _knob("cpu", "where compute runs")
    amp: Amp = _knob("off", "autocast dtype for block computations")
    eval_every: int = _knob(0, "evaluate on dev every N steps (0 = only at the end)", lo=0,
                            hi=10_000_000, unit="steps")
    stop_on: StopOn = _knob("never", "end the run early when its learning health says so: never, "
                            "or diverged (the loss far above its start or best, or not finite; "
                            "status diverged, with the evidence)")
    # zo-offload scheduler (issue: offload engine)
    overlap: bool = _knob(True, "upload / compute / offload on three CUDA streams", group="offload")
    reuse_buffers: bool = _knob(True, "copy blocks into GPU slots allocated once", group="offload")
    fused_update: bool = _knob(True, "apply the previous step's update right after the upload",
                               group="offload")
    resident_blocks: int = _knob(0, "blocks kept on the GPU all along", lo=0, hi=1024,
                                 group="offload")
    prefetch_depth: int = _knob(1, "blocks uploaded ahead of the one computing", lo=1, hi=8,
                                group="offload")
    block_slots: Size = _knob("auto", "GPU block slots: auto (prefetch_depth + what the "
                              "transfer keeps beside them) or a number >= prefetch_depth + 1 "
                              "(fewer slots: an upload waits for the offload of its slot's last "
                              "block)", lo=2, hi=64, group="offload")
    stream_embeddings: bool = _knob(False, "zo-offload: the embedding and the LM head live in "
                                    "host memory and stream through the block slots (first and "
                                    "last in each pass) instead of staying on the GPU in fp32; "
                                    "needs an untied head and peft=none", group="offload")
    rng: Rng = _knob("philox", "perturbation RNG: counter-based philox (fused kernel on CUDA) or "
                     "torch's generator as MeZO uses it", group="offload")
    # transfers (issue: AMP and codecs)
    codec: Codec = _knob("fp32", "format blocks travel in over PCIe", group="offload")
    master: Master = _knob("fp32", "where weights are kept (zo-offload's host copy of blocks; "
                           "mezo's weights on the GPU): fp32, or the codec's bf16 / fp16 with "
                           "updates rounded to nearest (compressed, as MeZO's half precision) or "
                           "stochastically (compressed-sr)", group="offload")
    slot_dtype: SlotDtype = _knob("auto", "what zo-offload's GPU block slots hold: the "
                                  "master's bf16 / fp16 as it is, the forward computing from one "
                                  "buffer in the autocast dtype (compute: half the slot memory, "
                                  "bit-equal), or fp32; auto: compute where it applies on a GPU "
                                  "(master=compressed or compressed-sr, amp on, "
                                  "zo_optimizer=sgd, queries=1)", group="offload")
    # adapters (issue 19): only the adapter trains; the frozen base streams host -> GPU only
    peft: Peft = _knob("none", "adapter: none trains every weight, lora only low-rank adapters",
                       group="peft")
    lora_rank: int = _knob(8, "LoRA rank r", lo=1, hi=4096, group="peft")
    lora_alpha: float = _knob(16.0, "LoRA alpha (the update is scaled by alpha / r)", lo=0.0,
                              hi=1e6, group="peft")
    lora_targets: str = _knob("", "comma-separated module names given adapters (empty: the "
                              "attention query and value projections of the family)", group="peft")
    base_codec: BaseCodec = _knob("fp32", "format of the frozen base on the host (streamed "
                                  "methods; other methods compute with its decoded values): fp32 "
                                  "exact, fp8 per-block, int8 per-channel scales", group="peft")
    # telemetry
    telemetry: bool = _knob(True, "record per-block stream events", group="telemetry")
    sample_hz: float = _knob(20.0, "NVML / host sampling rate (0 = off)", lo=0.0, hi=1000.0,
                             unit="Hz", group="telemetry")
    keep_steps: int = _knob(50, "steps whose per-block events are kept in full", lo=1,
                            hi=1_000_000, unit="steps", group="telemetry")
    report_to: str = _knob("", "trackers logging every step and eval, comma-separated: "
                           "tensorboard (RUN_DIR/tensorboard), wandb (offline unless logged in "
                           "or WANDB_MODE says), mlflow (MLFLOW_TRACKING_URI, else RUN_DIR/mlruns)",
                           group="telemetry")
    # checkpoints
    checkpoint_every: int = _knob(0, "save a checkpoint every N steps (0 = never)", lo=0,
                                  hi=10_000_000, unit="steps", group="checkpoint")
    checkpoint_dir: str = _knob("", "where checkpoints go (empty: RUN_DIR/checkpoints); a resume "
                                "may move it: it reads the newest of its run's checkpoints from "
                                "the old folder or the new one, and writes to the new one",
                                group="checkpoint")
    keep_last: int = _knob(2, "complete checkpoints kept", lo=1, hi=1000, group="checkpoint")
    data_changed_ok: bool = _knob(False, "this resume may go on with data (or a tokenizer) that "
                                  "changed since the run started; run.json records it; not "
                                  "inherited by the next resume", group="checkpoint")
    save_final: bool = _knob(True, "write the end-of-run weights to RUN_DIR/weights (what "
                             "python -m workbench export reads), one group at a time",
                             group="checkpoint")
    # first-order offload (interleaved optimizer states)
    subgroup_size: Size = _knob("auto", "parameters per optimizer subgroup, or auto (sizes the "
                                "model proposes, tried for a step each with the stride)",
                                lo=1024, hi=2**31 - 1, unit="params", group="fo")
    update_stride: Stride = _knob("auto", "auto (the model's candidates tried for a step each, "
                               "the fastest kept), or k: every k-th subgroup updated on the GPU "
                               "(negative -k: k of every k+1 on the GPU)", group="fo")
    gpu_resident_ratio: float = _knob(0.0, "share of subgroups kept on the GPU all along", lo=0.0,
                                      hi=1.0, group="fo")
    update_threads: int = _knob(0, "threads of the CPU AdamW (0: torch's thread count, less one "
                                "on a GPU run: that core launches kernels)", lo=0, hi=4096,
                                group="fo")
    adam_beta1: float = _knob(0.9, "AdamW beta1 (fo, fo-offload; ZO with zo_optimizer=adam)",
                              lo=0.0, hi=0.999999, group="optim")
    adam_beta2: float = _knob(0.999, "AdamW beta2", lo=0.0, hi=0.99999999, group="optim")
    adam_eps: float = _knob(1e-8, "AdamW epsilon", lo=0.0, hi=1.0, group="optim")
    adam_state_dtype: AdamStateDtype = _knob("fp32", "fo-offload's Adam m and v: fp32, or bf16 "
                                             "(2 B each, stochastically rounded; the fp32 "
                                             "master kept)", group="fo")
    cpu_adamw: CpuAdamw = _knob("auto", "fo-offload's CPU AdamW: torch (fused, fp32 gradients), "
                                "one-pass (bf16 gradients in, bf16 weights out; amp=bf16 with "
                                "fp32 moments; needs a C compiler), or auto (one-pass where it "
                                "applies); bit-equal either way", group="fo")
    # scale-out
    host_share: bool = _knob(True, "ranks on one host share the streamed blocks' host copy "
                             "(torchrun; zo-offload, forward-grad)", group="distributed")
    digest_check_every: int = _knob(50, "compare parameter digests across ranks every N steps "
                                    "(0 = never)", lo=0, hi=10_000_000, group="distributed")
    # planner
    gpu_mem_limit_gb: float = _knob(0.0, "cap on GPU memory for the run (0 = the whole GPU)",
                                    lo=0.0, hi=1e6, unit="GB", group="planner")

    def __post_init__(self) -> None:
        # A stride spelled as text ("3": a text box, a run.json of an older version) is read
        # here, once; everything downstream sees "auto" or an int.
        object.__setattr__(self, "update_stride", _stride(self.update_stride))
        object.__setattr__(self, "subgroup_size", _stride(self.subgroup_size))
        object.__setattr__(self, "block_slots", _stride(self.block_slots))
        problems = _check_types(self) or _check_values(self)
        if problems:
            raise ConfigError(problems)

    # --- construction helpers -------------------------------------------------------------
    def replace(self, **changes: Any) -> "RunConfig":
        """A copy with ``changes`` applied (validated)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def resolved_data_dir(self) -> Path:
        return Path(self.data_dir or default_data_dir()).expanduser()

    @property
    def streaming(self) -> bool:
        return self.method in STREAMING_METHODS


def knob_info(name: str) -> dict[str, Any]:
    """Help text, range, unit, group and the allowed choices of one config field."""
    f = {f.name: f for f in fields(RunConfig)}[name]
    info = dict(f.metadata)
    info["type"] = f.type
    info["default"] = f.default
    info["choices"] = get_args(_resolve(f.type)) if get_origin(_resolve(f.type)) is Literal else None
    return info


_TYPES = {"Method": Method, "Device": Device, "Amp": Amp, "Rng": Rng, "Codec": Codec,
          "Master": Master, "Objective": Objective, "Peft": Peft, "BaseCodec": BaseCodec,
          "StopOn": StopOn, "Stride": Stride, "AdamStateDtype": AdamStateDtype, "Size": Size,
          "CpuAdamw": CpuAdamw,
          "int": int, "float": float, "str": str, "bool": bool}


def _resolve(t: Any) -> Any:
    return _TYPES.get(t, t) if isinstance(t, str) else t


def _stride(value: Any) -> Any:
    """``update_stride`` as "auto" or an int when it is spelled as text; anything else as given
    (``_check_types`` then says what is allowed)."""
    if isinstance(value, str) and value.strip() != "auto":
        try:
            return int(value)
        except ValueError:
            return value
    return value.strip() if isinstance(value, str) else value


def _check_types(cfg: RunConfig) -> list[str]:
    problems = []
    for f in fields(cfg):
        value, t = getattr(cfg, f.name), _resolve(f.type)
        if t is Stride:
            if value != "auto" and (isinstance(value, bool) or not isinstance(value, int)
                                    or value == 0):
                problems.append(f"{f.name}: {value!r} is not 'auto' or a non-zero whole number")
        elif get_origin(t) is Literal:
            allowed = get_args(t)
            if value not in allowed:
                problems.append(f"{f.name}: {value!r} is not one of {', '.join(allowed)}")
        elif t is bool and not isinstance(value, bool):
            problems.append(f"{f.name}: {value!r} is not true or false")
        elif t is int and (isinstance(value, bool) or not isinstance(value, int)):
            problems.append(f"{f.name}: {value!r} is not a whole number")
        elif t is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
            problems.append(f"{f.name}: {value!r} is not a number")
        elif t is float and not math.isfinite(value):
            problems.append(f"{f.name}: {value!r} is not a finite number")
        elif t is str and not isinstance(value, str):
            problems.append(f"{f.name}: {value!r} is not text")
    return problems


def _check_values(cfg: RunConfig) -> list[str]:
    from workbench.presets import PRESETS, TINY_PREFIX  # plain data: no heavy imports

    problems = []
    for f in fields(cfg):
        lo, hi, value = f.metadata.get("lo"), f.metadata.get("hi"), getattr(cfg, f.name)
        if value == "auto":  # subgroup_size=auto: the range is for a number
            continue
        if lo is not None and value < lo or hi is not None and value > hi:
            unit = f" {f.metadata['unit']}" if f.metadata.get("unit") else ""
            problems.append(f"{f.name}: {value!r} is outside [{lo:g}, {hi:g}]{unit}")
    if cfg.model.startswith(TINY_PREFIX):
        problems += _tiny_problems(cfg)
    elif (cfg.model not in PRESETS and not Path(cfg.model).expanduser().is_dir()
            and not HUB_ID.fullmatch(cfg.model)):
        problems.append(f"model: {cfg.model!r} is neither a preset ({', '.join(PRESETS)}), "
                        "tiny:<model_type>, a local folder nor a hub id org/name")
    elif cfg.model in PRESETS and cfg.seq_len > PRESETS[cfg.model].max_positions:
        problems.append(f"seq_len: {cfg.seq_len} exceeds the {PRESETS[cfg.model].max_positions} "
                        f"positions of {cfg.model}")
    elif Path(cfg.model).expanduser().is_dir():
        problems += _model_folder_problems(cfg)
    problems += _check_task(cfg)
    positions = _positions(cfg)
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
        if cfg.method not in methods and value != _default(name):
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
                 for name in trackers(cfg) if name not in TRACKERS]
    if len(set(trackers(cfg))) < len(trackers(cfg)):
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


PEFT_METHODS = get_args(Method)  # every method trains adapters
#: report_to's trackers -> the module each needs (installed by the extra of the same name).
TRACKERS = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}


def trackers(cfg: RunConfig) -> list[str]:
    """The trackers ``report_to`` names, in order (empty: none)."""
    return [t.strip() for t in cfg.report_to.split(",") if t.strip()]


def _check_half_weights(cfg: RunConfig) -> list[str]:
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
    if cfg.zo_optimizer in ("momentum", "adam"):
        problems.append(f"zo_optimizer: {cfg.zo_optimizer} keeps per-weight state that mezo's "
                        f"{cfg.codec} weights do not carry; use sgd or sign, or master=fp32 "
                        "with codec=fp32")
    return problems


def _compute_slot_needs(cfg: RunConfig) -> list[str]:
    """What ``slot_dtype=compute`` needs that this run lacks (empty: it applies)."""
    needs = [f"master=compressed or compressed-sr (this run has master={cfg.master})"
             if cfg.master == "fp32" or cfg.codec not in ("bf16", "fp16") else "",
             "amp=bf16 or fp16 (this run has amp=off)" if cfg.amp == "off" else "",
             f"zo_optimizer=sgd (this run has {cfg.zo_optimizer}: its update is not recorded)"
             if cfg.zo_optimizer != "sgd" else "",
             "peft=none (an adapter run's base has its own form: base_codec)"
             if cfg.peft != "none" else ""]
    return [n for n in needs if n]


def compute_slots(cfg: RunConfig) -> bool:
    """Whether zo-offload's streamed blocks sit in compute-dtype slots
    (``engine/stream/compute_slots.py``): ``slot_dtype=compute``, or auto where it applies on
    a GPU."""
    if cfg.method != "zo-offload" or cfg.slot_dtype == "fp32":
        return False
    # auto: one query (measured 1.06x faster at opt-13b / 30b on an H100); with q queries each
    # forward's fill recomputes every earlier direction (0.86x at q = 2), so fp32 slots stay
    return cfg.slot_dtype == "compute" or (cfg.device == "cuda" and cfg.queries == 1
                                           and not _compute_slot_needs(cfg))


def _check_slot_dtype(cfg: RunConfig) -> list[str]:
    if cfg.slot_dtype != "compute" or cfg.method != "zo-offload":
        return []
    return [f"slot_dtype: compute needs {' and '.join(_compute_slot_needs(cfg))}; use "
            "slot_dtype=fp32 or auto"] if _compute_slot_needs(cfg) else []


def min_block_slots(cfg: RunConfig) -> int:
    """The fewest GPU block slots a correct schedule needs: the ``prefetch_depth`` blocks
    uploaded ahead and the one computing (an upload into the slot of the block still computing
    would overwrite it; every transfer waits for its slot's last offload before writing)."""
    return cfg.prefetch_depth + 1


def _check_streaming(cfg: RunConfig) -> list[str]:
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


#: zo_optimizer -> per-weight state tensors the rule keeps (momentum: m; adam: m and v).
ZO_STATE_SLOTS = {"sgd": 0, "sign": 0, "momentum": 1, "adam": 2}


def _check_zo_optimizer(cfg: RunConfig) -> list[str]:
    """The ZO optimizers' own knobs, and the host formats that can carry their state."""
    if cfg.method not in ("mezo", "zo-offload"):
        return []
    own = {"momentum": ("momentum",), "adam": ("adam_beta1", "adam_beta2", "adam_eps")}
    problems = [f"{name}: applies only with zo_optimizer={rule} (this run has "
                f"zo_optimizer={cfg.zo_optimizer})" for rule, names in own.items()
                if cfg.zo_optimizer != rule for name in names if getattr(cfg, name) != _default(name)]
    if ZO_STATE_SLOTS[cfg.zo_optimizer] and cfg.method == "zo-offload" and \
            cfg.master == "fp32" and cfg.codec != "fp32":
        problems.append(f"zo_optimizer: {cfg.zo_optimizer} keeps per-weight state, which the "
                        f"fp32 master's {cfg.codec} mirror does not carry; use master=compressed-sr "
                        f"(state stored as {cfg.codec}) or codec=fp32")
    return problems


def _check_peft(cfg: RunConfig) -> list[str]:
    if cfg.peft == "none":
        return [f"{name}: applies only with peft=lora" for name in
                ("lora_rank", "lora_alpha", "lora_targets", "base_codec")
                if getattr(cfg, name) != _default(name)]
    problems = []
    if not all(t.strip() for t in cfg.lora_targets.split(",")) and cfg.lora_targets:
        problems.append(f"lora_targets: {cfg.lora_targets!r} has an empty name")
    for name in ("codec", "master"):
        if getattr(cfg, name) != _default(name):
            problems.append(f"{name}: with peft=lora the adapters stay on the GPU and the base "
                            "never goes down; set the base's format with base_codec")
    return problems


HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # org/name; paths start with / . or ~
DATA_SUFFIXES = (".jsonl", ".csv", ".tsv", ".parquet")
TASK_FIELDS = {"classify": ("text_field", "label_field", "template", "label_words"),
               "completion": ("prompt_field", "completion_field"), "lm": ("text_field",)}


def _check_task(cfg: RunConfig) -> list[str]:
    """The data source's shape (files are read later) and the objective's settings."""
    problems, data = [], cfg.data
    path = Path(data).expanduser()
    if not data.strip():
        problems.append(f"data: {data!r} is empty; give embedded, sst2, synthetic, "
                        "hf:NAME[:CONFIG], a file or a folder (. for this one)")
    elif data in ("embedded", "sst2", "synthetic") or data.startswith("hf:") and len(data) > 3:
        pass
    elif path.is_file():
        if path.suffix.lower() not in DATA_SUFFIXES:
            problems.append(f"data: {data!r} is not a {'/'.join(DATA_SUFFIXES)} file")
    elif not path.is_dir():
        problems.append(f"data: {data!r} is not embedded, sst2, synthetic, hf:NAME[:CONFIG], a "
                        "file or a folder")
    if data == "sst2" and cfg.objective != "classify":
        problems.append(f"data: sst2 is a classify data set; objective={cfg.objective} needs "
                        "another source")
    words = split_words(cfg.label_words)
    if len(words) < 2 or any(not w.strip() for w in words):
        problems.append(f"label_words: {cfg.label_words!r} needs k >= 2 non-blank words, split "
                        "at each comma (spaces are part of a word: ' bad, great' is ' bad' and "
                        "' great')")
    elif len(set(words)) < len(words):
        twice = next(w for w in words if words.count(w) > 1)
        problems.append(f"label_words: {cfg.label_words!r} repeats a word ({twice!r})")
    elif len(cfg.label_words) > 1 and cfg.label_words[0] == cfg.label_words[-1] in "\"'":
        # TOML's quotes pasted inside a shell's: the words would begin and end with them
        problems.append(f"label_words: {cfg.label_words!r} is wrapped in quotes, which would "
                        "be part of the first and last word; a value is taken exactly as typed "
                        "(the shell has removed its own quotes): leave these out")
    try:
        names = {n for _, n, _, _ in string.Formatter().parse(cfg.template) if n is not None}
    except ValueError as e:
        names = {f"<{e}>"}
    if names != {"text"}:
        problems.append(f"template: {cfg.template!r} must contain {{text}} and no other "
                        "{placeholder} (write {{ }} for a literal brace)")
    for name in ("text_field", "label_field", "prompt_field", "completion_field", "template",
                 "label_words"):
        if name not in TASK_FIELDS[cfg.objective] and getattr(cfg, name) != _default(name):
            problems.append(f"{name}: does not apply to objective={cfg.objective} (it applies to "
                            f"{', '.join(o for o, f in TASK_FIELDS.items() if name in f)})")
    return problems


def _positions(cfg: RunConfig) -> int | None:
    """The model's positions, where known without loading it (a preset, a local folder)."""
    from workbench.presets import lookup

    if (preset := lookup(cfg.model)) is not None:
        return preset.max_positions
    try:
        conf = json.loads((Path(cfg.model).expanduser() / "config.json").read_text("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    found = conf.get("max_position_embeddings") if isinstance(conf, dict) else None
    return found if isinstance(found, int) else None


def _default(name: str) -> Any:
    return {f.name: f.default for f in fields(RunConfig)}[name]


def _tiny_problems(cfg: RunConfig) -> list[str]:
    """``tiny:<model_type>`` names a causal LM of the installed transformers and fits its
    positions; whether the block adapter splits it is checked when the run builds it
    (``models.build.check_model_folder``)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from workbench.presets import TINY

    kind = cfg.model.split(":", 1)[1]
    if kind not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return [f"model: {kind!r} is not a causal-LM model_type of the installed transformers "
                "(see transformers' MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)"]
    if cfg.seq_len > TINY["max_positions"]:
        return [f"seq_len: {cfg.seq_len} exceeds the {TINY['max_positions']} positions of "
                f"{cfg.model}"]
    return []


def _model_folder_problems(cfg: RunConfig) -> list[str]:
    """A local model folder: a readable config.json, no custom code, weights, enough positions."""
    folder = Path(cfg.model).expanduser()
    try:
        conf = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        return [f"model: {cfg.model!r} has no config.json: not a Hugging Face model folder"]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return [f"model: {folder / 'config.json'} is not readable JSON ({e})"]
    if not isinstance(conf, dict):
        return [f"model: {folder / 'config.json'} is not a JSON object"]
    problems = []
    if "auto_map" in conf:
        problems.append(f"model: {cfg.model!r} needs its own Python code (auto_map in "
                        "config.json); local models load with trust_remote_code=False")
    if not any(folder.glob("*.safetensors")):
        problems.append(f"model: {cfg.model!r} holds no *.safetensors weights")
    positions = conf.get("max_position_embeddings")
    if isinstance(positions, int) and cfg.seq_len > positions:
        problems.append(f"seq_len: {cfg.seq_len} exceeds the {positions} positions of "
                        f"{cfg.model}")
    return problems


def check_resume(previous: Mapping[str, Any], cfg: RunConfig) -> list[str]:
    """Problems with continuing a run started with ``previous`` (a config dict) as ``cfg``:
    every knob outside ``RESUMABLE`` must stay as it was."""
    out = []
    for f in fields(RunConfig):
        old, new = previous.get(f.name, f.default), getattr(cfg, f.name)
        if f.name == "subgroup_size" and cfg.method != "fo-offload":
            continue  # read by fo-offload only (older runs stored its old default, 2 M)
        if f.name == "update_stride":  # an older run.json spells a stride as text
            old = _stride(old)
        if f.name not in RESUMABLE and old != new:
            out.append(f"{f.name}: fixed for a resumed run (it was {old!r}, now {new!r}); "
                       f"a resume may change {', '.join(RESUMABLE[:5])}, ...")
    return out


# --- loading: TOML file + KEY=VALUE overrides ----------------------------------------------
def parse_value(name: str, text: str) -> Any:
    """Turn a ``--set`` string into the field's type; unknown fields are reported by name."""
    known = {f.name: _resolve(f.type) for f in fields(RunConfig)}
    if name not in known:
        raise ConfigError([unknown_setting(name)])
    t = known[name]
    try:
        if t is Stride:
            value = _stride(text)
            if value != "auto" and not isinstance(value, int):
                raise ValueError
            return value
        if t is bool:
            low = text.strip().lower()
            if low not in ("true", "false", "1", "0", "on", "off", "yes", "no"):
                raise ValueError
            return low in ("true", "1", "on", "yes")
        if t is int:
            number = float(text)  # accepts 1e6 as well as 1000000
            if not number.is_integer():
                raise ValueError
            return int(number)
        if t is float:
            return float(text)
    except ValueError:
        kind = {bool: "true or false", int: "a whole number", float: "a number",
                Stride: "'auto' or a non-zero whole number"}[t]
        raise ConfigError([f"{name}: {text!r} is not {kind}"]) from None
    return text


def load_config(path: str | os.PathLike | None = None, overrides: Mapping[str, Any] | None = None,
                base: RunConfig | None = None) -> RunConfig:
    """Build a config from an optional TOML file, then ``overrides`` (strings are parsed).

    Raises:
        ConfigError: listing every bad or unknown setting at once.
    """
    values: dict[str, Any] = dict(base.to_dict()) if base else {}
    problems: list[str] = []
    if path is not None:
        values.update(read_settings(Path(path)))
    for key, raw in (overrides or {}).items():
        try:
            values[key] = parse_value(key, raw) if isinstance(raw, str) else raw
        except ConfigError as e:
            problems += e.problems
    known = {f.name for f in fields(RunConfig)}
    problems += [unknown_setting(k) for k in values if k not in known]
    if problems:
        raise ConfigError(problems)
    return RunConfig(**values)


def read_settings(path: Path) -> dict[str, Any]:
    """The settings of a TOML file (not yet checked): its [run] table, or its top-level keys
    when it has none.
    Anything else (keys beside [run], other tables) is refused: it would be ignored."""
    try:
        data = tomllib.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise ConfigError([f"config: file {str(path)!r} does not exist"]) from None
    except IsADirectoryError:
        raise ConfigError([f"config: {path} is a folder, not a TOML file"]) from None
    except UnicodeDecodeError:
        raise ConfigError([f"config: {path} is not a text file (not UTF-8)"]) from None
    except OSError as e:
        raise ConfigError([f"config: {path} cannot be read ({e.strerror})"]) from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError([f"config: {path} is not valid TOML ({e})"]) from None
    if "run" in data and not isinstance(data["run"], dict):
        raise ConfigError([f"config: {path}: 'run' must be a table ([run])"])
    settings = data["run"] if "run" in data else data
    problems = [f"config: {path}: table [{k}] is not read (settings go in [run])"
                for k, v in data.items() if k != "run" and isinstance(v, dict)]
    if "run" in data:
        problems += [f"config: {path}: key {k!r} is outside [run] (put every setting in [run])"
                     for k, v in data.items() if k != "run" and not isinstance(v, dict)]
    if problems:
        raise ConfigError(problems)
    return settings


#: Other tools' names for our knobs, offered as "did you mean".
ALIASES = {"learning_rate": "lr", "max_steps": "steps", "num_steps": "steps", "epsilon": "eps",
           "max_length": "seq_len", "seq_length": "seq_len", "dataset": "data",
           "lora_r": "lora_rank", "zo_eps": "eps", "batch": "batch_size"}


def unknown_setting(name: str) -> str:
    """'stpes: unknown setting; did you mean steps?' (the closest names, if any are close)."""
    known = [f.name for f in fields(RunConfig)]
    guess = name.strip().lower().replace("-", "_").replace(" ", "_")
    guess = ALIASES.get(guess, guess)
    close = [guess] if guess in known else difflib.get_close_matches(guess, known, n=3,
                                                                     cutoff=0.6)
    if close:
        return f"{name}: unknown setting; did you mean {' or '.join(close)}?"
    return (f"{name}: unknown setting (no setting has a similar name; the README's Settings "
            "table lists them)")


def split_words(text: str) -> list[str]:
    """The one rule for word lists (``label_words``): split at each comma and nothing else;
    every other character, spaces included, is part of a word, whether the value came from
    TOML or ``--set``: ``" bad, fine"`` -> ``[" bad", " fine"]``."""
    return text.split(",")


def parse_sets(items: list[str]) -> dict[str, str]:
    """``["lr=1e-6", "steps=5"]`` -> ``{"lr": "1e-6", "steps": "5"}``: the key is the text
    before the first ``=`` (spaces around it dropped: names have none), the value everything
    after it exactly as typed (``label_words= bad, great`` keeps its spaces, as TOML would);
    a key given twice keeps its last value."""
    out, problems = {}, []
    for item in items:
        if "=" not in item:
            problems.append(f"--set {item!r}: expected KEY=VALUE")
            continue
        k, v = item.split("=", 1)
        out[k.strip()] = v
    if problems:
        raise ConfigError(problems)
    return out


def resume_base(previous: Mapping[str, Any]) -> dict[str, Any]:
    """The settings a resumed run starts from: the run's recorded config, less keys this version
    does not know and the ``ONE_START`` knobs (back to their defaults)."""
    known = {f.name for f in fields(RunConfig)}
    return {k: (_default(k) if k in ONE_START else v) for k, v in previous.items() if k in known}


def check_environment(cfg: RunConfig) -> None:
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
                 for name in trackers(cfg)
                 if name in TRACKERS and importlib.util.find_spec(TRACKERS[name]) is None]
    if problems:
        raise ConfigError(problems)
