"""``hf:NAME[:CONFIG]`` goes through ``datasets.load_dataset``: offline it reads the cache or a
local folder, and a data set that is not there is refused in one line (as a user runs it)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytest.importorskip("datasets")


def _offline_env(tmp_path) -> dict:
    env = dict(os.environ, HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1",
               HF_DATASETS_OFFLINE="1", PYTHONPATH=str(REPO))
    return env


def test_hf_data_set_not_cached_is_one_line_offline(tmp_path):
    r = subprocess.run([sys.executable, "-m", "workbench", "run", "--set", "data=hf:acme/no-such-set",
                        "--set", "steps=1", "--set", "telemetry=false", "--out", str(tmp_path / "run")],
                       cwd=REPO, env=_offline_env(tmp_path), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr
    assert lines[0].startswith("error: data: hf:acme/no-such-set: not in the local cache and the "
                               "Hugging Face libraries are offline")


def test_hf_local_folder_through_load_dataset_offline(tmp_path):
    folder = tmp_path / "set"
    folder.mkdir()
    train = [{"prompt": f"q{i}", "completion": f" a{i}"} for i in range(6)]
    dev = [{"prompt": "qd", "completion": " ad"}]
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train))
    (folder / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in dev))
    code = ("import json, sys; from workbench.data.sources import load_rows; "
            "from workbench.data.fields import completion_examples; "
            "t, d = load_rows(sys.argv[1], None, 'completion'); "
            "print(json.dumps([[(e.prompt, e.completion) for e in completion_examples(r)] "
            "for r in (t, d)] + [t.origin]))")
    r = subprocess.run([sys.executable, "-c", code, f"hf:{folder}"], cwd=REPO,
                       env=_offline_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    got_train, got_dev, origin = json.loads(r.stdout)
    assert got_train == [[e["prompt"], e["completion"]] for e in train]
    assert got_dev == [[e["prompt"], e["completion"]] for e in dev]
    assert origin == f"hf:{folder} [train]"
