"""Does a run fit: ``check_fits`` refuses a run that would not (``PlanError``, every problem with
what, by how much and each knob that helps, with that knob's own plan), and ``suggest`` lists the
zo-offload settings that fit a GPU memory budget, best predicted throughput first."""
from __future__ import annotations

from typing import Any

from workbench.config import ConfigError, RunConfig
from workbench.plan.memory import SPARE_SLOTS
from workbench.plan.planner import CONTEXT_BYTES, GiB, Plan, plan, preset_of, process_bytes
from workbench.presets import Preset
from workbench.plan.rates import load_calibration
from workbench.plan.zo import transfer_kind


class PlanError(ConfigError):
    """The run would not fit: each problem names what, by how much and the knob that helps."""


def check_fits(cfg: RunConfig, calibration: dict | None = None, gpu: str | None = None, *,
               gpu_free: int | None = None, shape: Preset | None = None) -> Plan:
    """The plan, or PlanError when GPU or host memory would not fit (GPU not checked for
    device=cpu). Without ``calibration`` it reads this machine's cached one and its available
    RAM (psutil). ``gpu_free``: bytes free on this machine's GPU now (device=cuda, no ``gpu``;
    ``calibrate/machine.py::check_fits_here`` reads them); None: the GPU's whole memory.
    ``shape``: the model's (``planner.plan``)."""
    import psutil

    # This process is already part of what the plan counts (process_bytes): what it holds
    # is available to the run as much as what is free.
    host_avail = None if calibration else (psutil.virtual_memory().available
                                           + psutil.Process().memory_info().rss)
    if calibration is None and gpu is None:
        calibration = load_calibration(cfg.device)
    gpu_avail = None
    if cfg.device == "cuda" and gpu is None and gpu_free is not None:
        gpu_avail = gpu_free + CONTEXT_BYTES  # our own context is out of 'free' already
    avail = dict(gpu_avail=gpu_avail, host_avail=host_avail, shape=shape)
    pl = plan(cfg, gpu, calibration, **avail)
    problems = _problems(cfg, pl, lambda c: plan(c, gpu, calibration, **avail), shape)
    if problems:
        raise PlanError(problems)
    return pl


def shortfalls(cfg: RunConfig, pl: Plan, gpu: str | None = None,
               calibration: dict | None = None, shape: Preset | None = None) -> list[str]:
    """What of ``pl`` (``plan(cfg, gpu, calibration, shape=shape)``) does not fit: a line per
    memory that falls short, with by how much and each knob that helps; empty when it fits."""
    return _problems(cfg, pl, lambda c: plan(c, gpu, calibration, shape=shape), shape)


def _gib(x: float) -> str:
    return f"{x / GiB:,.1f} GiB"


def _problems(cfg: RunConfig, pl: Plan, replan, shape: Preset | None) -> list[str]:
    """What does not fit, by how much, and each knob that helps (with its own plan's figure)."""
    p = shape or preset_of(cfg.model)
    out, n = [], p.num_layers

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
        if cfg.method == "mezo" and cfg.master == "fp32" and cfg.peft == "none":
            cands.append(("codec=bf16 master=compressed amp=bf16 holds the weights in bf16 "
                          "(MeZO's half precision)",
                          {"codec": "bf16", "master": "compressed", "amp": "bf16"}))
        if cfg.method == "fo":
            cands.append(("method=fo-offload keeps AdamW on the host", {"method": "fo-offload"}))
        if cfg.resident_blocks and cfg.method in ("zo-offload", "forward-grad"):
            r = min(cfg.resident_blocks, n)
            best = max([k for k in range(r) if (q := alt(resident_blocks=k)) and q.fits_gpu] or [0])
            cands.append((f"resident_blocks={r} keeps {r} blocks on the GPU: set resident_blocks="
                          f"{best}", {"resident_blocks": best}))
        if cfg.prefetch_depth > 1:
            spare = SPARE_SLOTS[transfer_kind(cfg, p)]
            cands.append((f"prefetch_depth=1 ({1 + spare} slots, not "
                          f"{cfg.prefetch_depth + spare})", {"prefetch_depth": 1}))
        fewest = cfg.prefetch_depth + 1  # the fewest slots a schedule may have
        slots_ = (f"block_slots={fewest} (an upload waits for its slot's last offload)",
                  {"block_slots": fewest})
        if cfg.method in ("zo-offload", "forward-grad") and cfg.block_slots == "auto" \
                and SPARE_SLOTS[transfer_kind(cfg, p)] > 1:
            cands.append(slots_)
        if cfg.method == "zo-offload" and not cfg.stream_embeddings and cfg.peft == "none":
            ends = {"stream_embeddings": True}  # alt() drops it where the head is tied
            cands.append(("stream_embeddings=true streams the embedding and head", ends))
            if slots_ in cands:
                cands.append((f"stream_embeddings=true block_slots={fewest}",
                              {**ends, "block_slots": fewest}))
        if cfg.codec != "fp32" and cfg.method != "mezo":  # mezo: its half weights
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
        out.append(report("host memory", pl.host_mem_bytes + process_bytes(cfg),
                          pl.host_mem_available_bytes, "", pl.host_breakdown,
                          f"+ {_gib(process_bytes(cfg))} for the process", cands,
                          "host_mem_bytes", "fits_host"))
    return out


