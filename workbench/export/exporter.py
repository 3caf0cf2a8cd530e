"""``export_run``: a run directory's weights -> a folder transformers or peft loads.

One pass over the groups, one group in host memory at a time: each group is read (from
``RUN_DIR/weights`` or a checkpoint, its pending update applied: ``source.py``), written into
the open shard (``folder.py``), then fingerprinted, so an export of a run's final weights is
checked against the run's own ``param_digest`` (fp32, before any cast). Written in a narrower
dtype (bf16, fp16), the weights are rounded: the folder then records the digest of what it
holds, read back after writing, each group checked bit for bit against the rounding of the
run's weights read (``weights_digest``; ``source_digest`` is the fp32 one). Host memory: the group in fp32, a 16 MiB cast buffer,
the digest's fp64 scratch (``engine.groups.fingerprint``), and for a checkpoint with a pending
update the update's own temporaries (a group-sized z without the fused kernel).

Kinds: every weight (``peft=none``: config.json, generation_config.json, safetensors weights,
tokenizer, README.md); an adapter (``peft=lora``: adapter_config.json,
adapter_model.safetensors, tokenizer, README.md); merged (``peft=lora`` with ``merge``: the
base the run computed with, each block's adapter folded in, as a full model folder).
"""
from __future__ import annotations

import copy
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from workbench.config import ConfigError, RunConfig
from workbench.engine.groups import (GroupLayout, LazyFlats, adapter_layouts, build_layouts,
                                     fingerprint)
from workbench.export.base_ref import BASE_FOLDER, BaseRef, base_ref, portable
from workbench.export.card import model_card
from workbench.export.positions import max_positions
from workbench.export.task import run_task
from workbench.export.folder import AtomicFolder, WeightsWriter, parse_size, tensor_specs
from workbench.export.peft_folder import merge_block, peft_key, write_adapter_config
from workbench.export.safetensors_stream import read_fp32, read_header
from workbench.export.source import ExportError, RunWeights, run_weights
from workbench.export.tokenizer_files import save_tokenizer
from workbench.models.adapter import BlockAdapter
from workbench.runs.outputs import EXPORT_MARKER, check_export_out

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
KINDS = {"model": "model", "adapter": "PEFT adapter", "merged": "merged model"}
INFO_FILE = EXPORT_MARKER  # provenance: the run, its digests, the files written


@dataclass
class ExportResult:
    """What an export wrote. ``digest``: the fp32 digest of the run's weights it read (the
    run's ``param_digest`` convention: for an adapter, of the adapter); ``matches_run``: it
    equals the run's ``param_digest`` (None: the weights are not the run's final ones);
    ``written_digest``: the same digest of the weights the folder holds, read back (rounded to
    ``dtype``: each group checked against the rounding of the weights read)."""

    out: Path
    kind: str  # "model", "adapter" or "merged"
    step: int
    origin: str
    dtype: str
    digest: str
    matches_run: bool | None
    seconds: float
    files: list[str]
    numels: list[int]  # elements of each group written (base groups for a merge)
    written_digest: str = ""  # the exported weights' own digest, read back as fp32 (rounded)

    @property
    def rounded(self) -> bool:
        """The weights were rounded to a narrower dtype than the run's fp32 on the way out
        (``written_digest`` then differs from ``digest`` unless they were exact in it)."""
        return bool(self.written_digest) and self.kind != "merged" and self.dtype != "float32"
    base: str = ""  # an adapter's base as adapter_config.json names it (a hub id or "base")


def export_run(run_dir: str | Path, out: str | Path, *, dtype: str | None = None,
               step: int | None = None, shard_size: int | str = "5GB", merge: bool = False,
               force: bool = False, overwrite: bool = False, device: str = "cpu",
               progress: Callable[[int, int], None] | None = None) -> ExportResult:
    """Export a run's weights to ``out`` (see the module doc).

    Args:
        dtype: fp32, bf16 or fp16 (None: the model's own, fp32 for presets and adapters).
        step: a checkpoint's weights (or ``RUN_DIR/weights``') after this many steps.
        shard_size: largest weights file (bytes, or "5GB", "500MB", "2GiB").
        merge: a ``peft=lora`` run: the merged full model instead of the adapter.
        force: a run that is running, failed or never started (its newest kept weights).
        overwrite: replace ``out`` if it exists.
        device: where a checkpoint's pending update is applied (``source.py``).
        progress: called with (groups done, groups) as the export goes.
    Raises:
        ExportError: one line (bad option, the run's status, no weights, an existing or
            unwritable ``out``, a full disk); nothing is left at ``out``.
    """
    began = time.perf_counter()
    if dtype is not None and dtype not in DTYPES:
        raise ExportError(f"--dtype: {dtype!r} is not one of {', '.join(DTYPES)}")
    size = parse_size(shard_size) if isinstance(shard_size, str) else int(shard_size)
    check_export_out(Path(out), Path(run_dir), overwrite)  # an export, the run or other files?
    folder = AtomicFolder(out, overwrite)  # an existing --out is refused before any reading
    weights = run_weights(run_dir, step, force, device)
    try:
        return _export(folder, weights, dtype, size, merge, progress, began)
    finally:
        weights.close()


