"""A stand-in for ``python -m aotc_build.tune_worker`` over tests/fake_libcuda.py, for tests/test_tune.py:

    python tests/fake_tune_worker.py WORK.pkl CRASH_ABOVE

Launches whose grid has more than CRASH_ABOVE programs kill the process, as a kernel that faults on the
device kills a real worker (the CUDA context is unusable after an illegal address)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from aotc.cuda_driver import Driver, new_ffi
from aotc_build.tune import run_worker
from fake_libcuda import FakeLib


def main() -> None:
    work, crash_above = Path(sys.argv[1]), int(sys.argv[2])
    lib = FakeLib(new_ffi())

    def cost(launch: object) -> float:
        grid = launch.grid[0]  # type: ignore[attr-defined]
        if grid > crash_above:
            print("CUDA_ERROR_ILLEGAL_ADDRESS (fake)", file=sys.stderr, flush=True)
            os._exit(134)
        return 1.0 / grid

    lib.cost_ms = cost  # type: ignore[method-assign]
    run_worker(work, lambda msg: print(json.dumps(msg), flush=True), Driver(lib=lib, ffi=lib.ffi))


if __name__ == "__main__":
    main()
