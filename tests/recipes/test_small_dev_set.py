"""A user's own small file: the run says how many examples it trained and evaluated on, and a
dev set of 4 examples cannot make a run ``learning``."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_a_40_row_file_prints_its_sizes_and_a_4_example_dev_set_is_weighed(tmp_path):
    rows = [f"sample {i} about thing {(i * 7) % 10},{i % 2}" for i in range(40)]
    data = tmp_path / "small.csv"
    data.write_text("text,label\n" + "\n".join(rows) + "\n")
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "workbench", "run", "--quiet", "--out", str(out),
                        "--set", "model=tiny-opt", "--set", f"data={data}", "--set", "steps=8",
                        "--set", "batch_size=4"], cwd=REPO, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("train / dev examples"))
    assert line.split()[-3:] == ["36", "/", "4"], line  # every tenth row to dev
    health = json.loads((out / "run.json").read_text())["summary"]["health"]
    assert health["state"] != "learning"
    assert "(4 examples, too few to weigh)" in health["evidence"]["basis"]
    assert "4 examples, too few to weigh" in r.stdout
