"""Build options: one frozen dataclass passed down every stage; targets parsed from their text form.

What it is: ``BuildOptions``, ``Target`` and ``parse_target``. What it is not: a cache key. Each stage hashes
what its output depends on (the g++ flags, the Triton options) into its own cache key."""

from __future__ import annotations

from dataclasses import dataclass

from aotc.cpu_features import LEVELS as CPU_LEVELS  # defined once, beside the features each level needs
from aotc.errors import UsageError

CUDA_ARCHS = (75, 80, 86, 89, 90, 100, 120)


@dataclass(frozen=True)
class Target:
    kind: str  # "cpu" | "cuda"
    arch: str  # cpu: an x86-64 micro-architecture level; cuda: "sm_90"

    @property
    def sm(self) -> int:
        assert self.kind == "cuda"
        return int(self.arch.removeprefix("sm_"))

    def __str__(self) -> str:
        return f"{self.kind}:{self.arch}"


def parse_target(text: str) -> Target:
    """``cpu``, ``cpu:x86-64-v3``, ``cuda:sm_90`` (also ``sm_90``)."""
    t = text.strip().lower()
    if t.startswith("sm_"):
        t = "cuda:" + t
    kind, _, arch = t.partition(":")
    if kind == "cpu":
        arch = arch or "native"
        if arch == "native":
            arch = native_cpu_level()
        if arch not in CPU_LEVELS:
            raise UsageError(f"unknown CPU target {text!r}: use cpu, cpu:native or one of {', '.join(CPU_LEVELS)}")
        return Target("cpu", arch)
    if kind == "cuda":
        if not arch.startswith("sm_") or not arch[3:].isdigit() or int(arch[3:]) not in CUDA_ARCHS:
            raise UsageError(
                f"unknown CUDA target {text!r}: use cuda:sm_NN with NN one of {', '.join(map(str, CUDA_ARCHS))}"
            )
        return Target("cuda", arch)
    raise UsageError(f"unknown target {text!r}: use cpu[:level] or cuda:sm_NN (e.g. cuda:sm_90)")


def native_cpu_level() -> str:
    """The highest x86-64 level this machine runs (read from /proc/cpuinfo)."""
    from aotc.cpu_features import cpu_level

    return cpu_level()


# fp32: IEEE fp32 everywhere. bf16/fp16: the model's weights, inputs and activations in that type, matmuls
# accumulating in fp32. tf32: an fp32 model whose GPU matmuls round operands to TF32 (opt-in: ~1e-3 relative).
PRECISIONS = ("fp32", "bf16", "fp16", "tf32")


@dataclass(frozen=True)
class BuildOptions:
    targets: tuple[Target, ...] = (Target("cpu", "x86-64-v3"),)
    precision: str = "fp32"  # one of PRECISIONS
    dynamic: tuple[str, ...] = ()  # "input:axis:name[:min:max]" overrides from the command line
    selftest: bool = True
    opt_level: str = "-O3"
    cuda_fp_fusion: bool = True  # let Triton contract a*b+c into FMA (False: bit-closer to eager)
    tune: bool = False  # benchmark tile configs on a GPU of the target's SM and cache the winners (aot/tune.py)
    winograd: bool = True  # CPU 3x3 convs may run as Winograd (codegen/cpp_pack.py); False: the direct conv's smaller error

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise UsageError(f"unknown precision {self.precision!r}: use one of {', '.join(PRECISIONS)}")