def _export(folder: AtomicFolder, weights: RunWeights, dtype: str | None, size: int,
            merge: bool, progress, began: float) -> ExportResult:
    cfg = _run_config(weights.config)
    if merge and cfg.peft != "lora":
        raise ExportError("--merge: only a peft=lora run has an adapter to merge")
    kind = "merged" if merge else "adapter" if cfg.peft == "lora" else "model"
    model = _Model(cfg)
    model.check(weights)
    # default: the model's own dtype; an adapter's, fp32 (it trained in fp32, as peft keeps it)
    want = DTYPES[dtype] if dtype else torch.float32 if kind == "adapter" else model.own_dtype()
    with folder as tmp:
        ids = save_tokenizer(cfg.model, cfg.resolved_data_dir, tmp,  # first: it may refuse
                             max_positions(model.skeleton.config))
        if kind == "adapter":
            digest, written = _write_adapter(tmp, weights, model, want, size, progress)
            if model.base_ref().beside:  # no Hub repository holds it: it goes along
                _write_base(tmp / BASE_FOLDER, model, torch.float32 if dtype is None else want,
                            size, ids)
        else:
            digest, written = _write_model(tmp, weights, model, want, size, progress,
                                           merged=merge)
        if kind != "adapter":
            model.write_configs(tmp, want, ids)
        matches = (digest == weights.expected_digest) if weights.expected_digest else None
        if matches is False and not weights.pending:
            raise ExportError(f"{weights.origin}: the weights read back do not match the run's "
                              f"param_digest ({digest[:16]} vs {weights.expected_digest[:16]}); "
                              "they are damaged")
        info = _facts(weights, kind, model, want, digest, written, folder.out)
        (tmp / "README.md").write_text(model_card(info))
        facts = {k: v for k, v in info.items() if k not in ("config", "evals")}
        files = sorted([p.name for p in tmp.iterdir()] + [INFO_FILE])
        (tmp / INFO_FILE).write_text(json.dumps(facts | {"matches_run_digest": matches,
                                                         "files": files}, indent=1))
    numels = [lay.numel for lay in (model.base if kind != "adapter" else model.trainable)]
    return ExportResult(folder.out, kind, weights.step, weights.origin, NAMES[want], digest,
                        matches, time.perf_counter() - began, files, numels, written,
                        model.base_ref().name if kind == "adapter" else "")


def export_line(run_dir: Path, out: Path) -> str:
    """Export ``run_dir`` to ``out`` (replaced if there) and say how it went in one line (the
    panel's Export model button)."""
    try:
        res = export_run(run_dir, out, overwrite=True)
    except ConfigError as e:  # ExportError and the run's settings: one line each
        return f"export failed: {'; '.join(e.problems)}"
    return (f"exported the {KINDS[res.kind]} after {res.step} steps to {res.out} "
            f"({res.dtype}, {res.seconds:.1f} s)")


def _run_config(config: dict[str, Any]) -> RunConfig:
    """The run's config as a ``RunConfig`` for the model's side only: its data source is not
    read (it may be gone), so it is checked as synthetic."""
    try:
        return RunConfig.from_saved(config, data="synthetic", eval_every=0)
    except ConfigError as e:
        raise ExportError(f"the run's settings no longer check out ({e.problems[0]}); is its "
                          "model still there?") from None


