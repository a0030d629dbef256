"""GPU tests (marked ``gpu``) are skipped cleanly where there is no NVIDIA GPU with libcuda."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _gpu() -> str | None:
    """None when a GPU is usable, else why not."""
    try:
        from aotc import cuda
    except ImportError as e:
        return f"aotc.cuda does not import ({e})"
    return None if cuda.available() else "no NVIDIA GPU with libcuda.so.1 here"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [i for i in items if "gpu" in i.keywords]
    if not gpu_items:
        return
    why = _gpu()
    if why is None:
        return
    for item in gpu_items:
        item.add_marker(pytest.mark.skip(reason=why))
