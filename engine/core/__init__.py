"""The EngineCore: scheduler, KV cache and the step loop (no transport, no tokenizer)."""
