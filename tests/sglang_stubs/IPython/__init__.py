"""Stub: sglang.utils imports IPython.display for notebook helpers the checks never run (see STUBS)."""
