"""The exported folder on disk: streamed safetensors files that safetensors itself reads, shards
and their index, sizes, and atomicity (a failure mid-write or Ctrl-C leaves no folder and no
temporary one; an existing folder is refused, or replaced whole with --overwrite)."""
from __future__ import annotations

import errno
import json
import os

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from export_helpers import SHORT, train_live
from workbench.cli import main
from workbench.config import RunConfig
from workbench.export import safetensors_stream
from workbench.export.exporter import export_run
from workbench.export.folder import parse_size, plan_shards
from workbench.export.safetensors_stream import StreamWriter, TensorSpec, read_fp32
from workbench.export.source import ExportError


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_streamed_file_reads_back_with_safetensors(tmp_path, monkeypatch, dtype):
    monkeypatch.setattr(safetensors_stream, "CHUNK", 7)  # casts and reads cross chunk edges
    gen = torch.Generator().manual_seed(0)
    tensors = {"a.weight": torch.randn(5, 9, generator=gen), "b": torch.randn(3, generator=gen),
               "empty": torch.zeros(0, 4), "c.bias": torch.randn(20, generator=gen)}
    specs = [TensorSpec(k, tuple(v.shape)) for k, v in tensors.items()]
    w = StreamWriter(tmp_path / "f.safetensors", specs, dtype, {"format": "pt"})
    for k, v in tensors.items():
        w.write(k, v)
    w.close()
    with safe_open(str(tmp_path / "f.safetensors"), "pt") as fh:
        assert fh.metadata() == {"format": "pt"}
        for k, v in tensors.items():
            assert torch.equal(fh.get_tensor(k), v.to(dtype))
            assert torch.equal(read_fp32(tmp_path / "f.safetensors", k), v.to(dtype).float()
                               .reshape(-1))


def test_writer_refuses_a_tensor_out_of_order_or_missing(tmp_path):
    specs = [TensorSpec("a", (2,)), TensorSpec("b", (3,))]
    w = StreamWriter(tmp_path / "f.safetensors", specs, torch.float32, {})
    with pytest.raises(ValueError, match="expected a"):
        w.write("b", torch.zeros(3))
    w.write("a", torch.zeros(2))
    with pytest.raises(ValueError, match="1 tensors were not written"):
        w.close()


def test_sizes_and_shard_plan():
    assert parse_size("5GB") == 5 * 10**9 and parse_size("2GiB") == 2 * 2**30
    assert parse_size("500mb") == 500 * 10**6 and parse_size("1024") == 1024
    for bad in ("five", "5XB", "0", "-1GB"):
        with pytest.raises(ExportError, match="--shard-size"):
            parse_size(bad)
    specs = [TensorSpec("a", (10,)), TensorSpec("b", (10,)), TensorSpec("big", (100,)),
             TensorSpec("c", (5,))]
    plan = plan_shards(specs, torch.float32, 80)  # 40 B each for a, b: together 80 B
    assert [[s.name for s in shard] for shard in plan] == [["a", "b"], ["big"], ["c"]]


def test_sharded_export_has_an_index_transformers_follows(tmp_path, one_thread):
    train_live(RunConfig(model="tiny-llama", method="mezo", **SHORT), tmp_path / "run")
    one = export_run(tmp_path / "run", tmp_path / "one")
    res = export_run(tmp_path / "run", tmp_path / "many", shard_size="40KB")
    index = json.loads((tmp_path / "many" / "model.safetensors.index.json").read_text())
    shards = sorted(p.name for p in (tmp_path / "many").glob("model-*.safetensors"))
    assert len(shards) > 3 and set(index["weight_map"].values()) == set(shards)
    assert all(p.stat().st_size <= 40_000 + 4096 or len(_keys(p)) == 1
               for p in (tmp_path / "many").glob("model-*.safetensors"))
    assert res.digest == one.digest
    a = AutoModelForCausalLM.from_pretrained(tmp_path / "one").state_dict()
    b = AutoModelForCausalLM.from_pretrained(tmp_path / "many").state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _keys(path) -> list[str]:
    with safe_open(str(path), "pt") as fh:
        return list(fh.keys())


@pytest.fixture
def done_run(tmp_path, one_thread):
    train_live(RunConfig(model="tiny-llama", method="mezo", **SHORT), tmp_path / "run")
    return tmp_path / "run"


def _failing_write(monkeypatch, after: int, error: BaseException) -> None:
    """StreamWriter.write raises ``error`` on its ``after``-th call (part of a file written)."""
    real, calls = StreamWriter.write, []

    def write(self, name, values):
        calls.append(name)
        if len(calls) == after:
            self._fh.write(b"\0" * 100)
            raise error
        return real(self, name, values)

    monkeypatch.setattr(StreamWriter, "write", write)


@pytest.mark.parametrize("error", [OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "x"),
                                   KeyboardInterrupt()], ids=["full-disk", "ctrl-c"])
def test_a_failure_mid_write_leaves_nothing(tmp_path, done_run, monkeypatch, capsys, error):
    _failing_write(monkeypatch, 5, error)
    out = tmp_path / "exports" / "model"
    status = main(["export", str(done_run), "--out", str(out), "--shard-size", "20KB",
                   "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    if isinstance(error, OSError):
        assert status == 2 and err == ["error: --out: the export failed and left nothing (No "
                                       "space left on device: x)"]
    else:
        assert status == 130 and err == [f"error: export interrupted; nothing was written to "
                                         f"{out}"]
    assert not out.exists()
    assert list((tmp_path / "exports").iterdir()) == []  # no temporary folder either


def test_an_existing_folder_is_refused_and_overwrite_replaces_only_an_export(tmp_path, done_run,
                                                                            capsys):
    out = tmp_path / "model"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    for extra in ([], ["--overwrite"]):  # not an export: never replaced
        assert main(["export", str(done_run), "--out", str(out), "--quiet", *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"error: --out: {out.resolve()} holds other files, not an export; give a "
                       "new or empty folder (nothing there is deleted, not even with "
                       "--overwrite)"]
        assert [p.name for p in out.iterdir()] == ["mine.txt"]
    (out / "mine.txt").unlink()
    assert main(["export", str(done_run), "--out", str(out), "--quiet"]) == 0  # empty: used
    (out / "mine.txt").write_text("keep me")  # beside an export: the user's, kept
    assert main(["export", str(done_run), "--out", str(out), "--quiet"]) == 2
    assert "already holds an export" in capsys.readouterr().err
    assert main(["export", str(done_run), "--out", str(out), "--overwrite", "--quiet"]) == 0
    assert (out / "mine.txt").read_text() == "keep me" and (out / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "run"]  # no old copy left
    AutoModelForCausalLM.from_pretrained(out)


def test_a_failed_overwrite_keeps_the_old_folder(tmp_path, done_run, monkeypatch):
    out = tmp_path / "model"
    export_run(done_run, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    _failing_write(monkeypatch, 3, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "x"))
    with pytest.raises(ExportError, match="No space left on device"):
        export_run(done_run, out, overwrite=True, dtype="bf16")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "run"]
