"""Labels are scored by their names: a ``datasets`` ClassLabel folder whose names run [positive,
negative], and a file of text labels, score exactly as the same texts with MeZO's 0 / 1 labels;
names no label word matches are refused in one line; run.json and the summary keep the split
sizes and which word each label is scored by. Through the CLI, as a user meets it."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

datasets = pytest.importorskip("datasets")

REPO = Path(__file__).resolve().parents[2]
POS = ["a joy to watch", "loved every minute", "warm and funny", "a fine film", "great fun"]
NEG = ["dull and flat", "never again", "a chore", "cold, bland soup", "it drags"]
# (text, is_positive), interleaved so that every batch and the dev split hold both
TRAIN = [(t, y) for pair in zip(POS * 2, NEG * 2) for t, y in zip(pair, (1, 0))]
DEV = [(t, y) for pair in zip(POS, NEG) for t, y in zip(pair, (1, 0))]


def _cli(data: Path, *sets: str, out: Path | None = None) -> subprocess.CompletedProcess:
    args = ["data=" + str(data), "method=mezo", "steps=1", "batch_size=4", "seq_len=32",
            "sample_hz=0", "telemetry=false", "save_final=false", *sets]
    return subprocess.run([sys.executable, "-m", "workbench", "run", "--quiet",
                           *(["--out", str(out)] if out else []),
                           *(a for s in args for a in ("--set", s))],
                          cwd=REPO, capture_output=True, text=True, timeout=600)


def _jsonl(folder: Path, label) -> Path:
    folder.mkdir()
    for split, rows in (("train", TRAIN), ("dev", DEV)):
        (folder / f"{split}.jsonl").write_text("".join(
            json.dumps({"sentence": t, "label": label(y)}) + "\n" for t, y in rows))
    return folder


def _class_label(folder: Path, names: list[str], positive: str) -> Path:
    """A save_to_disk folder whose label column is a ClassLabel of ``names``."""
    features = datasets.Features({"sentence": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=names)})
    index = {True: names.index(positive), False: 1 - names.index(positive)}
    dd = datasets.DatasetDict({
        split: datasets.Dataset.from_dict({"sentence": [t for t, _ in rows],
                                           "label": [index[bool(y)] for _, y in rows]},
                                          features=features)
        for split, rows in (("train", TRAIN), ("validation", DEV))})
    dd.save_to_disk(str(folder))
    return folder


def test_class_label_names_and_text_labels_score_as_numbered_labels(tmp_path):
    """The model is the same (seed), so the three spellings of the same truths must give the
    same dev loss and accuracy before training and the same step-0 losses: the old code scored
    the ClassLabel folder's label 0 (*positive*) with " terrible", and refused text labels."""
    runs = {"numbers": _jsonl(tmp_path / "numbers", int),
            "class_label": _class_label(tmp_path / "class_label", ["positive", "negative"],
                                        "positive"),
            "text": _jsonl(tmp_path / "text", lambda y: "positive" if y else "negative")}
    got = {}
    for name, data in runs.items():
        r = _cli(data, out=tmp_path / f"run-{name}")
        assert r.returncode == 0, (name, r.stderr[-3000:])
        rec = json.loads((tmp_path / f"run-{name}" / "run.json").read_text())
        got[name] = rec
        assert rec["info"]["examples"] == {"train": len(TRAIN), "dev": len(DEV)}
        assert "examples (train / dev)" in r.stdout and f"{len(TRAIN)} / {len(DEV)}" in r.stdout
    assert got["numbers"]["info"]["labels"] == {"0": " terrible", "1": " great"}
    for name in ("class_label", "text"):
        assert got[name]["info"]["labels"] == {"positive": " great", "negative": " terrible"}
        for key in ("loss", "accuracy"):
            assert got[name]["evals"][0][key] == got["numbers"]["evals"][0][key], (name, key)
        for key in ("loss_plus", "loss_minus"):
            assert got[name]["steps"][0][key] == got["numbers"]["steps"][0][key], (name, key)


def test_names_no_label_word_matches_are_refused_in_one_line(tmp_path):
    data = _class_label(tmp_path / "yes_no", ["yes", "no"], "yes")
    r = _cli(data, out=tmp_path / "refused")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "field 'label' names the label 'yes'" in r.stderr
    assert "label_words= yes, no" in r.stderr
    assert not (tmp_path / "refused" / "run.json").exists()  # refused before the run starts
    r = _cli(data, "label_words= no, yes", out=tmp_path / "run")  # words by name, any order
    assert r.returncode == 0, r.stderr[-3000:]
    rec = json.loads((tmp_path / "run" / "run.json").read_text())
    assert rec["info"]["labels"] == {"yes": " yes", "no": " no"}
    assert "label words" in r.stdout and "yes ' yes', no ' no'" in r.stdout
    r = subprocess.run([sys.executable, "-m", "workbench", "report", str(tmp_path / "run"),
                        "--out", str(tmp_path / "report.html")], cwd=REPO, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    page = (tmp_path / "report.html").read_text()
    assert "examples (train / dev)" in page and f"{len(TRAIN)} / {len(DEV)}" in page
    assert "yes &#x27; yes&#x27;, no &#x27; no&#x27;" in page
