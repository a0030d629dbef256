"""aotc runtime: load and run aotc packages with numpy and cffi only (no torch, no triton)."""

__version__ = "0.1.0"
