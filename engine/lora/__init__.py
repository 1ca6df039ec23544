"""LoRA adapters (vLLM's ``enable_lora``): the request, the limits, adapter files, and the
per-projection low-rank updates that run beside the base weights. Modules import nothing
above them; this package file imports nothing."""
