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
from workbench.engine.checkpoint import checkpoint_identity, checkpoint_step
from workbench.runs.rundir import RunWarning, holds_run_id


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


def identity(run_id: str, run_dir: Path | None, cfg: RunConfig, found: dict[str, Any],
             session: str | None = None, lineage: list[str] | None = None) -> dict[str, Any]:
    """What each checkpoint of the run carries: beside the run, the ``session`` (the process
    start or resume) that wrote it and the runs this one was copied from (``lineage``)."""
    return {"run_id": run_id, "run_dir": str(run_dir.resolve()) if run_dir else None,
            "model": cfg.model, "seed": cfg.seed, "data": digest(found),
            "session": session, "lineage": list(lineage or [])}


def copied_from(run_dir: Path, info: dict[str, Any]) -> Path | None:
    """The run directory ``run_dir``'s run was copied from (``cp -r A C``), else None.

    run.json names the folder the run was last started in; when that is another folder which
    still holds the same run (its run id), ``run_dir`` is a copy. A run that was moved (the
    old folder is gone or holds another run) is the same run."""
    recorded, run_id = info.get("run_dir"), info.get("run_id")
    if not recorded or not run_id:
        return None
    there, here = Path(recorded), run_dir.resolve()
    try:
        if there == here or there.exists() and there.samefile(here):
            return None
    except OSError:
        return None
    return there if holds_run_id(there, run_id) else None


def branch(run_dir: Path, source: Path, info: dict[str, Any], steps: int) -> str:
    """Make the record ``info`` of a copy a new run's: a new id, the ids it descends from
    (``lineage``) and where it was copied from; its history and the checkpoint sessions it
    inherited stay. Returns the line that tells the user."""
    old, new = info["run_id"], new_run_id()
    info.update(run_id=new, lineage=[*info.get("lineage", []), old],
                copied_from={"run_id": old, "run_dir": str(source), "steps": steps})
    return (f"--resume: {run_dir} is a copy of the run in {source} (run id {old}); it goes on "
            f"as a new run (run id {new}) and leaves the original's checkpoints to it")


def adopt_copy(run_dir: Path, info: dict[str, Any], config: dict[str, Any], steps: int,
               root: Path | None) -> str | None:
    """At a resume of ``run_dir``: when it is a copy of a run that is still there, make its
    record ``info`` a new run's (``branch``) and return the line that says so; None when it is
    no copy.

    Raises:
        ConfigError: the copy would write into the original's ``checkpoint_dir`` (``root``,
            outside both folders, as the copied ``config`` names it): checkpoints of one step
            share a name there, so the copy needs a folder of its own.
    """
    source = copied_from(run_dir, info)
    if source is None:
        return None
    old = config.get("checkpoint_dir") or ""
    theirs = Path(old).expanduser() if old else source / "checkpoints"
    if root is not None and theirs.resolve() == root.resolve() and not _within(root, run_dir):
        raise ConfigError([f"checkpoint_dir: {root} holds the checkpoints of the run in "
                           f"{source}, which {run_dir} is a copy of; give the copy its own "
                           f"(--set checkpoint_dir=DIR): it resumes from the original's "
                           f"checkpoints up to the copy and writes its own in DIR"])
    return branch(run_dir, source, info, steps)


def _within(child: Path, parent: Path) -> bool:
    return child.resolve() == parent.resolve() or parent.resolve() in child.resolve().parents


def lineage_info(previous: dict[str, Any], run_dir: Path | None) -> dict[str, Any]:
    """The ``info`` entries that say whose a run is, for its record: the folder it runs in,
    the sessions its history came from with this one's added, and (a copy) its lineage."""
    out = {"run_dir": str(run_dir.resolve()) if run_dir is not None else None,
           "sessions": [*(previous.get("sessions") or []), new_run_id()]}
    out.update((k, previous[k]) for k in ("lineage", "copied_from") if previous.get(k))
    return out


def owner(info: dict[str, Any]) -> dict[str, Any]:
    """Who a resume may take checkpoints of: the run's id, the sessions its history came
    from, the runs it descends from and the steps it took over from the last of them."""
    return {"run_id": info.get("run_id"), "sessions": list(info.get("sessions") or []),
            "lineage": list(info.get("lineage") or []),
            "copied": (info.get("copied_from") or {}).get("steps")}


def wrote(ident: dict[str, Any] | None, me: dict[str, Any], step: int) -> bool:
    """The checkpoint of ``ident`` at ``step`` is one the run ``me`` (``owner``) wrote: in one
    of its sessions (a copy's include those of the history it took over); a checkpoint from
    before sessions by its run id, or an ancestor's up to the steps the copy took over. One
    from before run ids counts as the run's own."""
    if ident is None or not me["run_id"]:
        return True
    if ident.get("session") and me["sessions"]:
        return ident["session"] in me["sessions"]
    if ident.get("run_id") == me["run_id"]:
        return True
    return ident.get("run_id") in me["lineage"] and me["copied"] is not None \
        and step <= me["copied"]


def related(ident: dict[str, Any], me: dict[str, Any]) -> bool:
    """``ident``'s run and ``me`` are copies of one run (one descends from the other, or both
    from a third): a shared checkpoint_dir holds both, and each leaves the other's alone."""
    theirs = {ident.get("run_id"), *(ident.get("lineage") or [])} - {None}
    return bool(theirs & {me["run_id"], *me["lineage"]})


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


def foreign_checkpoints(paths: list[Path], me: dict[str, Any]) -> list[tuple[Path, dict]]:
    """Checkpoints among ``paths`` the run ``me`` (``owner``) did not write, with their
    identity. A checkpoint without an identity (written before ids) counts as the run's own."""
    out = []
    for p in paths:
        ident = checkpoint_identity(p)
        if not wrote(ident, me, checkpoint_step(p)):
            out.append((p, ident))
    return out


def owner_text(ident: dict[str, Any]) -> str:
    """'run id 3f2a..., started in /runs/b' for a checkpoint's identity."""
    where = f", written by the run in {ident['run_dir']}" if ident.get("run_dir") else ""
    return f"run id {ident.get('run_id')}{where}"
