"""Streaming blocks between host and GPU: the scheduler (``scheduler``), its CUDA streams
(``streams``), the transfers of trained blocks (``transfers``) and of a frozen base
(``frozen_transfer``), page-locked host memory (``pinned``) and the node's one host copy under
data parallel (``shared_host``)."""
