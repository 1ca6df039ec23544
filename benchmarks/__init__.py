"""ringllm benchmarks: one harness (harness.py), one module per scenario."""
