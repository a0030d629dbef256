"""One loaded CPU model (examples/mlp.py, built here) called from 8 threads x 500 times, batch sizes mixed:
every result equal, bit for bit, to the single-thread one; and close() while those threads run: every call
either returns that result or is refused as closed (the executor's lock: docs/safety.md, "Threads").
The affine test library does the same in tests/test_runtime_cpu.py; CUDA in tests/gpu/test_safety_gpu.py.
And the thread pool's counters as the runtime reads them (the policy itself is tested by aotc_pool.h's
self-test, in tests/test_templates_compile.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import aotc
import numpy as np
import pytest
from aotc.cpu import POOL_STATS

sys.path.insert(0, str(Path(__file__).parent / "gpu"))
from threaded import calls_around_close, calls_exact

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def mlp(tmp_path_factory: pytest.TempPathFactory, aotc_cache: Path) -> Path:
    pytest.importorskip("torch")
    from aotc_build.build import build
    from aotc_build.options import BuildOptions, Target

    pkg = tmp_path_factory.mktemp("threads") / "mlp.pkg"
    build(ROOT / "examples" / "mlp.py", pkg, BuildOptions(targets=(Target("cpu", "x86-64-v2"),), selftest=False), cache_dir=aotc_cache)
    return pkg


def _cases() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal((n, 256)).astype(np.float32) for n in (1, 8, 33, 64)]


def test_eight_threads_five_hundred_calls(mlp: Path) -> None:
    model = aotc.load(mlp, device="cpu")
    calls_exact(model, _cases())
    model.close()


def test_close_while_threads_call(mlp: Path) -> None:
    model = aotc.load(mlp, device="cpu")
    counts = calls_around_close(model, _cases()[3])
    assert counts["closed"] == 4 and counts["ok"] > 0, counts


def test_pool_counters(mlp: Path) -> None:
    """The pool's counters (CpuExecutor.pool_stats) count calls; one thread runs no parallel loop, a fixed
    count never drops to one thread nor runs a call solo."""
    x = _cases()[3]
    one = aotc.load(mlp, device="cpu", num_threads=1)
    fixed = aotc.load(mlp, device="cpu")
    fixed.executor.set_threads(2, fixed_threads=True)
    for m in (one, fixed):
        before = m.executor.pool_stats()
        assert before is not None and set(before) == set(POOL_STATS)
        for _ in range(20):
            m(x)
        after = m.executor.pool_stats()
        assert after["calls"] - before["calls"] == 20
        assert after["drops"] == after["solo_calls"] == after["probes"] == 0, after
    assert one.executor.pool_stats()["loops"] == 0
    one.close()
    with pytest.raises(aotc.UsageError):
        one.executor.pool_stats()
    fixed.close()


def test_pool_counters_of_a_library_without_them(make_package) -> None:
    """A library built before the counters existed (the hand-written affine one) reports None."""
    model = aotc.load(make_package(), device="cpu")
    assert model.executor.pool_stats() is None
    model.close()
