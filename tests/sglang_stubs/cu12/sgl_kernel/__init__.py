"""Stub of sgl_kernel (the sglang-kernel CUDA wheel): sglang 0.5.10 imports it at module level, no check runs a kernel (see STUBS)."""

from _sglang_stub import module_getattr

__getattr__ = module_getattr(__name__)
