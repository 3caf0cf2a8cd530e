"""zo-workbench: zeroth-order fine-tuning with CPU offloading, and a live view of the machine.

Layers import one way: config -> models, data -> plan (the cost model, no torch) -> engine ->
calibrate, telemetry -> recipes -> ui, with the CLI and notebooks on top
(``tests/test_layers.py`` checks it).
"""
__version__ = "0.1.0"
