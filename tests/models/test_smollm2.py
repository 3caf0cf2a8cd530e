"""The SmolLM2 cache folder is published whole, once, even when several runs convert at once."""
from __future__ import annotations

from pathlib import Path

import pytest

from workbench.models.smollm2 import publish


def folder(path: Path, text: str) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(text)
    return path


def test_publish_moves_the_complete_folder(tmp_path):
    out = publish(folder(tmp_path / "m.partial-1", "mine"), tmp_path / "m")
    assert (out / "config.json").read_text() == "mine"
    assert [p.name for p in tmp_path.iterdir()] == ["m"]


def test_a_second_converter_keeps_the_first_copy_and_drops_its_own(tmp_path):
    first = publish(folder(tmp_path / "m.partial-1", "first"), tmp_path / "m")
    second = publish(folder(tmp_path / "m.partial-2", "second"), tmp_path / "m")
    assert first == second and (second / "config.json").read_text() == "first"
    assert [p.name for p in tmp_path.iterdir()] == ["m"]


def test_an_incomplete_target_is_an_error_not_a_silent_keep(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "junk").write_text("x")
    with pytest.raises(OSError):
        publish(folder(tmp_path / "m.partial-1", "mine"), tmp_path / "m")
    assert (tmp_path / "m.partial-1" / "config.json").is_file()  # nothing lost


def test_unavailable_says_why_the_weights_cannot_be_had(tmp_path, monkeypatch):
    from workbench.models import smollm2

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / smollm2.GGUF_NAME
    monkeypatch.setenv("WORKBENCH_SMOLLM2_GGUF", str(gguf))
    assert smollm2.unavailable() == f"model: {gguf} does not exist"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setattr(smollm2.importlib.util, "find_spec",
                        lambda name: None if name == "gguf" else object())
    assert smollm2.unavailable() == ("model: converting SmolLM2's GGUF file needs the gguf "
                                     "package (pip install gguf)")
    done = folder(tmp_path / "cache" / "smollm2-135m", "{}")
    assert smollm2.unavailable() != ""  # a config without weights is not a converted folder
    (done / "model.safetensors").write_bytes(b"")
    assert smollm2.unavailable() == ""  # converted: neither the file nor gguf is needed
    monkeypatch.setattr(smollm2.importlib.util, "find_spec", lambda name: object())
    (done / "model.safetensors").unlink()
    assert smollm2.unavailable() == ""  # the file and gguf: it can be converted
