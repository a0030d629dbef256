"""The child process of ``aotc build --tune`` (aot/tune.py ``measure_isolated``): times the candidates of
the jobs in a work file on the GPU and prints one JSON line per event, so that a candidate that faults on the
device takes down this process and not the build.

    python -m aotc_build.tune_worker WORK.pkl
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from .tune import run_worker


def _emit(msg: dict[str, Any]) -> None:
    print(json.dumps(msg), flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    run_worker(Path(sys.argv[1]), _emit)
