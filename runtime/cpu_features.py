"""Which x86-64 micro-architecture level this CPU runs: flags from /proc/cpuinfo, levels as flag sets.

What it is: ``cpu_flags()``, ``LEVEL_FEATURES`` (the flags a level needs, in /proc/cpuinfo spelling) and
``cpu_level()``. The builder (``aotc_build.options``) uses ``cpu_level`` for ``--target cpu:native`` and
records ``LEVEL_FEATURES[level]`` in each CPU target; the runtime checks them against ``cpu_flags()``
before dlopen.
What it is not: a CPUID decoder. Linux reports what the kernel and hypervisor enable, which is what counts.
"""

from __future__ import annotations

import functools

# Flags (as /proc/cpuinfo names them) that the compiler may use at each level (see the x86-64 psABI).
_V2 = ("cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3")
_V3 = (*_V2, "avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "movbe")
_V4 = (*_V3, "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")
LEVEL_FEATURES: dict[str, tuple[str, ...]] = {"x86-64-v2": _V2, "x86-64-v3": _V3, "x86-64-v4": _V4}
LEVELS = tuple(LEVEL_FEATURES)  # lowest first


@functools.lru_cache(maxsize=4)
def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    """The flags of the first CPU listed (empty when there is no /proc/cpuinfo or no "flags" line)."""
    # Read only up to the first "flags" line: the kernel writes the file CPU by CPU as it is read, and on a
    # server with a hundred cores the whole of it takes milliseconds of every cold start.
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "flags":
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def cpu_level(flags: frozenset[str] | None = None) -> str:
    """The highest level whose features are all present; x86-64-v2 when none is (the lowest we build)."""
    have = cpu_flags() if flags is None else flags
    for level in reversed(LEVELS):
        if set(LEVEL_FEATURES[level]) <= have:
            return level
    return LEVELS[0]


def missing_features(features: tuple[str, ...] | list[str], flags: frozenset[str] | None = None) -> list[str]:
    """Which of ``features`` this CPU lacks."""
    have = cpu_flags() if flags is None else flags
    return [f for f in features if f not in have]
