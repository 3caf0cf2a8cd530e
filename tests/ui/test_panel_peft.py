"""The knob panel's peft group (issue 19): shown for every method (each trains adapters)."""
import ipywidgets as widgets

from workbench.config import RunConfig
from workbench.ui.panel import KnobPanel


def test_the_peft_group_is_shown_for_adapter_methods_and_builds_the_run():
    p = KnobPanel(method="zo-offload", steps=3)
    shown = lambda: set(p.groups)  # a page of knobs per group shown  # noqa: E731
    assert "peft" in shown()
    c = p.controls
    assert isinstance(c["peft"], widgets.Dropdown) and set(c["peft"].options) == {"none", "lora"}
    assert set(c["base_codec"].options) == {"fp32", "bf16", "fp16", "fp8-e4m3", "int8"}
    c["peft"].value, c["base_codec"].value, c["lora_rank"].value = "lora", "int8", 4
    assert p.config() == RunConfig(method="zo-offload", steps=3, peft="lora", base_codec="int8",
                                   lora_rank=4)
    for method in ("mezo", "forward-grad", "fo", "fo-offload"):  # every method trains adapters
        c["method"].value = method
        assert "peft" in shown()
        assert p.config() == RunConfig(method=method, steps=3, peft="lora", base_codec="int8",
                                       lora_rank=4)
