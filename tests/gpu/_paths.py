"""Make ``aotc`` (runtime/) and ``aotc_build`` (aot/) importable from a bare checkout.

The GPU machine runs the repository as copied, without ``pip install``; this links the two packages
under a temporary folder on ``sys.path`` when they are not installed.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def ensure_importable(builder: bool = False) -> None:
    names = {"aotc": "runtime"} | ({"aotc_build": "aot"} if builder else {})
    missing = {n: d for n, d in names.items() if importlib.util.find_spec(n) is None}
    if not missing:
        return
    shim = Path(tempfile.gettempdir()) / f"aotc-shim-{os.getuid()}"
    shim.mkdir(exist_ok=True)
    for name, folder in missing.items():
        link = shim / name
        if not link.exists():
            link.symlink_to(ROOT / folder)
    sys.path.insert(0, str(shim))


def gpu_unavailable() -> str | None:
    """None when this process can run CUDA targets, else why not (for ``pytest.mark.skipif``)."""
    ensure_importable()
    try:
        from aotc import cuda
    except ImportError as e:
        return f"aotc.cuda does not import ({e})"
    return None if cuda.available() else "no NVIDIA GPU with libcuda.so.1 here"
