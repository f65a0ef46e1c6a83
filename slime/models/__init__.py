"""Model builders: `tiny` makes a small random Qwen3 with its tokenizer offline, for tests and CPU runs."""
