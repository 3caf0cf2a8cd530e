"""Every data format loads the same examples; splits, fields and save_to_disk folders."""
import csv
import json
from pathlib import Path

import pytest

from workbench.data.fields import Pair, classify_examples, completion_examples, text_examples
from workbench.data.files import DataError
from workbench.data.sources import load_rows, load_split, read_tsv

# Texts with commas, quotes and non-ASCII, so quoting and encodings are exercised.
TRAIN = [("a fine, \"warm\" film", 1), ("dull; flat", 0), ("caf\u00e9 food was great", 1),
         ("it's 'ok' at best", 0), ("loved it", 1), ("never again", 0)]
DEV = [("a joy", 1), ("a chore", 0), ("so-so, really", 0)]


def _write(folder, split, fmt, examples, names=("sentence", "label")):
    path = folder / f"{split}.{fmt}"
    rows = [dict(zip(names, e)) for e in examples]
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "tsv":  # GLUE style: no quoting at all
        lines = ["\t".join(names)] + ["\t".join(map(str, e)) for e in examples]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    elif fmt == "csv":
        with open(path, "w", newline="", encoding="utf-8") as fh:
            csv.writer(fh).writerows([names, *examples])
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _pairs(examples):
    return [(e.text, e.label) for e in examples]


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "tsv", "parquet"])
def test_each_format_loads_the_same_examples(tmp_path, fmt):
    _write(tmp_path, "train", fmt, TRAIN)
    _write(tmp_path, "dev", fmt, DEV)
    train, dev = load_rows(str(tmp_path), None)
    assert _pairs(classify_examples(train, 2)) == TRAIN
    assert _pairs(classify_examples(dev, 2)) == DEV
    # the sentiment API the recipe uses reads the same folder
    assert _pairs(load_split(str(tmp_path), "dev", None)) == DEV


def test_validation_file_is_the_dev_split(tmp_path):
    _write(tmp_path, "train", "csv", TRAIN)
    _write(tmp_path, "validation", "jsonl", DEV)
    assert _pairs(load_split(str(tmp_path), "dev", None)) == DEV


def test_single_file_holds_out_every_tenth_example(tmp_path):
    examples = [(f"text {i}", i % 2) for i in range(25)]
    path = _write(tmp_path, "all", "jsonl", examples)
    train, dev = (classify_examples(r, 2) for r in load_rows(str(path), None))
    assert _pairs(dev) == [examples[9], examples[19]]
    assert _pairs(train) == [e for i, e in enumerate(examples) if i not in (9, 19)]


def test_save_to_disk_folders_load_the_same_examples(tmp_path):
    datasets = pytest.importorskip("datasets")
    cols = lambda ex: {"sentence": [e[0] for e in ex], "label": [e[1] for e in ex]}  # noqa: E731
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict(cols(TRAIN)),
                               "validation": datasets.Dataset.from_dict(cols(DEV))})
    dd.save_to_disk(str(tmp_path / "dict"))
    train, dev = load_rows(str(tmp_path / "dict"), None)
    assert _pairs(classify_examples(train, 2)) == TRAIN
    assert _pairs(classify_examples(dev, 2)) == DEV
    one = datasets.Dataset.from_dict(cols(TRAIN * 2))  # no splits: every tenth row is dev
    one.save_to_disk(str(tmp_path / "one"))
    train, dev = load_rows(str(tmp_path / "one"), None)
    assert len(train.rows) == 11 and _pairs(classify_examples(dev, 2)) == [TRAIN[3]]


def test_fields_are_found_by_name_or_set(tmp_path):
    path = _write(tmp_path, "train", "jsonl", [("q1", "a1", 0), ("q2", "a2", 1)] * 3,
                  names=("question", "answer", "id"))
    train, _ = load_rows(str(path), None)
    assert completion_examples(train)[0] == Pair("q1", "a1")
    assert completion_examples(train, "answer", "question")[0] == Pair("a1", "q1")
    assert text_examples(train, "answer")[:2] == ["a1", "a2"]
    with pytest.raises(DataError, match=r"no text field among question, answer, id .*set "
                                        r"text_field=NAME"):
        text_examples(train)
    with pytest.raises(DataError, match=r"no field 'body' \(set by text_field\)"):
        text_examples(train, "body")


def test_embedded_sets_of_each_objective():
    train, dev = load_rows("embedded", None, "completion")
    pairs = completion_examples(train)
    assert len(pairs) >= 200 and all(p.completion.startswith(" ") for p in pairs)
    assert not {p.prompt for p in pairs} & {p.prompt for p in completion_examples(dev)}
    train, dev = load_rows("embedded", None, "lm")
    texts = text_examples(train) + text_examples(dev)
    assert len(texts) >= 40 and len(set(texts)) == len(texts)
    assert len(read_tsv(load_rows.__globals__["EMBEDDED_DIR"] / "dev.tsv")) == 80


def test_sst2_from_the_shared_folder_matches_glue_counts(data_dir):
    train, dev = load_rows("sst2", data_dir)
    assert (len(train.rows), len(dev.rows)) == (67349, 872)


def test_files_and_the_recipe_need_neither_datasets_nor_pyarrow(tmp_path):
    """The engine layer imports them lazily: only hf:, save_to_disk and parquet need them."""
    import subprocess
    import sys

    _write(tmp_path, "train", "jsonl", TRAIN)
    code = ("import sys; sys.modules['datasets'] = None; sys.modules['pyarrow'] = None\n"
            "import workbench.recipes.train, workbench.data.task\n"
            "from workbench.data.sources import load_rows\n"
            "from workbench.data.files import DataError\n"
            f"print(len(load_rows({str(tmp_path)!r}, None)[0].rows))\n"
            "try:\n    load_rows('hf:x/y', None)\nexcept DataError as e:\n    print(e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["5", "data: this data source needs the `datasets` package; "
                                          "install zo-workbench[data]"]
