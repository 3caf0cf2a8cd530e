"""A bad data file is refused in one line that names the file, the line (or row) and the field."""
import json
import re

import pytest

from workbench.data.fields import classify_examples, completion_examples
from workbench.data.files import DataError, read_file
from workbench.data.sources import load_rows, load_split


def _refusal(call) -> str:
    with pytest.raises(DataError) as e:
        call()
    (line,) = e.value.problems
    assert "\n" not in line and line.startswith("data: ")
    return line


def _classify(path, k=2):
    return lambda: classify_examples(read_file(path), k)


TSV_CASES = {  # name -> (file text, what the line must say)
    "wrong columns": ("id\tscore\ngood\t1\n", r"no text field among id, score .*set text_field=NAME"),
    "non-integer label": ("sentence\tlabel\ngood\t1\nbad\tzero\n",
                          r"line 3: field 'label' is 'zero', not a whole number"),
    "out-of-range label": ("sentence\tlabel\ngood\t1\nbad\t2\n",
                           r"line 3: field 'label' is 2, outside 0..1 \(label_words has 2 words\)"),
    "header only": ("sentence\tlabel\n", r"a header \(sentence, label\) but no examples"),
    "missing field": ("sentence\tlabel\ngood\t1\nbad\n", r"line 3: 1 fields, the header has 2"),
    "empty header name": ("sentence\t\ngood\t1\n", r"line 1: the header .* distinct, non-empty"),
    "blank lines only": ("\n\n", r"the file is empty"),
}


@pytest.mark.parametrize("case", TSV_CASES)
def test_bad_tsv(tmp_path, case):
    text, expected = TSV_CASES[case]
    path = tmp_path / "train.tsv"
    path.write_text(text)
    line = _refusal(_classify(path))
    assert line.startswith(f"data: {path}") and re.search(expected, line), line


def test_empty_and_binary_files(tmp_path):
    empty = tmp_path / "train.csv"
    empty.write_bytes(b"")
    assert _refusal(_classify(empty)) == f"data: {empty}: the file is empty"
    binary = tmp_path / "train.jsonl"
    binary.write_bytes(b'{"text": "ok", "label": 1}\n\x89PNG\r\n\x1a\n\xff\xfe\x00\x00')
    assert _refusal(_classify(binary)) == f"data: {binary} line 2: not UTF-8 text (a binary file?)"
    nul = tmp_path / "dev.tsv"
    nul.write_bytes(b"sentence\tlabel\nok\t1\n\x00\x01\x02\n")
    assert _refusal(_classify(nul)) == f"data: {nul} line 3: a NUL byte (a binary file?)"
    parquet = tmp_path / "train.parquet"
    parquet.write_bytes(b"PAR1 not really")
    assert "not a readable parquet file" in _refusal(_classify(parquet))


