"""``compare`` names runs whose settings have words in common with their folders without
garbling them, and keeps long labels short."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_compare_labels_keep_settings_whole(tmp_path):
    run = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "workbench", "run", "--quiet", "--out", str(run),
                        "--set", "data=synthetic", "--set", "steps=2", "--set", "batch_size=2",
                        "--set", "seq_len=16"], cwd=REPO, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    long = "Classify the following customer review into one of the categories. Review: {text}"
    dirs = []
    for name, template, words in (("category-b-task", "{text} Category B", " A, B"),
                                  ("other", "{text} Category C", " C, D"),
                                  ("long-one", f"{long} Category A", " alpha, beta, gamma"),
                                  ("long-two", f"{long} Category B", " alpha, beta, delta")):
        d = tmp_path / name
        shutil.copytree(run, d)
        rec = json.loads((d / "run.json").read_text())
        rec["config"].update(template=template, label_words=words)
        (d / "run.json").write_text(json.dumps(rec))
        dirs.append(str(d))
    r = subprocess.run([sys.executable, "-m", "workbench", "compare", *dirs[:2]], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    head = r.stdout.splitlines()[0]
    assert "category-b-task: mezo template='{text} Category B' label_words=' A, B'" in head
    assert "other: mezo template='{text} Category C' label_words=' C, D'" in head
    r = subprocess.run([sys.executable, "-m", "workbench", "compare", *dirs[2:]], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    head = r.stdout.splitlines()[0]
    for c, name in (("A", "one"), ("B", "two")):  # where the templates differ, then a count
        assert f"long-{name}: mezo template='…view: {{text}} Category {c}' +1 more" in head, head
    assert "settings that differ: template Classify the following customer review" in r.stdout
    assert len(head) < 2 * 90 + 40, head  # was ~290 characters a run
