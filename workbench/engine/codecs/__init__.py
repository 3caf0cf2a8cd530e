"""Formats weights travel and rest in: the wire codecs of trained blocks (``wire``) and their
stochastic-rounding kernel (``sr_kernel``); the frozen base's codecs (``base``), their fused
decodes (``base_kernels``) and the form a base block is computed in (``frozen_form``)."""
