"""The runtime's cffi declarations are parsed ahead of time (out-of-line ABI mode) into runtime/_cffi_*.py,
so loading a package never imports pycparser. These tests regenerate each module from its CDEF and compare:
a CDEF edit without regenerating fails here. UPDATE_GOLDEN=1 rewrites the modules."""

from __future__ import annotations

import os
from pathlib import Path

import cffi
import pytest
from aotc import cpu, cuda_driver

RUNTIME = Path(cpu.__file__).parent


def _generate(module: str, cdef: str, tmp: Path) -> str:
    ffi = cffi.FFI()
    ffi.cdef(cdef)
    ffi.set_source(f"aotc.{module}", None)
    out = tmp / f"{module}.py"
    ffi.emit_python_code(str(out))
    return out.read_text()


@pytest.mark.parametrize(("module", "cdef"), [("_cffi_cpu", cpu.CDEF), ("_cffi_cuda", cuda_driver.CDEF)])
def test_generated_ffi_matches_cdef(module: str, cdef: str, tmp_path: Path) -> None:
    text = _generate(module, cdef, tmp_path)
    path = RUNTIME / f"{module}.py"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
        return
    assert path.exists() and path.read_text() == text, f"{path} is stale: rerun with UPDATE_GOLDEN=1"


def test_loading_a_package_does_not_import_pycparser() -> None:
    import subprocess
    import sys

    code = "import sys, aotc.cpu, aotc.cuda_driver; aotc.cuda_driver.new_ffi(); print('pycparser' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"
