"""Training backends: batching of samples into micro-batches and the single-process `torch` backend.

`torch_backend` (and through it transformers) is imported lazily by its users, so importing
`slime.backends.batching` stays light.
"""
