"""Rows from one data file (.jsonl, .csv, .tsv, .parquet), with one-line errors naming the place.

A reader returns ``Rows``: plain dicts, one per example, and where each came from (file and line),
so that every later complaint (a missing field, a label that is not a number) can name the file,
the line and the field. A file that cannot be read at all (empty, binary, header only, broken
JSON, a line or field over 1 MiB) is refused here, in one line; a UTF-8 byte order mark is
dropped. Text files are read a line at a time and hashed as they are read (``Rows.digest``).
"""
from __future__ import annotations

import csv
import hashlib
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from workbench.config import DATA_SUFFIXES as SUFFIXES
from workbench.config import ConfigError

FIELD_LIMIT = 1 << 20  # characters in one CSV/TSV field; beyond it the file is refused
LINE_LIMIT = 1 << 20  # bytes in one line of a text file (a JSONL record); beyond it: refused
BOM = b"\xef\xbb\xbf"  # a UTF-8 byte order mark, which some editors write first


class DataError(ConfigError):
    """A data source that cannot be used; the message is one line starting with ``data:``."""

    def __init__(self, message: str):
        super().__init__([message if message.startswith("data:") else f"data: {message}"])


@dataclass
class Rows:
    """Examples as dicts of field -> value, and where they came from.

    ``origin`` names the source (a path, or ``hf:NAME train``); ``numbers[i]`` is the line of
    ``rows[i]`` in a text file (header counted) or its row in a table (1-based); ``unit`` says
    which. ``digest`` fingerprints the content (a file's SHA-256, a ``datasets`` fingerprint).
    ``names``: column -> its class names, for a ``datasets`` ClassLabel column (whose values
    index them).
    """

    origin: str
    rows: list[dict[str, Any]]
    columns: list[str]
    numbers: list[int]
    unit: str = "row"
    digest: str = ""
    names: dict[str, list[str]] = field(default_factory=dict)

    def where(self, i: int) -> str:
        """Where row ``i`` is, e.g. ``'train.tsv line 7'``."""
        return f"{self.origin} {self.unit} {self.numbers[i]}"

    def subset(self, keep: list[int]) -> "Rows":
        """The rows at ``keep``, still reported at their places in the source."""
        return Rows(self.origin, [self.rows[i] for i in keep], self.columns,
                    [self.numbers[i] for i in keep], self.unit, self.digest, self.names)


def read_file(path: Path) -> Rows:
    """All rows of a data file, by its suffix, and the SHA-256 of its bytes (``Rows.digest``)."""
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise DataError(f"{path}: not a {'/'.join(SUFFIXES)} file")
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    if path.stat().st_size == 0:
        raise DataError(f"{path}: the file is empty")
    if suffix == ".parquet":
        rows = _parquet(path)
        rows.digest = file_digest(path)
        return rows
    h = hashlib.sha256()
    lines = _lines(path, h)  # parsed as they are read: the file's text is never held whole
    rows = _jsonl(path, lines) if suffix == ".jsonl" else \
        _delimited(path, lines, "\t" if suffix == ".tsv" else ",")
    rows.digest = f"sha256:{h.hexdigest()}"
    return rows


