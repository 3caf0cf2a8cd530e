"""First-order training: AdamW with everything on the device (``resident``), and with the
optimizer states offloaded and interleaved (``offload``, whose CPU side is ``host`` and whose
"auto" placement trial is ``trial``; the placement model is ``workbench.plan.placement``)."""
