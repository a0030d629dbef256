"""One loaded CPU model (examples/mlp.py, built here) called from 8 threads x 500 times, batch sizes mixed:
every result equal, bit for bit, to the single-thread one; and close() while those threads run: every call
either returns that result or is refused as closed (the executor's lock: docs/safety.md, "Threads").
The affine test library does the same in tests/test_runtime_cpu.py; CUDA in tests/gpu/test_safety_gpu.py."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import aotc
import numpy as np
import pytest

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
    cases = _cases()
    want = [model(x) for x in cases]
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for i in range(500):
                j = (i + k) % len(cases)
                if not np.array_equal(model(cases[j]), want[j]):
                    raise AssertionError(f"thread {k} call {i} (batch {len(cases[j])}) differs from the single-thread result")
        except BaseException as e:  # reported below: threads do not raise into pytest
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    model.close()


def test_close_while_threads_call(mlp: Path) -> None:
    model = aotc.load(mlp, device="cpu")
    x = _cases()[3]
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

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    model.close()
    for t in threads:
        t.join(60)
    assert errors == [] and counts["closed"] == 4 and counts["ok"] > 0, counts
