"""The typed errors shared by the runtime, the builder and the CLI.

Every refusal is one of these, with a message that names the thing and the fix. Each class carries
the CLI exit code it maps to, so the mapping lives next to the meaning.
"""

from __future__ import annotations


class AotcError(Exception):
    """Base of every error aotc raises on purpose."""

    exit_code = 1


class UsageError(AotcError):
    """The command line or API was called wrongly (missing file, bad flag value)."""

    exit_code = 2


class PackageCorrupt(AotcError):
    """A package member is missing, malformed, or its sha256 does not match the manifest."""

    exit_code = 3


class IncompatiblePackage(AotcError):
    """The package is fine but cannot run here: format version, GPU arch, CPU ISA, driver, libcuda."""

    exit_code = 4


class InputMismatch(AotcError):
    """An input's name, dtype, shape, device or dynamic-dimension range does not match the package."""

    exit_code = 5


class UnsupportedOp(AotcError):
    """The model uses an aten op (or op variant) that aotc cannot lower; names the op and source line."""

    exit_code = 6


class CaptureError(AotcError):
    """torch.export could not capture the model (graph break, data-dependent control flow, ...)."""

    exit_code = 6


class CompileError(AotcError):
    """A generated kernel failed to compile; names the source file and the exact compiler command."""

    exit_code = 7


class VerifyFailed(AotcError):
    """The package's self-test ran but its outputs differ from the recorded eager outputs."""

    exit_code = 8


class DeviceError(AotcError):
    """A CUDA driver call failed while running a package (names the call, CUresult and kernel)."""

    exit_code = 9


class UntrustedPackage(AotcError):
    """A signature was required and the package is unsigned, signed by a key not trusted, or changed after
    signing (``trusted_keys=`` / ``--require-signature``; docs/safety.md)."""

    exit_code = 10


EXIT_CODES = {
    cls.__name__: cls.exit_code
    for cls in (
        AotcError,
        UsageError,
        PackageCorrupt,
        IncompatiblePackage,
        InputMismatch,
        UnsupportedOp,
        CaptureError,
        CompileError,
        VerifyFailed,
        DeviceError,
        UntrustedPackage,
    )
}
