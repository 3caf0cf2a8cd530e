"""Labelled sentiment examples: the embedded set, SST-2 from a folder, or GLUE SST-2 online."""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from workbench.config import REPO_ROOT

EMBEDDED_DIR = REPO_ROOT / "assets" / "sentiment"


@dataclass(frozen=True)
class Example:
    sentence: str
    label: int  # 1 = positive


def read_tsv(path: Path) -> list[Example]:
    """GLUE-style ``sentence<TAB>label`` with a header (sentences may contain quotes)."""
    with open(path, newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))
    header, body = rows[0], rows[1:]
    s, y = header.index("sentence"), header.index("label")
    return [Example(r[s], int(r[y])) for r in body if len(r) > max(s, y)]


def load_split(data: str, split: str, data_dir: Path) -> list[Example]:
    """Examples of ``split`` ("train" or "dev") from ``data``.

    ``embedded``: the small set in ``assets/`` (always there). ``sst2``: ``data_dir/sst2``, else
    GLUE SST-2 through ``datasets`` when online. A folder: its ``train.tsv`` / ``dev.tsv``.
    """
    if data == "embedded":
        return read_tsv(EMBEDDED_DIR / f"{split}.tsv")
    if data == "sst2":
        local = data_dir / "sst2" / f"{split}.tsv"
        if local.is_file():
            return read_tsv(local)
        return _glue_sst2(split)
    return read_tsv(Path(data).expanduser() / f"{split}.tsv")


def _glue_sst2(split: str) -> list[Example]:
    try:
        from datasets import load_dataset
    except ImportError:
        raise FileNotFoundError("data: sst2 is not in data_dir and the `datasets` package is "
                                "missing; set data_dir or install zo-workbench[data]") from None
    ds = load_dataset("glue", "sst2", split="validation" if split == "dev" else "train")
    return [Example(r["sentence"], int(r["label"])) for r in ds]
