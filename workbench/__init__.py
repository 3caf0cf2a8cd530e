"""zo-workbench: zeroth-order fine-tuning with CPU offloading, and a live view of the machine.

Packages import one way, each on its own floor: presets, config -> models -> data -> plan (the
cost model, no torch) -> engine -> distributed -> calibrate -> telemetry -> runs -> export ->
recipes -> ui -> cli, with the notebooks on top (``tests/test_layers.py`` checks it).
"""
__version__ = "0.1.0"
