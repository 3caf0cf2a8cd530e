"""The knob panel's Export model button: the last run's weights as a folder transformers loads."""
from __future__ import annotations

import pytest

pytest.importorskip("ipywidgets")

from transformers import AutoModelForCausalLM  # noqa: E402

from workbench.ui.panel import KnobPanel  # noqa: E402


def test_export_model_button_writes_a_folder_transformers_loads(tmp_path, one_thread):
    p = KnobPanel(method="mezo", out_dir=tmp_path, steps=2, model="tiny-opt", data="synthetic",
                  batch_size=2, seq_len=16, sample_hz=0.0)
    assert p.model_button.disabled  # nothing to export yet
    p.run().join(timeout=60)
    assert p.recipe.record.status == "done" and not p.model_button.disabled
    p.export_model()
    assert p.message.value.count("exported the model after 2 steps to") == 1
    AutoModelForCausalLM.from_pretrained(p.last_run_dir / "model")
    (p.last_run_dir / "run.json").write_text("{broken")
    p.export_model()  # a failure is one line in the message, not an exception
    assert "export failed: RUN_DIR:" in p.message.value