def suggest(cfg: RunConfig, gpu_mem_budget_bytes: int, gpu: str | None = None,
            calibration: dict | None = None, device: str = "cuda",
            shape: Preset | None = None) -> list[dict[str, Any]]:
    """zo-offload settings (resident_blocks 0..N x codec / master x the embedding and head
    resident or streamed x ``block_slots`` auto or the fewest) whose NVML-level GPU memory fits
    ``gpu_mem_budget_bytes``, best predicted tokens/s first; other knobs as in ``cfg``.
    ``device="cpu"`` ranks them for a CPU run (no GPU memory: every setting fits). The last
    two axes are the memory savers of the largest models (llama-3.1-405b fits 24 GiB only with
    both); each is tried only where it applies (an untied head, no adapters; a transfer with
    spare slots). ``shape``: the model's (``planner.plan``)."""
    base = cfg.replace(method="zo-offload", device=device, gpu_mem_limit_gb=0.0)
    p = shape or preset_of(cfg.model)
    keys = ("tokens_per_s", "step_seconds", "peak_gpu_mem_bytes", "nvml_gpu_mem_bytes",
            "host_mem_bytes", "pcie_bytes_per_step", "fits_host")
    out, n = [], p.num_layers
    for codec, master in [("fp32", "fp32"), ("bf16", "fp32"), ("bf16", "compressed-sr"),
                          ("fp16", "fp32"), ("fp16", "compressed-sr"), ("fp8-e4m3", "fp32"),
                          ("fp8-e5m2", "fp32")]:
        for savers in _savers(base.replace(codec=codec, master=master), p):
            for r in range(n + 1):
                try:
                    setting = base.replace(codec=codec, master=master, resident_blocks=r,
                                           **savers)
                except ConfigError:
                    break  # e.g. stream_embeddings with resident blocks the check refuses
                pl = plan(setting, gpu, calibration, shape=p)
                if pl.nvml_gpu_mem_bytes > gpu_mem_budget_bytes:
                    break  # more resident blocks only need more
                out.append({"codec": codec, "master": master, "resident_blocks": r,
                            "stream_embeddings": setting.stream_embeddings,
                            "block_slots": setting.block_slots,
                            **{k: getattr(pl, k) for k in keys}})
    return sorted(_alike_merged(out, n),
                  key=lambda d: (-d["tokens_per_s"], d["nvml_gpu_mem_bytes"]))


def _savers(cfg: RunConfig, p: Preset) -> list[dict[str, Any]]:
    """``cfg`` as it is, then with the embedding and head streamed and with the fewest slots,
    each where it applies (the config's own checks say where: a tied head, adapters)."""
    out: list[dict[str, Any]] = [{}]
    if not cfg.stream_embeddings:
        try:
            cfg.replace(stream_embeddings=True)
            out.append({"stream_embeddings": True})
        except ConfigError:
            pass  # a tied head or adapters: the embedding and head stay
    fewest = cfg.prefetch_depth + 1
    if cfg.block_slots == "auto" and SPARE_SLOTS[transfer_kind(cfg, p)] > 1:
        out += [{**o, "block_slots": fewest} for o in out]
    return out


def _alike_merged(rows: list[dict[str, Any]], layers: int) -> list[dict[str, Any]]:
    """One row per distinct prediction: with every block resident nothing streams, so codec and
    master change nothing (one row, the first tried: fp32 / fp32, ``all_resident`` true);
    otherwise codecs predicted alike at the same master and resident blocks share the first's
    row, the others listed in its ``alike`` (["fp16"]), in the order tried."""
    kept: dict[tuple, dict[str, Any]] = {}
    for row in rows:
        every = row["resident_blocks"] >= layers
        key = ("all resident",) if every else (  # nothing streams: slots and formats moot
            row["master"], row["resident_blocks"], row["stream_embeddings"], row["block_slots"],
            *(round(float(row[k]), 6) for k in ("tokens_per_s", "nvml_gpu_mem_bytes",
                                                "host_mem_bytes", "pcie_bytes_per_step")))
        if key in kept:
            if not every and row["codec"] not in kept[key]["alike"]:
                kept[key]["alike"].append(row["codec"])
        else:
            kept[key] = {**row, "alike": [], "all_resident": every}
    return list(kept.values())
