"""The runtime's first rule: it runs a package where torch, triton and the builder cannot be imported.

A fresh interpreter installs an import hook that refuses torch, triton, aotc_build (and the other build-only
packages) before anything else runs, then loads, runs and verifies a package, and runs the CLI.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BLOCKER = """
import sys
BLOCKED = {"torch", "triton", "aotc_build", "sympy", "safetensors", "jinja2", "onnx"}
class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is blocked: the runtime must not import it")
        return None
sys.meta_path.insert(0, Blocker())
"""

SCRIPT = """
import numpy as np
import aotc
try:
    import torch
except ImportError:
    pass
else:
    raise SystemExit("the blocker failed")
model = aotc.load(sys.argv[1])
x = np.ones((3, 4), np.float32)
y, relu = model(x, np.ones(3, np.float32))
assert y.shape == (3, 3)
assert all(c.ok for c in model.verify())
from aotc.cli import main
sys.argv = ["aotc", "verify", sys.argv[1]]
try:
    main()
except SystemExit as e:
    assert e.code in (0, None), e.code
leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
assert not leaked, leaked
print("RUNTIME-OK", model.target)
"""


def test_runtime_runs_without_torch(make_package, tmp_path: Path) -> None:
    pkg = make_package()
    r = subprocess.run(
        [sys.executable, "-c", BLOCKER + SCRIPT, str(pkg)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "RUNTIME-OK cpu:" in r.stdout


UNLOAD = """
import gc
import numpy as np
import aotc
x, s = np.ones((64, 4), np.float32), np.ones(64, np.float32)
for _ in range(3):
    model = aotc.load(sys.argv[1], num_threads=2)
    model(x, s)  # OpenMP starts worker threads inside libgomp
    del model
    gc.collect()  # the library is unloaded; libgomp must stay
print("UNLOAD-OK")
"""


def test_unloading_after_parallel_runs(make_package, tmp_path: Path) -> None:
    """A fresh process (no torch holding libgomp) where OpenMP ran and the model library is unloaded."""
    r = subprocess.run(
        [sys.executable, "-c", BLOCKER + UNLOAD, str(make_package())],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0 and "UNLOAD-OK" in r.stdout, (r.returncode, r.stdout + r.stderr)
