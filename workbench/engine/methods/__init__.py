"""The training methods: each composes a weight holder (whole, streamed, streamed LoRA) with a
rule (ZO, JVP, AdamW). mezo, zo-offload, lora-offload, forward-grad, fo, fo-offload, and the
replay of a ZO run from its step log."""
