"""Rows from one data file (.jsonl, .csv, .tsv, .parquet), with one-line errors naming the place.

A reader returns ``Rows``: plain dicts, one per example, and where each came from (file and line),
so that every later complaint (a missing field, a label that is not a number) can name the file,
the line and the field. A file that cannot be read at all (empty, binary, header only, broken
JSON, a field over the size limit) is refused here, in one line.
"""
from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.config import DATA_SUFFIXES as SUFFIXES
from workbench.config import ConfigError

FIELD_LIMIT = 1 << 20  # characters in one CSV/TSV field; beyond it the file is refused


class DataError(ConfigError):
    """A data source that cannot be used; the message is one line starting with ``data:``."""

    def __init__(self, message: str):
        super().__init__([message if message.startswith("data:") else f"data: {message}"])


@dataclass
class Rows:
    """Examples as dicts of field -> value, and where they came from.

    ``origin`` names the source (a path, or ``hf:NAME train``); ``numbers[i]`` is the line of
    ``rows[i]`` in a text file (header counted) or its row in a table (1-based); ``unit`` says
    which.
    """

    origin: str
    rows: list[dict[str, Any]]
    columns: list[str]
    numbers: list[int]
    unit: str = "row"

    def where(self, i: int) -> str:
        """Where row ``i`` is, e.g. ``'train.tsv line 7'``."""
        return f"{self.origin} {self.unit} {self.numbers[i]}"

    def subset(self, keep: list[int]) -> "Rows":
        """The rows at ``keep``, still reported at their places in the source."""
        return Rows(self.origin, [self.rows[i] for i in keep], self.columns,
                    [self.numbers[i] for i in keep], self.unit)


def read_file(path: Path) -> Rows:
    """All rows of a data file, by its suffix."""
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise DataError(f"{path}: not a {'/'.join(SUFFIXES)} file")
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    if path.stat().st_size == 0:
        raise DataError(f"{path}: the file is empty")
    if suffix == ".parquet":
        return _parquet(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        line = path.read_bytes()[:e.start].count(b"\n") + 1
        raise DataError(f"{path} line {line}: not UTF-8 text (a binary file?)") from None
    if "\x00" in text:
        line = text[:text.index("\x00")].count("\n") + 1
        raise DataError(f"{path} line {line}: a NUL byte (a binary file?)")
    if suffix == ".jsonl":
        return _jsonl(path, text)
    return _delimited(path, text, "\t" if suffix == ".tsv" else ",")


def _jsonl(path: Path, text: str) -> Rows:
    rows, columns, numbers = [], {}, []
    for n, line in enumerate(text.split("\n"), start=1):  # JSON strings may hold U+2028 etc.
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path} line {n}: not JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise DataError(f"{path} line {n}: expected a JSON object, got {type(row).__name__}")
        rows.append(row)
        numbers.append(n)
        columns.update(dict.fromkeys(row))
    if not rows:
        raise DataError(f"{path}: no examples (only blank lines)")
    return Rows(str(path), rows, list(columns), numbers, "line")


def _delimited(path: Path, text: str, delimiter: str) -> Rows:
    """CSV with standard quoting; TSV as GLUE writes it (no quoting: sentences hold quotes)."""
    quoting = csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL
    old = csv.field_size_limit(FIELD_LIMIT)
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, quoting=quoting,
                        strict=True)
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