class _Model:
    """The run's model skeleton (meta weights: nothing allocated) and its group layouts."""

    def __init__(self, cfg: RunConfig):
        from workbench.engine.peft import block_adapter
        from workbench.models.build import build_skeleton

        self.cfg = cfg
        self.skeleton, self.source = build_skeleton(cfg.model)
        self.adapter: BlockAdapter = block_adapter(self.skeleton, cfg)
        embed, blocks, head = build_layouts(self.adapter)
        self.base = [embed, *blocks, head]
        self.trainable = adapter_layouts(self.adapter) if cfg.peft == "lora" else self.base

    def check(self, weights: RunWeights) -> None:
        have = list(zip(weights.names, weights.numels))
        want = [(lay.name, lay.numel) for lay in self.trainable]
        if have != want:
            raise ExportError(f"{weights.origin}: its groups do not match {self.cfg.model}'s "
                              f"({len(have)} groups vs {len(want)}); the model changed since "
                              "the run?")

    def own_dtype(self) -> torch.dtype:
        """The dtype the model's config names (fp32 when none, or for random-init presets)."""
        from workbench.presets import lookup

        preset = lookup(self.cfg.model)
        if preset is not None and preset.pretrained is None:
            return torch.float32
        own = getattr(self.skeleton.config, "dtype", None) or torch.float32
        own = getattr(torch, own) if isinstance(own, str) else own
        return own if own in NAMES else torch.float32

    def base_ref(self) -> BaseRef:
        """What the exported folder names as its base (``base_ref.py``)."""
        return base_ref(self.cfg.model, getattr(self.source, "folder", None))

    def write_configs(self, folder: Path, dtype: torch.dtype, ids: dict[str, int]) -> None:
        """config.json (architectures, dtype) and generation_config.json: the model folder's
        own (the tokenizer's special ids filling what it lacks), else one made from the config
        with the tokenizer's ids (the tiny presets' byte tokenizer numbers its specials its
        own way)."""
        from transformers import GenerationConfig

        from workbench.presets import lookup

        config = copy.deepcopy(self.skeleton.config)
        if lookup(self.cfg.model) is not None:  # a preset: its config is made here, so it
            for key, value in ids.items():  # takes the tokenizer's ids (tiny-opt's OPT
                setattr(config, key, value)  # defaults number bos/pad 2/1, its bytes 1/0)
        config.architectures = [type(self.skeleton).__name__]
        config.dtype = NAMES[dtype]
        config.save_pretrained(folder)
        src = getattr(self.source, "folder", None)
        own = src is not None and (Path(src) / "generation_config.json").is_file()
        gen = GenerationConfig.from_pretrained(src) if own else \
            GenerationConfig.from_model_config(config)
        for key, value in ids.items():
            if not own or getattr(gen, key, None) is None:
                setattr(gen, key, value)
        gen.save_pretrained(folder)

    def base_group(self, k: int) -> torch.Tensor:
        """Base group k as the run computed with it (fp32 (n,), CPU)."""
        from workbench.engine.peft import frozen_block
        from workbench.engine.storage import materialise

        lay, cpu = self.base[k], torch.device("cpu")
        if 0 < k < len(self.base) - 1:
            return frozen_block(lay, self.source, self.cfg, cpu).values()
        return materialise(lay, self.source, self.cfg.seed, cpu)


def _write_model(tmp: Path, weights: RunWeights, model: _Model, dtype: torch.dtype,
                 size: int, progress, merged: bool) -> tuple[str, str]:
    """The weights files of a full model; returns the digest of the trained groups read and
    of the weights written (``_read_back``; the same when nothing was rounded)."""
    rounded: list[str] = []
    with WeightsWriter(tmp, tensor_specs(model.base), dtype, size) as writer:
        if merged:
            found = _merged(writer, weights, model, progress)
            return found, found
        found = fingerprint(_written(writer, weights.groups, progress, rounded))[0]
    return found, _read_back(writer, rounded, found)


def _written(writer: WeightsWriter, groups, progress, rounded: list[str]):
    """Each group written, then handed on (to the digest), one at a time; ``rounded`` gets the
    SHA-256 of each group's bytes in the writer's dtype when that rounds (not fp32)."""
    n = len(groups)
    for k in range(n):
        values = groups[k]
        writer.write(k, values)
        if writer.dtype != torch.float32:
            rounded.append(_rounded_sha(hashlib.sha256(), values, writer.dtype).hexdigest())
        if progress is not None:
            progress(k + 1, n)
        yield values
        del values


CHECK_CHUNK = 4 << 20  # elements rounded at a time for the check (8 MiB of bf16 / fp16)


def _rounded_sha(hasher, values: torch.Tensor, dtype: torch.dtype):
    """``hasher`` updated with the bytes of ``values`` (fp32, (n,)) rounded to ``dtype`` (16
    bits), a chunk at a time: the check holds no second copy of a group."""
    for at in range(0, values.numel(), CHECK_CHUNK):
        hasher.update(values[at:at + CHECK_CHUNK].to(dtype).view(torch.int16).numpy().data)
    return hasher


