"""slime's `slime.backends.megatron_utils` import path, for plugins written against slime (import-light).

Only `cp_utils` is here: the context-parallel helpers that slime's example plugins (the train/inference
mismatch helper's `compute_mis_weights_with_cp`) import. The trainers of this package run at context-
parallel size 1, where those helpers keep slime's names and their size-1 meaning. Our Megatron trainer
is `slime.backends.megatron_backend`.
"""
