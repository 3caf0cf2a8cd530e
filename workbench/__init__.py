"""zo-workbench: zeroth-order fine-tuning with CPU offloading, and a live view of the machine.

Layers import one way: config -> engine (models, data, engine) -> telemetry -> recipes -> ui,
with the CLI and notebooks on top.
"""
__version__ = "0.1.0"
