"""What keeps a cold start short outside aotc.load (aotc.load's own part: tests/test_hashing.py)."""

from __future__ import annotations

import os
import subprocess
import sys


def test_the_aotc_command_keeps_openblas_to_one_thread() -> None:
    """numpy's OpenBLAS would start (and spin) a thread per core at import; a user's own setting wins."""
    code = "import sys, aotc.__main__ as m, os; sys.argv = ['aotc', '--version']; m.main()"
    show = "import atexit, os; atexit.register(lambda: print('BLAS', os.environ.get('OPENBLAS_NUM_THREADS')))\n"
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    for preset, want in ((None, "1"), ("3", "3")):
        e = env if preset is None else {**env, "OPENBLAS_NUM_THREADS": preset}
        r = subprocess.run([sys.executable, "-c", show + code], capture_output=True, text=True, env=e, check=False)
        assert f"BLAS {want}" in r.stdout, (r.stdout, r.stderr)
