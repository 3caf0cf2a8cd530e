"""A run's identity: an id given at its first start, and fingerprints of the data and tokenizer
it trains on. run.json keeps them (``info``), every checkpoint carries them (its manifest's
``identity``), and a resume takes only its own run's checkpoints, on the data it started with.

Fingerprints are cheap: a data file's SHA-256 is taken while it is read anyway; a ``datasets``
table (``hf:``, ``save_to_disk``) gives its own fingerprint; a tokenizer is hashed from its
serialised vocabulary and rules, in memory.
"""
from __future__ import annotations

import hashlib
import json
import uuid
import warnings
from pathlib import Path
from typing import Any

from workbench.config import ConfigError, RunConfig
from workbench.engine.checkpoint import checkpoint_identity
from workbench.runs.rundir import RunWarning


def new_run_id() -> str:
    """16 hex digits, random: two runs never share one."""
    return uuid.uuid4().hex[:16]


def data_fingerprint(cfg: RunConfig, task, tokenizer) -> dict[str, Any]:
    """What the run reads: per split (train, dev) its source and content digest, and the
    tokenizer's digest. Synthetic batches are a function of the fixed settings alone."""
    if cfg.data == "synthetic" or task is None:
        return {"train": {"source": "synthetic", "digest": "synthetic"}, "tokenizer": "none"}
    out: dict[str, Any] = {split: {"source": origin, "digest": digest}
                           for split, (origin, digest) in task.sources.items()}
    out["tokenizer"] = tokenizer_digest(tokenizer)
    return out


def tokenizer_digest(tok) -> str:
    """``sha256:<hex>`` of a Hugging Face tokenizer's serialised form (vocabulary, merges,
    normaliser, special tokens); the byte tokenizer is code, named by its class."""
    inner = getattr(tok, "tok", None)
    if inner is None:
        return type(tok).__name__
    backend = getattr(inner, "backend_tokenizer", None)
    text = backend.to_str() if backend is not None else json.dumps(inner.get_vocab(),
                                                                    sort_keys=True)
    specials = json.dumps(getattr(inner, "special_tokens_map", {}), sort_keys=True, default=str)
    return "sha256:" + hashlib.sha256((text + specials).encode()).hexdigest()


def digest(found: dict[str, Any]) -> str:
    """One short digest of a fingerprint's contents (sources' paths left out: a moved file with
    the same bytes is the same data)."""
    parts = {k: (v["digest"] if isinstance(v, dict) else v) for k, v in found.items()}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def identity(run_id: str, run_dir: Path | None, cfg: RunConfig,
             found: dict[str, Any]) -> dict[str, Any]:
    """What each checkpoint of the run carries."""
    return {"run_id": run_id, "run_dir": str(run_dir.resolve()) if run_dir else None,
            "model": cfg.model, "seed": cfg.seed, "data": digest(found)}


def data_changes(before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """What differs between two fingerprints, a phrase each ('train split (x.tsv)', ...)."""
    out = []
    for key in sorted(set(before) | set(now)):
        old, new = before.get(key), now.get(key)
        d_old = old.get("digest") if isinstance(old, dict) else old
        d_new = new.get("digest") if isinstance(new, dict) else new
        if d_old != d_new:
            source = (new or old).get("source") if isinstance(new or old, dict) else None
            what = "the tokenizer" if key == "tokenizer" else f"the {key} split"
            out.append(what + (f" ({source})" if source else ""))
    return out


def check_data(before: dict[str, Any] | None, before_digest: str | None,
               now: dict[str, Any], ok: bool) -> list[str]:
    """What changed in the data since the run started (empty: nothing, or nothing known).

    Args:
        before: the run's recorded fingerprint (None: a record from before fingerprints).
        before_digest: else its checkpoint's ``identity["data"]``.
        ok: ``data_changed_ok``: a change is accepted (the caller records it).
    Raises:
        ConfigError: the data changed and ``ok`` is not set.
    """
    if before is not None:
        changed = data_changes(before, now)
    elif before_digest is not None and before_digest != digest(now):
        changed = ["the data or the tokenizer"]
    else:
        changed = []
    if changed and not ok:
        raise ConfigError([f"data: {', '.join(changed)} changed since this run started (its "
                           "content fingerprint differs); a resume continues on the data it "
                           "began with: restore it, or set data_changed_ok=true to go on with "
                           "the new data (run.json records that)"])
    return changed


def accept_data(cfg: RunConfig, previous, paths: list[str],
                found: dict[str, Any]) -> dict[str, Any]:
    """The run's data against what it started on, at a resume: ``info`` entries to record
    (``data_changed``: each accepted change, with the steps recorded before it).

    Args:
        previous: the run's record (None: a resume from checkpoints only).
        paths: the checkpoints the resume may load, newest first (their identity is the
            reference when the record has no fingerprint).
    Raises:
        ConfigError: the data changed and ``data_changed_ok`` is not set.
    """
    before = previous.info.get("data_fingerprint") if previous is not None else None
    before_digest = None
    if before is None and paths:
        before_digest = (checkpoint_identity(Path(paths[0])) or {}).get("data")
    changed = check_data(before, before_digest, found, cfg.data_changed_ok)
    history = list(previous.info.get("data_changed", [])) if previous is not None else []
    if changed:
        warnings.warn(f"data: {', '.join(changed)} changed since the run started; going on with "
                      "the new data (data_changed_ok=true, recorded in run.json)", RunWarning)
        history.append({"changed": changed, "after_steps": len(previous.steps) if previous
                        else None, "before": before, "before_digest": before_digest})
    return {"data_changed": history} if history else {}


def foreign_checkpoints(paths: list[Path], run_id: str | None) -> list[tuple[Path, dict]]:
    """Checkpoints among ``paths`` written by a run other than ``run_id``, with their identity.
    A checkpoint without an identity (written before ids) counts as the run's own."""
    out = []
    for p in paths:
        ident = checkpoint_identity(p)
        if run_id and ident and ident.get("run_id") != run_id:
            out.append((p, ident))
    return out


def owner_text(ident: dict[str, Any]) -> str:
    """'run id 3f2a..., started in /runs/b' for a checkpoint's identity."""
    where = f", written by the run in {ident['run_dir']}" if ident.get("run_dir") else ""
    return f"run id {ident.get('run_id')}{where}"
