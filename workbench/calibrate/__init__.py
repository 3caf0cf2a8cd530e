"""Calibration: runs torch and the engines on this machine to measure the rates the plan uses
(``machine.py``: links, AdamW, perturbation, kernels; ``shapes.py``: blocks at model shapes and
the host's cost per step) and that fo-offload places its subgroups with (``fo.py``)."""
