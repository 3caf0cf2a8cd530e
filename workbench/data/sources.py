"""Where examples come from: the ``data`` setting -> the rows of the train and dev splits.

``data`` is one of
- ``embedded``: the objective's small set in ``assets/`` (always there);
- ``sst2``: ``data_dir/sst2/{train,dev}.tsv``, else GLUE SST-2 through ``datasets``;
- ``hf:NAME[:CONFIG]``: ``datasets.load_dataset(NAME, CONFIG)`` (see ``data/hub.py``);
- a ``.jsonl``, ``.csv``, ``.tsv`` or ``.parquet`` file;
- a folder written by ``save_to_disk``, or holding ``train.*`` and ``dev.*`` / ``validation.*``
  files in one of those formats.
The dev split is the one named ``dev``, ``validation``, ``valid`` or ``val`` (names of one split: a
source with two of them is refused), else ``test``; a source with none (a single file, a folder
with only ``train.*``) gives every tenth example (rows 10, 20, ...) to dev. ``synthetic`` has no
rows (``data/batches.py`` makes its batches). ``sst2`` needs ``data_dir/sst2/``: without it the
run is refused naming ``data_dir`` (``hf:nyu-mll/glue:sst2`` downloads the same data).
"""
from __future__ import annotations

from pathlib import Path

from workbench.config import REPO_ROOT, ConfigError, RunConfig
from workbench.data.fields import Example, classify_examples
from workbench.data.files import SUFFIXES, DataError, Rows, read_file

ASSETS = REPO_ROOT / "assets"
EMBEDDED = {"classify": ASSETS / "sentiment", "completion": ASSETS / "completion",
            "lm": ASSETS / "plain-text"}
EMBEDDED_DIR = EMBEDDED["classify"]
DEV_NAMES = ("dev", "validation", "valid", "val", "test")
DEV_SYNONYMS = DEV_NAMES[:4]  # one split under several names; ``test`` only stands in for them
SST2_HUB = "hf:nyu-mll/glue:sst2"
HOLD_OUT = 10  # without a dev split, every HOLD_OUT-th example is held out for dev

__all__ = ["Example", "DataError", "load_examples", "load_rows", "load_split", "read_tsv"]


def load_rows(data: str, data_dir: Path | None, objective: str = "classify") -> tuple[Rows, Rows]:
    """(train, dev) rows of a ``data`` setting; raises ``DataError`` (one line) if unusable."""
    if data == "synthetic":
        raise DataError("synthetic data has no rows; data/batches.py makes its batches")
    if data == "embedded":
        return _folder(EMBEDDED[objective])
    if data == "sst2":
        return _folder(sst2_folder(data_dir))
    if data.startswith("hf:"):
        return _pick(_hub(data), data)
    path = Path(data).expanduser()
    if path.is_file():
        return _pick({"train": read_file(path)}, str(path))
    if path.is_dir():
        return _folder(path)
    raise DataError(f"{data!r} is not embedded, sst2, synthetic, hf:NAME[:CONFIG], a file or a "
                    "folder")


def sst2_folder(data_dir: Path | None) -> Path:
    """``data_dir/sst2``, where data=sst2 reads; cheap, so a run checks it before the tokenizer
    (which may try the Hub for a while).

    Raises:
        ConfigError: no ``sst2/train.tsv`` there, naming ``data_dir``.
    """
    folder = Path(data_dir or ".") / "sst2"
    if not (folder / "train.tsv").is_file():
        why = "does not exist" if not Path(data_dir or ".").is_dir() else "has no sst2/train.tsv"
        raise ConfigError([f"data_dir: {data_dir} {why} (data=sst2 reads data_dir/sst2/"
                           "train.tsv and dev.tsv); set data_dir to the folder holding sst2/, or "
                           f"data={SST2_HUB} to download SST-2 through datasets"])
    return folder


