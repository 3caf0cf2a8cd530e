"""The one cost model: arithmetic only, no torch (``tests/test_layers.py`` checks it).

``planner.py`` predicts a run's memory, PCIe traffic and step time (``zo.py``, ``fo.py``,
``lora.py``, ``memory.py``, ``flops.py``) from machine rates (``rates.py``: defaults, a GPU table,
this machine's calibration); ``fit.py`` refuses what cannot fit and says which knob helps;
``placement.py`` decides where fo-offload updates each optimizer subgroup, for the planner and
the engine alike.
"""
