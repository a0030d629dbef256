"""What the benchmark scripts share for timing (imported as a sibling: scripts run from benchmarks/): the one
timing loop, ``busy_core`` for timings taken while another process keeps a core busy, and ``cpu_name`` for
the results' records."""

from __future__ import annotations

import argparse
import contextlib
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path


def cpu_name() -> str:
    """The CPU's model name as /proc/cpuinfo gives it (the machine's architecture where it has none)."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


def median_ms(fn: Callable[[], object], *, repeats: int, calls: int | None = None, warmup: int = 1, min_time: float = 0.3) -> float:
    """Median over ``repeats`` of the mean milliseconds per call of ``calls`` back-to-back calls, after
    ``warmup`` calls. Without ``calls``, one timed call sizes each repeat to about ``min_time`` seconds."""
    for _ in range(warmup):
        fn()
    if calls is None:
        t = time.perf_counter()
        fn()
        calls = max(1, int(min_time / max(time.perf_counter() - t, 1e-6)))
    reps = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        reps.append((time.perf_counter() - t) / calls * 1e3)
    return statistics.median(reps)


BURSTS = """
import sys, time
on, period = float(sys.argv[1]) / 1e3, float(sys.argv[2]) / 1e3
while True:
    t = time.perf_counter()
    while time.perf_counter() - t < on:
        pass
    time.sleep(period - on)
"""


def bursts_arg(text: str) -> tuple[float, float]:
    """argparse type of the scripts' ``--bursts ON:PERIOD`` (ms): busy_core's ``bursts``."""
    try:
        on, period = (float(v) for v in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected ON:PERIOD in ms, e.g. 4:10") from None
    if not 0 < on < period:
        raise argparse.ArgumentTypeError(f"{text!r}: ON must be above 0 and below PERIOD")
    return on, period


@contextlib.contextmanager
def busy_core(bursts: tuple[float, float] | None = None) -> Iterator[None]:
    """One other process spinning on a core for the length of the block (a neighbour on a shared machine);
    with ``bursts`` (on, period) in ms, it spins ``on`` ms of every ``period``."""
    cmd = [sys.executable, "-c", BURSTS, *map(str, bursts)] if bursts else [sys.executable, "-c", "while True: pass"]
    p = subprocess.Popen(cmd)
    try:
        time.sleep(0.2)
        yield
    finally:
        p.kill()
        p.wait()