def test_bad_jsonl_rows(tmp_path):
    path = tmp_path / "train.jsonl"
    rows = [{"prompt": "p", "completion": "c"}, {"prompt": "p2"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert _refusal(lambda: completion_examples(read_file(path))) == \
        f"data: {path} line 2: field 'completion' is missing"
    path.write_text('{"text": "a", "label": 1}\n\n{"text": 5, "label": 0}\n')
    assert _refusal(_classify(path)) == f"data: {path} line 3: field 'text' is 5, not text"
    path.write_text('{"text": "a", "label": true}\n')
    assert "line 1: field 'label' is True, not a whole number" in _refusal(_classify(path))
    path.write_text('{"text": "a", "label": 1}\n{"text": "b", "label": 1\n')
    assert f"{path} line 2: not JSON" in _refusal(_classify(path))
    path.write_text('["a", 1]\n')
    assert "line 1: expected a JSON object, got list" in _refusal(_classify(path))


def test_k_way_labels_and_a_huge_field(tmp_path):
    path = tmp_path / "train.csv"
    path.write_text("text,label\nx,0\ny,2\nz,3\n")
    assert len(classify_examples(read_file(path), 4)) == 3
    assert "line 4: field 'label' is 3, outside 0..2 (label_words has 3 words)" in \
        _refusal(_classify(path, 3))
    path.write_text("text,label\n" + "w" * (2 << 20) + ",1\n")
    assert f"{path} line 2: longer than 1 MiB (the limit of a line and of a field)" in \
        _refusal(_classify(path))
    path.write_text('text,label\n"' + "w\n" * (1 << 19) + 'w",1\n')  # a field over many lines
    assert f"{path} line " in _refusal(_classify(path)) and "field larger than field limit" in \
        _refusal(_classify(path))


def test_a_huge_jsonl_line_is_refused_without_reading_it_whole(tmp_path):
    import tracemalloc

    path = tmp_path / "train.jsonl"
    with open(path, "w") as fh:
        fh.write('{"text": "ok", "label": 1}\n{"text": "' + "a" * (48 << 20) + '", "label": 0}\n')
    tracemalloc.start()
    try:
        line = _refusal(lambda: read_file(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert line == f"data: {path} line 2: longer than 1 MiB (the limit of a line and of a field)"
    assert peak < 8 << 20, f"{peak / 2**20:.0f} MiB held for a 48 MiB line"


@pytest.mark.parametrize("suffix, text", [
    (".jsonl", '{"text": "good", "label": 1}\n{"text": "bad", "label": 0}\n'),
    (".csv", "text,label\ngood,1\nbad,0\n"), (".tsv", "text\tlabel\ngood\t1\nbad\t0\n")])
def test_a_utf8_byte_order_mark_is_dropped(tmp_path, suffix, text):
    path = tmp_path / f"train{suffix}"
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    rows = read_file(path)
    assert rows.columns == ["text", "label"]
    assert [(e.text, e.label) for e in classify_examples(rows, 2)] == [("good", 1), ("bad", 0)]
    assert rows.digest.startswith("sha256:") and rows.digest != read_file(
        _plain_copy(path, tmp_path, text)).digest  # the digest is of the bytes as they are


def _plain_copy(path, tmp_path, text):
    (tmp_path / "plain").mkdir()
    copy = tmp_path / "plain" / path.name
    copy.write_text(text)
    return copy


@pytest.mark.parametrize("objective, rows, said", [
    ("completion", [{"prompt": "a", "completion": ""}, {"prompt": "b", "completion": "  "}],
     "field 'completion' is blank in all 2 examples (lines 1-2): nothing to learn"),
    ("lm", [{"text": ""}, {"text": "\n"}, {"text": " "}],
     "field 'text' is blank in all 3 examples (lines 1-3): the model would learn end-of-text"),
    ("classify", [{"text": "", "label": 0}, {"text": " ", "label": 1}],
     "field 'text' is blank in all 2 examples (lines 1-2)")])
def test_a_split_with_nothing_in_it_is_refused(tmp_path, objective, rows, said):
    from workbench.data.fields import text_examples

    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    call = {"completion": lambda: completion_examples(read_file(path)),
            "lm": lambda: text_examples(read_file(path)),
            "classify": _classify(path)}[objective]
    line = _refusal(call)
    assert line.startswith(f"data: {path}: {said}"), line
    rows[0] = {**rows[0], ("completion" if objective == "completion" else "text"): "x"}
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    call()  # one example with something in it: fine


def test_two_names_of_the_dev_split_are_refused(tmp_path):
    for name in ("train", "dev", "validation"):
        (tmp_path / f"{name}.jsonl").write_text('{"text": "a", "label": 1}\n')
    assert "several dev splits (dev.jsonl, validation.jsonl); keep one" in \
        _refusal(lambda: load_rows(str(tmp_path), None))
    (tmp_path / "dev.jsonl").rename(tmp_path / "test.jsonl")  # validation, and test: fine
    train, dev = load_rows(str(tmp_path), None)
    assert dev.origin.endswith("validation.jsonl")


def test_sst2_without_its_folder_names_data_dir(tmp_path):
    from workbench.config import ConfigError

    for where, why in ((tmp_path / "nowhere", "does not exist"), (tmp_path, "has no sst2/")):
        with pytest.raises(ConfigError) as err:
            load_rows("sst2", where)
        (line,) = err.value.problems
        assert line.startswith(f"data_dir: {where} {why}") and "hf:nyu-mll/glue:sst2" in line


def test_folder_problems(tmp_path):
    assert "no train file" in _refusal(lambda: load_rows(str(tmp_path), None))
    (tmp_path / "train.csv").write_text("text,label\na,1\n")
    (tmp_path / "train.jsonl").write_text('{"text": "a", "label": 1}\n')
    assert "several train files (train.csv, train.jsonl)" in \
        _refusal(lambda: load_rows(str(tmp_path), None))
    (tmp_path / "train.jsonl").unlink()
    assert "1 example(s); a source without a dev split needs at least 2" in \
        _refusal(lambda: load_split(str(tmp_path), "train", None))


def test_line_numbers_count_physical_lines(tmp_path):
    path = tmp_path / "train.csv"
    path.write_text('text,label\n"two\nlines",1\n\nthird\u2028still third,0\nbad,x\n')
    line = _refusal(_classify(path))
    assert line == f"data: {path} line 6: field 'label' is 'x', not a whole number"
    path.write_text('text,label\n"two\nlines",1\nthird\u2028still third,0\n')
    assert [e.text for e in classify_examples(read_file(path), 2)] == \
        ["two\nlines", "third\u2028still third"]
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text('{"text": "a\u2028b", "label": 0}\n{"text": "c", "label": 5}\n')
    assert _refusal(_classify(jsonl)).endswith("line 2: field 'label' is 5, outside 0..1 "
                                               "(label_words has 2 words)")
