"""One loaded model called from many threads: the harness of tests/test_threads.py (CPU) and
tests/gpu/test_safety_gpu.py (CUDA). It lives here, beside the other helpers both folders share, because
the GPU machine puts only tests/gpu on ``sys.path``."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def calls_exact(model: Callable[[np.ndarray], Any], cases: Sequence[np.ndarray], threads: int = 8, calls: int = 500) -> float:
    """``threads`` threads call ``model`` ``calls`` times each, cycling through ``cases`` from different
    starts; every result must equal, bit for bit, the single-thread one. Raises the first failure; returns
    the seconds the threads took."""
    want = [model(x) for x in cases]
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for i in range(calls):
                j = (i + k) % len(cases)
                if not np.array_equal(model(cases[j]), want[j]):
                    raise AssertionError(f"thread {k} call {i} (batch {len(cases[j])}) differs from the single-thread result")
        except BaseException as e:  # reported below: threads do not raise into pytest
            errors.append(e)

    t0 = time.perf_counter()
    _run([threading.Thread(target=work, args=(k,)) for k in range(threads)], None)
    if errors:
        raise errors[0]
    return time.perf_counter() - t0


def calls_around_close(model: Any, x: np.ndarray, threads: int = 4, wait: float = 0.3, join: float = 60) -> dict[str, int]:
    """``threads`` threads call ``model(x)`` until ``model.close()``, made after ``wait`` seconds, refuses
    them; every call must return the single-thread result or raise ``UsageError`` saying it was closed.
    Returns how many calls ended each way ({"ok": n, "closed": n})."""
    import aotc

    want = model(x)
    counts = {"ok": 0, "closed": 0}
    errors: list[BaseException] = []
    lock = threading.Lock()

    def work() -> None:
        while True:
            try:
                y = model(x)
            except aotc.UsageError as e:
                with lock:
                    counts["closed"] += "closed" in str(e)
                return
            except BaseException as e:
                errors.append(e)
                return
            if not np.array_equal(y, want):
                errors.append(AssertionError("a call around close() returned a different result"))
                return
            with lock:
                counts["ok"] += 1

    _run([threading.Thread(target=work) for _ in range(threads)], lambda: (time.sleep(wait), model.close()), join)
    if errors:
        raise errors[0]
    return counts


def _run(threads: list[threading.Thread], meanwhile: Callable[[], object] | None, join: float | None = None) -> None:
    for t in threads:
        t.start()
    if meanwhile is not None:
        meanwhile()
    for t in threads:
        t.join(join)
