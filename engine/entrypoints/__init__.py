"""Entry points: the `ringllm` command line (and, later, the OpenAI server)."""
