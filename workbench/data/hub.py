"""Rows through ``datasets``: ``hf:NAME[:CONFIG]`` and folders written by ``save_to_disk``.

``datasets`` is imported here only, and lazily, so the engine layer works without it. Online,
``hf:`` downloads through ``datasets.load_dataset``; offline (``HF_HUB_OFFLINE=1`` or
``HF_DATASETS_OFFLINE=1``) it uses the local cache, and a data set that is not cached is refused in
one line. NAME may also be a local folder of data files, which ``load_dataset`` reads as such.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from workbench.data.files import DataError, Rows


def is_saved_dataset(folder: Path) -> bool:
    """True for a folder written by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk``."""
    return (folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file()


def _datasets():
    try:
        import datasets
    except ImportError:
        raise DataError("this data source needs the `datasets` package; install "
                        "zo-workbench[data]") from None
    return datasets


def offline() -> bool:
    """Whether the Hugging Face libraries were told to stay off the network."""
    on = ("1", "ON", "YES", "TRUE")
    return any(os.environ.get(k, "").upper() in on
               for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def load_hub(spec: str) -> dict[str, Rows]:
    """Every split of ``hf:NAME[:CONFIG]``, by split name."""
    datasets = _datasets()
    name, _, config = spec[len("hf:"):].partition(":")
    try:
        loaded = datasets.load_dataset(name, config or None)
    except Exception as e:  # the Hub client raises many types; the first line says which
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if offline():
            raise DataError(f"{spec}: not in the local cache and the Hugging Face libraries are "
                            f"offline (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE); run once online "
                            f"to cache it ({first})") from None
        raise DataError(f"{spec}: datasets.load_dataset failed: {first}") from None
    return _splits(datasets, loaded, spec)


def load_saved(folder: Path) -> dict[str, Rows]:
    """Every split of a ``save_to_disk`` folder (a single ``Dataset`` is the split ``train``)."""
    datasets = _datasets()
    try:
        loaded = datasets.load_from_disk(str(folder))
    except Exception as e:
        raise DataError(f"{folder}: not a readable save_to_disk folder ({type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''})") from None
    return _splits(datasets, loaded, str(folder))


def _splits(datasets, loaded, origin: str) -> dict[str, Rows]:
    if hasattr(loaded, "column_names") and isinstance(loaded.column_names, list):
        loaded = {"train": loaded}  # one Dataset, no splits
    out = {}
    for split, ds in loaded.items():
        rows = ds.to_list()
        # ``datasets`` fingerprints each table by its content's history (files read, transforms
        # applied): cheaper than hashing the rows, and it changes when they do
        found = getattr(ds, "_fingerprint", None)
        digest = f"datasets:{found}" if found else "sha256:" + hashlib.sha256(
            json.dumps(rows, sort_keys=True, default=str).encode()).hexdigest()
        # a ClassLabel column's values index its names: kept, so labels are matched by name
        names = {col: list(f.names) for col, f in ds.features.items()
                 if isinstance(f, datasets.ClassLabel)}
        out[split] = Rows(f"{origin} [{split}]", rows, list(ds.column_names),
                          list(range(1, ds.num_rows + 1)), digest=digest, names=names)
    return out