def _read_back(writer: WeightsWriter, rounded: list[str], found: str) -> str:
    """The digest (``fingerprint``, fp32) of the weights ``writer`` wrote, read back group by
    group from its files, each group checked bit for bit against the rounding of the run's
    weights made while writing. fp32 rounds nothing: the digest read is the digest written."""
    if not rounded:
        return found
    headers: dict[Path, tuple[int, dict]] = {}

    def group(k: int) -> torch.Tensor:
        values = torch.empty(sum(s.numel for s in writer.specs[k]), dtype=torch.float32)
        hasher, at = hashlib.sha256(), 0
        for s in writer.specs[k]:  # one tensor read at a time into the group
            file = writer.folder / writer.names[writer.shard_of[s.name]]
            headers.setdefault(file, read_header(file))
            part = read_fp32(file, s.name, headers[file])
            _rounded_sha(hasher, part, writer.dtype)
            values[at:at + part.numel()] = part
            at += part.numel()
            del part
        if hasher.hexdigest() != rounded[k]:
            raise ExportError(f"{writer.names[0]}: group {k} does not read back as the "
                              "rounding of the run's weights written; the disk is failing?")
        return values

    return fingerprint(LazyFlats(len(writer.specs), group))[0]


def _merged(writer: WeightsWriter, weights: RunWeights, model: _Model, progress) -> str:
    """Base groups with the adapters folded in; checks the base against ``base_digest`` and
    returns the adapters' digest."""
    scaling = float(model.cfg.lora_alpha) / model.cfg.lora_rank
    n = len(model.base)

    def bases():
        for k in range(n):
            flat = model.base_group(k)
            yield flat  # the digest reads the base before it is merged
            if 0 < k < n - 1:
                merge_block(model.base[k], flat, model.trainable[k - 1],
                            weights.groups[k - 1], scaling)
            writer.write(k, flat)
            if progress is not None:
                progress(k + 1, n)
            del flat

    base_digest = fingerprint(bases())[0]
    expected = weights.record.base_digest
    if expected and base_digest != expected:
        raise ExportError(f"--merge: the base rebuilt here differs from the one the run "
                          f"trained on (base_digest {base_digest[:16]} vs {expected[:16]}); was "
                          f"{model.cfg.model} changed, or trained on another device type?")
    return fingerprint(weights.groups)[0]


def _write_adapter(tmp: Path, weights: RunWeights, model: _Model, dtype: torch.dtype,
                   size: int, progress) -> tuple[str, str]:
    rounded: list[str] = []
    with WeightsWriter(tmp, tensor_specs(model.trainable, peft_key), dtype, max(size, 1 << 62),
                       prefix="adapter_model") as writer:  # one file, as peft writes it
        digest = fingerprint(_written(writer, weights.groups, progress, rounded))[0]
    ref = model.base_ref()
    write_adapter_config(tmp, weights.config, model.trainable, ref.name, ref.revision)
    return digest, _read_back(writer, rounded, digest)


def _write_base(folder: Path, model: _Model, dtype: torch.dtype, size: int,
                ids: dict[str, int]) -> None:
    """The base an adapter trained on, as a full model folder: each group as the run computed
    with it (a compressed ``base_codec``'s decoded values), its configs and tokenizer."""
    folder.mkdir()
    save_tokenizer(model.cfg.model, model.cfg.resolved_data_dir, folder,
                   max_positions(model.skeleton.config))
    with WeightsWriter(folder, tensor_specs(model.base), dtype, size) as writer:
        for k in range(len(model.base)):
            writer.write(k, model.base_group(k))
    model.write_configs(folder, dtype, ids)


def _facts(weights: RunWeights, kind: str, model: _Model, dtype: torch.dtype,
           digest: str, written: str, out: Path) -> dict[str, Any]:
    """The export's provenance. ``weights_digest``: of the weights the folder holds (read back
    as fp32); ``source_digest``: of the run's weights read (fp32, before any rounding). No local
    path: the run by its folder's name, the task's data relative to the export (``out``)."""
    rec, ref = weights.record, model.base_ref()
    return {"kind": kind, "run_dir": portable(str(weights.run_dir.resolve())),
            "step": weights.step,
            "run_steps": len(rec.steps), "status": rec.status, "error": rec.error,
            "origin": weights.origin, "dtype": NAMES[dtype], "weights_digest": written,
            "source_digest": digest,
            "param_digest": rec.param_digest, "base_digest": rec.base_digest,
            "base": ref.name, "base_revision": ref.revision, "base_model": ref.hub_id,
            "base_beside": ref.beside and kind == "adapter", "trained_on": ref.trained_on,
            "pending_applied": weights.pending, "task": run_task(rec.config, out),
            "config": rec.config, "evals": rec.evals}


def group_layouts(cfg: RunConfig) -> list[GroupLayout]:
    """The trainable group layouts of ``cfg``'s model (what its checkpoints hold)."""
    return _Model(cfg).trainable
