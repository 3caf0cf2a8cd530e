"""Random numbers every engine draws the same way: Philox4x32-10 on any device (torch) and its
Triton twin, so a direction or a stochastic rounding is a pure function of (seed, group, index)."""
