"""Labelled sentiment examples: the embedded set, SST-2 from a folder, or GLUE SST-2 online."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from workbench.config import REPO_ROOT, ConfigError, RunConfig

EMBEDDED_DIR = REPO_ROOT / "assets" / "sentiment"
MAX_LINE = 100_000  # characters: a longer "sentence" is a broken file, not an example


@dataclass(frozen=True)
class Example:
    sentence: str
    label: int  # 1 = positive


def read_tsv(path: Path) -> list[Example]:
    """GLUE-style ``sentence<TAB>label`` with a header (sentences may contain quotes).

    Raises:
        ConfigError: one line naming the file, the first bad line and what is wrong there
            (not UTF-8, binary, a missing or extra field, a label other than 0 / 1, no
            examples), with the count of further bad lines.
    """
    bad: list[str] = []
    examples: list[Example] = []
    header: list[str] | None = None
    try:
        with open(path, encoding="utf-8", newline="") as fh:
            for n, line in enumerate(fh, 1):
                line = line.rstrip("\r\n")
                if "\x00" in line:
                    raise ConfigError([f"data: {path} line {n} holds NUL bytes: not a text file"])
                if len(line) > MAX_LINE:
                    bad.append(f"line {n} is {len(line):,} characters long (at most {MAX_LINE:,})")
                    continue
                fields = line.split("\t")
                if header is None:
                    header = fields
                    if "sentence" not in header or "label" not in header:
                        raise ConfigError([f"data: {path} line 1: the header must name the "
                                           f"columns sentence and label, tab-separated (found: "
                                           f"{line[:80]!r})"])
                    s, y = header.index("sentence"), header.index("label")
                    continue
                if not line.strip():
                    continue  # blank lines (a trailing newline) hold no example
                if len(fields) != len(header):
                    bad.append(f"line {n} has {len(fields)} tab-separated field(s), the header "
                               f"{len(header)}")
                elif fields[y].strip() not in ("0", "1"):
                    bad.append(f"line {n}: label {fields[y][:20]!r} is not 0 or 1")
                else:
                    examples.append(Example(fields[s], int(fields[y])))
    except UnicodeDecodeError as e:
        raise ConfigError([f"data: {path} is not UTF-8 text (byte {e.start}): not a "
                           "sentence<TAB>label file"]) from None
    except IsADirectoryError:
        raise ConfigError([f"data: {path} is a folder, not a file"]) from None
    if bad:
        more = f" (and {len(bad) - 1} more bad lines)" if len(bad) > 1 else ""
        raise ConfigError([f"data: {path} {bad[0]}{more}"])
    if header is None:
        raise ConfigError([f"data: {path} is empty: expected a header 'sentence<TAB>label' and "
                           "examples"])
    if not examples:
        raise ConfigError([f"data: {path} has a header but no examples"])
    return examples


def load_examples(cfg: RunConfig) -> tuple[list[Example], list[Example] | None]:
    """(train, dev) examples of ``cfg.data``, ``train_samples`` / ``eval_samples`` of them; dev
    is None for a folder without dev.tsv. Read and checked before any model is built.

    Raises:
        ConfigError: a malformed file (``read_tsv``).
    """
    data, where = cfg.data, cfg.resolved_data_dir
    train = load_split(data, "train", where)
    has_dev = data in ("embedded", "sst2") or (Path(data).expanduser() / "dev.tsv").is_file()
    dev = load_split(data, "dev", where) if has_dev else None
    if cfg.train_samples:
        train = train[:cfg.train_samples]
    if cfg.eval_samples and dev is not None:
        dev = dev[:cfg.eval_samples]
    return train, dev


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
