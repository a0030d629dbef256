"""aotc runtime: load and run aotc packages with numpy and cffi only (no torch, no triton).

import aotc
model = aotc.load("model.pkg")          # device="auto" | "cpu" | "cuda"
y = model(x)                            # or model.run({"x": x}) -> {"y": y}
"""

from __future__ import annotations

__version__ = "0.1.0"

from .errors import (
    AotcError,
    CaptureError,
    CompileError,
    DeviceError,
    IncompatiblePackage,
    InputMismatch,
    PackageCorrupt,
    UnsupportedOp,
    UntrustedPackage,
    UsageError,
    VerifyFailed,
)

TYPE_CHECKING = False  # not typing's: ``import aotc`` stays free of typing's import (see aotc.container)
if TYPE_CHECKING:
    from typing import Any

    from .loading import load
    from .model import Model


def __getattr__(name: str) -> Any:
    # ``Model`` imports numpy; importing it on first use keeps ``import aotc`` (and so the ``aotc`` command's
    # entry, aotc.__main__) light enough to turn a Ctrl-C during start-up into exit 130. ``load`` comes from
    # aotc.loading, which imports the rest only once the package's hashing is under way.
    if name == "load":
        from .loading import load

        return load
    if name == "Model":
        from .model import Model

        return Model
    raise AttributeError(f"module 'aotc' has no attribute {name!r}")


__all__ = [
    "AotcError",
    "CaptureError",
    "CompileError",
    "DeviceError",
    "IncompatiblePackage",
    "InputMismatch",
    "Model",
    "PackageCorrupt",
    "UnsupportedOp",
    "UntrustedPackage",
    "UsageError",
    "VerifyFailed",
    "__version__",
    "load",
]
