"""Stub of sgl_kernel.kvcacheio: host KV-cache copy kernels, imported by sglang 0.5.10's memory pool (see STUBS)."""

from _sglang_stub import module_getattr

__getattr__ = module_getattr(__name__)
