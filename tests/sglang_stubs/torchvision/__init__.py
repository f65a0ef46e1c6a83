"""Stub of torchvision: imported by sglang's multimodal processors, never run by text-only checks (see STUBS)."""

from _sglang_stub import module_getattr

__getattr__ = module_getattr(__name__)
