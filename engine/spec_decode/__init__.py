"""Speculative decoding (vLLM's ``speculative_config``): drafts proposed cheaply (n-gram prompt
lookup), verified by the target model in one step (README, "Speculative decoding").
config.py is the frontend's part; the rest runs in the EngineCore."""
