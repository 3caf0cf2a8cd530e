"""``Knobs``: every knob of a run, with its help text, unit, valid range and group in the field's
metadata (the knob panel builds its control from them, ``knob_info``). ``RunConfig``
(``run.py``) is these fields checked when made; the checks read them as ``Knobs``."""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, Mapping, get_args, get_origin

from workbench.config.kinds import (STREAMING_METHODS, AdamStateDtype, Amp, BaseCodec, Codec,
                                    CpuAdamw, Device, Directions, Estimator, Master, Method,
                                    Objective, Peft, Rng, Size, SlotDtype, StopOn, Stride,
                                    ZOOptimizer, default_data_dir, resolve_type)


def _knob(default: Any, help: str, *, lo: float | None = None, hi: float | None = None,
          lo_open: bool = False, hi_open: bool = False, unit: str = "", live: bool = False,
          group: str = "run") -> Any:
    """A config field with its help text, valid range and unit.

    ``lo_open`` / ``hi_open``: that end of the range is excluded (a beta of 1 never forgets; an
    epsilon of 0 divides by zero). ``live`` knobs may change between steps of a running job; the
    others are fixed for a run.
    """
    return field(default=default, metadata={"help": help, "lo": lo, "hi": hi, "lo_open": lo_open,
                                            "hi_open": hi_open, "unit": unit, "live": live,
                                            "group": group})


def in_range(meta: Mapping[str, Any], value: float) -> bool:
    """Whether ``value`` lies in the range a knob's metadata (``_knob``) gives."""
    lo, hi = meta.get("lo"), meta.get("hi")
    low_ok = lo is None or (value > lo if meta.get("lo_open") else value >= lo)
    return low_ok and (hi is None or (value < hi if meta.get("hi_open") else value <= hi))


def range_text(meta: Mapping[str, Any]) -> str:
    """A knob's range as written in mathematics: "[0, 1)", "(0, 1]"."""
    return (f"{'(' if meta.get('lo_open') else '['}{meta['lo']:g}, {meta['hi']:g}"
            f"{')' if meta.get('hi_open') else ']'}")


@dataclass(frozen=True)
class Knobs:
    """A training run's settings. Units are in the field help; ranges and combinations are
    checked by ``RunConfig`` (``run.py``), the class every caller makes."""

    # what to train
    method: Method = _knob("mezo", "training method")
    model: str = _knob("tiny-opt", "model preset, a local Hugging Face folder or a hub id org/name")
    data: str = _knob("embedded", "embedded | sst2 | synthetic | hf:NAME[:CONFIG] | a .jsonl/.csv/"
                      ".tsv/.parquet file | a folder of train.*/dev.* files or from save_to_disk")
    data_dir: str = _knob("", "folder holding sst2/ and opt-tokenizer/ (empty: $WORKBENCH_DATA_DIR "
                          "or ../shared/data)")
    train_samples: int = _knob(0, "training examples used (0 = all)", lo=0, hi=10_000_000)
    eval_samples: int = _knob(500, "dev examples evaluated (0 = all)", lo=0, hi=10_000_000)
    # the task: objective, prompt format and field names ("" = found by name)
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
    directions: Directions = _knob("gaussian", "ZO directions z: gaussian (MeZO) or rademacher "
                                   "+-1 (FZOO; the sign of the same normal, so no fused "
                                   "kernel: z is materialised per group)", group="optim")
    zo_optimizer: ZOOptimizer = _knob("sgd", "ZO update of the estimate d = sum_j c_j z_j: sgd "
                                      "w -= lr (d + wd w); sign w -= lr (sign(d) + wd w) "
                                      "(ZO-SGD-Sign); momentum m = momentum m + d, w -= lr (m + "
                                      "wd w); adam AdamW on d (adam_beta1, adam_beta2, adam_eps); "
                                      "hizoo (HiZOO) z scaled by H^-1/2, H a diagonal Hessian "
                                      "estimate from one more (clean) pass, its update "
                                      "lr g H^-1/2 z; momentum, adam and hizoo keep per-weight "
                                      "state in the master's format, streamed with each block",
                                      group="optim")
    momentum: float = _knob(0.9, "ZO-SGD momentum coefficient (zo_optimizer=momentum)", lo=0.0,
                            hi=1.0, hi_open=True, group="optim")
    hessian_smooth: float = _knob(1e-8, "HiZOO's smoothing alpha: H <- (1 - alpha) H + alpha "
                                  "|L+ + L- - 2 L0| H z^2 / (2 eps^2) (zo_optimizer=hizoo; "
                                  "the paper's 1e-8; 0 keeps H = 1, MeZO)", lo=0.0, hi=1.0,
                                  group="optim")
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
    rng: Rng = _knob("philox", "perturbation RNG: counter-based philox (fused kernel on CUDA; "
                     "torch ops on a CPU, spread over torch's threads, 3-6x torch.randn's time "
                     "per perturbation on one) or torch's generator as MeZO uses it",
                     group="offload")
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
    # adapters: only the adapter trains; the frozen base streams host -> GPU only
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
                              lo=0.0, hi=1.0, hi_open=True, group="optim")
    adam_beta2: float = _knob(0.999, "AdamW beta2", lo=0.0, hi=1.0, hi_open=True, group="optim")
    adam_eps: float = _knob(1e-8, "AdamW epsilon", lo=0.0, hi=1.0, lo_open=True, group="optim")
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

    # --- helpers -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def resolved_data_dir(self) -> Path:
        return Path(self.data_dir or default_data_dir()).expanduser()

    @property
    def streaming(self) -> bool:
        return self.method in STREAMING_METHODS

    @functools.cached_property
    def trackers(self) -> tuple[str, ...]:
        """The trackers ``report_to`` names, in order (empty: none): the text is read here,
        once per config; every reader takes this tuple."""
        return tuple(t.strip() for t in self.report_to.split(",") if t.strip())


def knob_info(name: str) -> dict[str, Any]:
    """Help text, range, unit, group and the allowed choices of one config field."""
    f = {f.name: f for f in fields(Knobs)}[name]
    info = dict(f.metadata)
    info["type"] = f.type
    info["default"] = f.default
    t = resolve_type(f.type)
    info["choices"] = get_args(t) if get_origin(t) is Literal else None
    return info
