"""The one timing loop the benchmark scripts share (imported as a sibling: scripts run from benchmarks/)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_ms(
    fn: Callable[[], object], *, repeats: int, calls: int | None = None, warmup: int = 1, min_time: float = 0.3
) -> float:
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