def _hub(spec: str) -> dict[str, Rows]:
    from workbench.data.hub import load_hub

    return load_hub(spec)


def _folder(folder: Path) -> tuple[Rows, Rows]:
    from workbench.data.hub import is_saved_dataset, load_saved

    if is_saved_dataset(folder):
        return _pick(load_saved(folder), str(folder))
    splits = {}
    for name in ("train", *DEV_NAMES):
        found = [p for p in sorted(folder.glob(f"{name}.*")) if p.suffix.lower() in SUFFIXES]
        if len(found) > 1:
            raise DataError(f"{folder}: several {name} files ({', '.join(p.name for p in found)}); "
                            "keep one")
        if found:
            splits[name] = found[0]
    if "train" not in splits:
        raise DataError(f"{folder}: no train file (train{{{','.join(SUFFIXES)}}}) and not a "
                        "save_to_disk folder")
    _one_dev(list(splits), str(folder), {n: p.name for n, p in splits.items()})
    dev = next((n for n in DEV_NAMES if n in splits), None)
    read = {"train": read_file(splits["train"])}
    if dev is not None:
        read[dev] = read_file(splits[dev])
    return _pick(read, str(folder))


def _pick(splits: dict[str, Rows], origin: str) -> tuple[Rows, Rows]:
    """(train, dev) from named splits; without a dev split, dev is every HOLD_OUT-th row."""
    if "train" not in splits:
        raise DataError(f"{origin}: no train split (splits: {', '.join(splits) or 'none'})")
    train = splits["train"]
    _one_dev(list(splits), origin, {n: n for n in splits})
    dev = next((splits[n] for n in DEV_NAMES if n in splits), None)
    if dev is not None:
        return train, dev
    n = len(train.rows)
    if n < 2:
        raise DataError(f"{origin}: {n} example(s); a source without a dev split needs at least 2 "
                        f"(every {HOLD_OUT}th goes to dev)")
    held = [i for i in range(n) if i % HOLD_OUT == HOLD_OUT - 1] or [n - 1]
    kept = sorted(set(range(n)) - set(held))
    return train.subset(kept), train.subset(held)


def _one_dev(names: list[str], origin: str, shown: dict[str, str]) -> None:
    """Refuse two names of the dev split (``dev.tsv`` beside ``validation.tsv``): which one the
    run evaluates on must not depend on an order of names."""
    found = [n for n in DEV_SYNONYMS if n in names]
    if len(found) > 1:
        raise DataError(f"{origin}: several dev splits ({', '.join(shown[n] for n in found)}); "
                        "keep one (dev, validation, valid and val name the same split)")


# --- the sentiment API the recipe used before objectives (kept: callers and tests use it) ------
def read_tsv(path: Path) -> list[Example]:
    """GLUE-style ``sentence<TAB>label`` with a header (sentences may contain quotes)."""
    return classify_examples(read_file(Path(path)), 2)


def load_examples(cfg: RunConfig) -> tuple[list[Example], list[Example]]:
    """(train, dev) two-label examples of ``cfg.data``: ``train_samples`` / ``eval_samples`` of
    them, fields as the settings name them; read once, before any model is built.

    Raises:
        DataError: one line naming the file, the line and what is wrong there.
    """
    train, dev = load_rows(cfg.data, cfg.resolved_data_dir)
    fields = {"text_field": cfg.text_field, "label_field": cfg.label_field}
    train, dev = classify_examples(train, 2, **fields), classify_examples(dev, 2, **fields)
    return (train[:cfg.train_samples] if cfg.train_samples else train,
            dev[:cfg.eval_samples] if cfg.eval_samples else dev)


def load_split(data: str, split: str, data_dir: Path | None, text_field: str = "",
               label_field: str = "") -> list[Example]:
    """Two-label examples of ``split`` ("train" or "dev") from ``data``."""
    train, dev = load_rows(data, data_dir)
    return classify_examples(train if split == "train" else dev, 2, text_field, label_field)