def file_digest(path: Path) -> str:
    """``sha256:<hex>`` of a file's bytes, read in 16 MiB pieces."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 24), b""):
            h.update(chunk)
    return f"sha256:{h.hexdigest()}"


def _lines(path: Path, h: Any) -> Iterator[str]:
    """The decoded lines of a text file (each with its newline), its bytes fed to ``h`` as
    they are read.

    Read a line at a time, never more than ``LINE_LIMIT`` bytes of one: a 200 MB line is refused
    after its first MiB, not read whole. A UTF-8 byte order mark at the start is dropped.
    """
    with open(path, "rb") as fh:
        for n in itertools.count(1):
            raw = fh.readline(LINE_LIMIT + 1)
            if not raw:
                break
            h.update(raw)
            if len(raw) > LINE_LIMIT and not raw.endswith(b"\n"):
                raise DataError(f"{path} line {n}: longer than {LINE_LIMIT >> 20} MiB (the limit "
                                "of a line and of a field)")
            if n == 1 and raw.startswith(BOM):
                raw = raw[len(BOM):]
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise DataError(f"{path} line {n}: not UTF-8 text (a binary file?)") from None
            if "\x00" in line:
                raise DataError(f"{path} line {n}: a NUL byte (a binary file?)")
            yield line


def _jsonl(path: Path, lines: Iterable[str]) -> Rows:
    rows, columns, numbers = [], {}, []
    for n, line in enumerate(lines, start=1):  # split at \n only: JSON strings may hold U+2028
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path} line {n}: not JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise DataError(f"{path} line {n}: expected a JSON object, got {type(row).__name__}")
        if "\\u" in line and (where := _surrogate(row)):  # only a \uXXXX escape makes one
            raise DataError(f"{path} line {n}: {where} holds a lone UTF-16 surrogate (a \\ud800-"
                            "\\udfff escape without its pair), which is not text: write the "
                            "character whole or drop it")
        rows.append(row)
        numbers.append(n)
        columns.update(dict.fromkeys(row))
    if not rows:
        raise DataError(f"{path}: no examples (only blank lines)")
    return Rows(str(path), rows, list(columns), numbers, "line")


def _surrogate(value: Any, where: str = "") -> str:
    """Where in a decoded JSON value a lone surrogate sits (``'field "text"'``), or ''.
    Such a string cannot be encoded as UTF-8, so the tokenizer would fail on it mid-run."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return where or "a value"
    elif isinstance(value, dict):
        for k, v in value.items():
            if found := _surrogate(k, "a field name") or _surrogate(v, where or f"field {k!r}"):
                return found
    elif isinstance(value, list):
        for v in value:
            if found := _surrogate(v, where or "a list"):
                return found
    return ""


def _delimited(path: Path, lines: Iterable[str], delimiter: str) -> Rows:
    """CSV with standard quoting; TSV as GLUE writes it (no quoting: sentences hold quotes)."""
    quoting = csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL
    old = csv.field_size_limit(FIELD_LIMIT)
    reader = csv.reader(lines, delimiter=delimiter, quoting=quoting, strict=True)
    table: list[tuple[int, list[str]]] = []  # (line where the record ends, fields)
    try:
        for row in reader:
            if any(c.strip() for c in row):  # blank lines carry no example
                table.append((reader.line_num, row))
    except csv.Error as e:
        raise DataError(f"{path} line {reader.line_num}: {e}") from None
    finally:
        csv.field_size_limit(old)
    if not table:
        raise DataError(f"{path}: the file is empty")
    header = [c.strip() for c in table[0][1]]
    if len(set(header)) < len(header) or not all(header):
        raise DataError(f"{path} line {table[0][0]}: the header {table[0][1]!r} needs distinct, "
                        "non-empty column names")
    if len(table) == 1:
        raise DataError(f"{path}: a header ({', '.join(header)}) but no examples")
    for n, row in table[1:]:
        if len(row) != len(header):
            raise DataError(f"{path} line {n}: {len(row)} fields, the header has {len(header)} "
                            f"({', '.join(header)})")
    return Rows(str(path), [dict(zip(header, row)) for _, row in table[1:]], header,
                [n for n, _ in table[1:]], "line")


def _parquet(path: Path) -> Rows:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{path}: reading parquet needs pyarrow; install "
                        "zo-workbench[data]") from None
    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises several types for a broken file
        raise DataError(f"{path}: not a readable parquet file ({type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''})") from None
    if table.num_rows == 0:
        raise DataError(f"{path}: columns ({', '.join(table.column_names)}) but no examples")
    return Rows(str(path), table.to_pylist(), list(table.column_names),
                list(range(1, table.num_rows + 1)))
