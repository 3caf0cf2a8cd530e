"""Which label word each class of a classify data set is scored with: by name where labels have one.

Labels come in three forms:
- whole numbers (``0``, ``1``, or ``"0"`` in a text file): label i is ``label_words``' word i, as
  MeZO's SST-2 files are written;
- a ``datasets`` ClassLabel column: the numbers index the column's names (``[positive,
  negative]`` makes 0 *positive*), so its classes are matched by those names, never by position;
- text (``"positive"`` in a JSONL / CSV file): matched by the text itself.
A name matches a word when both, stripped and case-folded, are equal, or when the word is one
the name is known by (``KNOWN``: MeZO's sentiment words ``terrible`` / ``great`` stand for
*negative* / *positive*, so SST-2 from the Hub scores as MeZO's files do). A name no word matches,
a name two words match, and two names one word matches are refused in one line that says what to
set: a silent guess would score every example against the wrong word.
"""
from __future__ import annotations

from workbench.data.files import DataError, Rows

#: class name -> the words that stand for it besides the name itself
KNOWN = {"negative": ("terrible", "bad"), "positive": ("great", "good")}


def _key(text: str) -> str:
    return text.strip().casefold()


def _whole(value) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)) or (
        isinstance(value, str) and value.strip().lstrip("-").isdigit())


def class_names(rows: Rows, field: str) -> list[str] | None:
    """The class names ``field`` uses in ``rows``, in order of first appearance (a ClassLabel's
    names in its own order), or None for whole-number labels (and for a ClassLabel whose names
    are its numbers, as ``ClassLabel(num_classes=k)`` writes them)."""
    names = rows.names.get(field)
    if names is not None:
        return None if all(n == str(i) for i, n in enumerate(names)) else list(names)
    found: dict[str, None] = {}
    for row in rows.rows:
        value = row.get(field)
        if isinstance(value, str) and not _whole(value):
            found.setdefault(value)
    return list(found) or None


def label_map(splits: list[Rows], field: str, words: list[str]) -> dict[str, int] | None:
    """Class name -> index into ``words`` for the named classes of every split (None: the labels
    are whole numbers, label i is word i).

    Raises:
        DataError: a name no word matches, a name several words match, or two names one word
            matches; the line names the origin, the field, the names and the words.
    """
    names: dict[str, str] = {}  # name -> the split it was first seen in
    for rows in splits:
        for name in class_names(rows, field) or ():
            names.setdefault(name, rows.origin)
    if not names:
        return None
    said = ", ".join(repr(w) for w in words)
    out: dict[str, int] = {}
    for name, origin in names.items():
        key = _key(name)
        match = [i for i, w in enumerate(words)
                 if _key(w) == key or _key(w) in KNOWN.get(key, ())]
        if len(match) != 1:
            why = ("no word of label_words is named so" if not match else
                   f"label_words {' and '.join(repr(words[i]) for i in match)} could both be it")
            raise DataError(f"{origin}: field {field!r} names the label {name!r} and {why} "
                            f"(label_words: {said}); labels are scored by their names: set "
                            f"label_words to one word per name, e.g. label_words="
                            f"{','.join(' ' + n.strip() for n in names)}")
        out[name] = match[0]
    taken: dict[int, str] = {}
    for name, i in out.items():
        if i in taken:
            raise DataError(f"{names[name]}: field {field!r} names the labels {taken[i]!r} and "
                            f"{name!r}, and both match label_words {words[i]!r}; give each its "
                            f"own word (label_words="
                            f"{','.join(' ' + n.strip() for n in names)})")
        taken[i] = name
    return out


def name_of(rows: Rows, i: int, field: str, value) -> str | None:
    """Row ``i``'s class name (a ClassLabel's name for its number; text as written), or None
    for a whole-number label of an unnamed column."""
    names = rows.names.get(field)
    if names is not None and class_names(rows, field) is not None:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < len(names):
            raise DataError(f"{rows.where(i)}: field {field!r} is {value!r}, not one of the "
                            f"ClassLabel's {len(names)} classes")
        return names[value]
    return None if _whole(value) else value


def mapping_record(mapping: dict[str, int] | None, words: list[str]) -> dict[str, str]:
    """What run.json keeps: each label (a class name, or a number) -> the word it is scored by."""
    if mapping is None:
        return {str(i): w for i, w in enumerate(words)}
    return {name: words[i] for name, i in mapping.items()}
