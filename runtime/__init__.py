"""aotc runtime: load and run aotc packages with numpy and cffi only (no torch, no triton).

import aotc
model = aotc.load("model.pkg")          # device="auto" | "cpu" | "cuda"
y = model(x)                            # or model.run({"x": x}) -> {"y": y}
"""

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
    UsageError,
    VerifyFailed,
)
from .model import Model, load

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
    "UsageError",
    "VerifyFailed",
    "__version__",
    "load",
]
