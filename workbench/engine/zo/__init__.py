"""Zeroth-order training: the one ZO step (``step``), its perturbations (``perturb``, ``philox``,
the fused Triton ``kernels``) and the engines that drive it (``mezo``, ``offload``,
``lora_offload``, ``forward_grad``), the weight tied between embedding and head (``tied``) and
the checkpoint replay (``replay``)."""
