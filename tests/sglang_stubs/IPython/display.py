"""Stub of IPython.display: `HTML` and `display` are named by sglang.utils, used only in notebooks."""

from _sglang_stub import module_getattr

__getattr__ = module_getattr(__name__)
