"""aotc runtime: load and run aotc packages with numpy and cffi only (no torch, no triton).

import aotc
model = aotc.load("model.pkg")          # device="auto" | "cpu" | "cuda"
y = model(x)                            # or model.run({"x": x}) -> {"y": y}
"""

from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from .model import Model, load


def __getattr__(name: str) -> Any:
    # ``load`` and ``Model`` import numpy; importing them on first use keeps ``import aotc`` (and so the
    # ``aotc`` command's entry, aotc.__main__) light enough to turn a Ctrl-C during start-up into exit 130.
    if name in ("load", "Model"):
        from . import model

        return getattr(model, name)
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
