"""What a new user hits first: bad flags, paths and model files. Each gives one line (a syntax error: its
line and caret too), the documented exit code (README "Exit codes"), and never a traceback.

The table runs in-process through click's runner: flag and path checks run before torch is imported, and
the model-file cases that need torch share one import. One subprocess build proves a real terminal-less
build prints nothing but its result (torch's warnings hidden)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from aotc.cli import cli
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
MLP = str(ROOT / "examples" / "mlp.py")

MODELS = {
    "syntax.py": "import torch\nmodel = torch.nn.Linear(4, 4)\nx = [1, 2\n",
    "nomodel.py": "import torch\nexample_inputs = (torch.randn(2, 4),)\n",
    "notmodule.py": "import torch\nmodel = 3\nexample_inputs = (torch.randn(2, 4),)\n",
    "notensor.py": "import torch\nmodel = torch.nn.Linear(4, 4)\nexample_inputs = ([1.0, 2.0],)\n",
    "raises.py": "import torch\nraise RuntimeError('model weights not found')\n",
    "noimport.py": "import torch\nimport no_such_package_aotc\n",
    "ifdata.py": (
        "import torch\nclass M(torch.nn.Module):\n    def forward(self, x):\n        if x.sum() > 0:\n"
        "            return x * 2\n        return x - 1\nmodel = M()\nexample_inputs = (torch.randn(2, 4),)\n"
    ),
    "item.py": (
        "import torch\nclass M(torch.nn.Module):\n    def forward(self, x):\n        return x * x.max().item()\n"
        "model = M()\nexample_inputs = (torch.randn(2, 4),)\n"
    ),
    "cache.py": (
        "import torch\nclass DynamicCache:\n    def __init__(self, t):\n        self.t = t\n"
        "class M(torch.nn.Module):\n    def forward(self, x):\n        return x + 1, DynamicCache(x)\n"
        "model = M()\nexample_inputs = (torch.randn(2, 4),)\n"
    ),
    "model.txt": "not python\n",
}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, aotc_cache: Path) -> Path:
    import numpy as np

    d = tmp_path_factory.mktemp("cli_errors")
    for name, text in MODELS.items():
        (d / name).write_text(text)
    (d / "afile").write_text("x")
    (d / "adir").mkdir()
    np.save(d / "x64.npy", np.ones((4, 256)))
    np.save(d / "xint.npy", np.ones((4, 256), np.int32))
    np.save(d / "x.npy", np.ones((4, 256), np.float32))
    np.save(d / "short.npy", np.ones((4, 100), np.float32))
    np.save(d / "big.npy", np.ones((300, 256), np.float32))
    with pytest.MonkeyPatch.context() as mp:  # a package for the run/bench cases
        mp.setenv("AOTC_CACHE_DIR", str(aotc_cache))
        r = CliRunner().invoke(cli, ["build", MLP, "-o", str(d / "mlp.pkg"), "--quiet"])
    assert r.exit_code == 0, r.output
    return d


# (id, args with {d} the fixture folder and {mlp} examples/mlp.py, exit code, text the message must hold)
CASES = [
    ("model missing", ["build", "{d}/missing.py", "-o", "{d}/o.pkg"], 2, "no such file"),
    ("model is a dir", ["build", "{d}/adir", "-o", "{d}/o.pkg"], 2, "directory"),
    ("model not .py", ["build", "{d}/model.txt", "-o", "{d}/o.pkg"], 2, "not a .py (or .onnx) file"),
    ("no -o", ["build", "{mlp}"], 2, "Missing option '-o'"),
    ("no model arg", ["build"], 2, "Missing argument 'MODEL'"),
    ("-o into /sys", ["build", "{mlp}", "-o", "/sys/out.pkg"], 2, "cannot create files in /sys"),
    ("-o under a file", ["build", "{mlp}", "-o", "{d}/afile/out.pkg"], 2, "is a file, not a directory"),
    ("-o is a dir", ["build", "{mlp}", "-o", "{d}/adir"], 2, "directory"),
    ("--dynamic min>max", ["build", "{mlp}", "-o", "{d}/o.pkg", "--dynamic", "x:0:batch:64:1"], 2, "MIN 64 is greater than MAX 1"),
    ("--dynamic 2 parts", ["build", "{mlp}", "-o", "{d}/o.pkg", "--dynamic", "x:0"], 2, "INPUT:AXIS:LABEL"),
    ("--dynamic 4 parts", ["build", "{mlp}", "-o", "{d}/o.pkg", "--dynamic", "x:0:b:1"], 2, "INPUT:AXIS:LABEL:MIN:MAX"),
    ("--dynamic bad axis", ["build", "{mlp}", "-o", "{d}/o.pkg", "--dynamic", "x:a:b"], 2, "axis 'a'"),
    ("--dynamic bad label", ["build", "{mlp}", "-o", "{d}/o.pkg", "--dynamic", "x:0:1b"], 2, "label '1b'"),
    ("--dynamic negative", ["build", "{mlp}", "-o", "{d}/o.pkg", "--dynamic", "x:0:b:-1:4"], 2, "non-negative"),
    ("--dynamic max 1", ["build", "{mlp}", "-o", "{d}/o.pkg", "--dynamic", "x:0:b:1:1"], 2, "MAX 1 leaves nothing dynamic"),
    ("--dynamic twice", ["build", "{mlp}", "-o", "{d}/o.pkg", "--dynamic", "x:0:b", "--dynamic", "x:0:c"], 2, "already declared"),
    ("--dynamic axis 5", ["build", "{mlp}", "-o", "{d}/o.pkg", "--dynamic", "x:5:b:1:4"], 2, "has 2 axes"),
    ("--dynamic no input", ["build", "{mlp}", "-o", "{d}/o.pkg", "--dynamic", "y:0:b"], 2, "no input 'y'"),
    ("--dynamic range", ["build", "{mlp}", "-o", "{d}/o.pkg", "--dynamic", "x:0:b:16:64"], 2, "outside [16, 64]"),
    ("--target gpu", ["build", "{mlp}", "-o", "{d}/o.pkg", "--target", "gpu"], 2, "unknown target 'gpu'"),
    ("--target sm_99", ["build", "{mlp}", "-o", "{d}/o.pkg", "--target", "cuda:sm_99"], 2, "unknown CUDA target"),
    ("--target cpu level", ["build", "{mlp}", "-o", "{d}/o.pkg", "--target", "cpu:x86-64-v9"], 2, "unknown CPU target"),
    ("--precision fp8", ["build", "{mlp}", "-o", "{d}/o.pkg", "--precision", "fp8"], 2, "'fp8' is not one of"),
    ("unknown flag", ["build", "{mlp}", "-o", "{d}/o.pkg", "--bogus"], 2, "No such option '--bogus'"),
    ("unknown command", ["frobnicate"], 2, "No such command 'frobnicate'"),
    ("--keep-sources file", ["build", "{mlp}", "-o", "{d}/o.pkg", "--keep-sources", "{d}/afile"], 2, "is a file"),
    ("--quiet --verbose", ["build", "{mlp}", "-o", "{d}/o.pkg", "-q", "-v"], 2, "contradict"),
    ("no model entry", ["build", "{d}/nomodel.py", "-o", "{d}/o.pkg"], 2, "defines none of model, get_model"),
    ("model not a Module", ["build", "{d}/notmodule.py", "-o", "{d}/o.pkg"], 2, "not a torch.nn.Module"),
    ("input not a tensor", ["build", "{d}/notensor.py", "-o", "{d}/o.pkg"], 2, "aotc takes tensors only"),
    ("run missing pkg", ["run", "{d}/missing.pkg"], 2, "does not exist"),
    ("run bad --input", ["run", "{d}/missing.pkg", "-i", "x"], 2, ""),
    ("inspect not a pkg", ["inspect", "{d}/afile"], 3, ""),
    ("bench missing pkg", ["bench", "{d}/missing.pkg"], 2, "does not exist"),
    ("bench bad --shape", ["bench", "{d}/afile", "--shape", "x:8by128"], 2, "--shape"),
    ("run float64, no --cast", ["run", "{d}/mlp.pkg", "-i", "x={d}/x64.npy"], 5, "holds float64, the package takes float32"),
    ("bench float64, no --cast", ["bench", "{d}/mlp.pkg", "-i", "x={d}/x64.npy"], 5, "pass --cast"),
    ("run --cast int to float", ["run", "{d}/mlp.pkg", "-i", "x={d}/xint.npy", "--cast"], 5, "cannot cast int32 to float32"),
    ("run int, no --cast", ["run", "{d}/mlp.pkg", "-i", "x={d}/xint.npy"], 5, "got dtype int32, expected float32"),
    ("run wrong size", ["run", "{d}/mlp.pkg", "-i", "x={d}/short.npy"], 5, "axis 1: got size 100, expected 256"),
    ("run batch past range", ["run", "{d}/mlp.pkg", "-i", "x={d}/big.npy"], 5, "outside the range [1, 256]"),
    ("run unknown input", ["run", "{d}/mlp.pkg", "-i", "y={d}/x.npy"], 5, "unknown input 'y'"),
    ("run missing input", ["run", "{d}/mlp.pkg"], 5, "missing input 'x'"),
    ("run input not npy", ["run", "{d}/mlp.pkg", "-i", "x={d}/afile"], 2, "cannot read"),
    ("run -o missing dir", ["run", "{d}/mlp.pkg", "-i", "x={d}/x.npy", "-o", "{d}/nodir/o.npz"], 2, "does not exist"),
    ("run bad device", ["run", "{d}/mlp.pkg", "-i", "x={d}/x.npy", "--device", "tpu"], 2, "unknown device 'tpu'"),
    ("bench --threads 0", ["bench", "{d}/mlp.pkg", "--threads", "0"], 2, "--threads"),
    ("bench unknown --shape", ["bench", "{d}/mlp.pkg", "--shape", "y:4x256"], 2, "no input 'y'"),
]

# Model files whose message is several lines (cause, the user's line, the fix): the first line says what.
MULTILINE = [
    ("syntax error", "syntax.py", 2, ["SyntaxError: '[' was never closed", "x = [1, 2", "^"]),
    ("raises on import", "raises.py", 6, ["importing", "model weights not found", "raises.py:2"]),
    ("missing import", "noimport.py", 6, ["No module named 'no_such_package_aotc'"]),
    ("data-dependent if", "ifdata.py", 6, ["data-dependent", "ifdata.py:4", "torch.where", "torch.cond"]),
    (".item()", "item.py", 6, [".item()", "item.py:4", "keep the value a tensor"]),
    ("cache output", "cache.py", 6, ["cache object", "use_cache=False"]),
]


def _invoke(args: list[str], d: Path) -> tuple[int, str, str]:
    argv = [a.format(d=d, mlp=MLP) for a in args]
    r = CliRunner().invoke(cli, argv)
    assert r.exception is None or isinstance(r.exception, SystemExit), f"{argv}: {r.exception!r}"
    return r.exit_code, r.stdout, r.stderr


@pytest.mark.parametrize(("args", "code", "text"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_flag_one_line(files: Path, args: list[str], code: int, text: str) -> None:
    rc, out, err = _invoke(args, files)
    assert rc == code, err
    assert "Traceback" not in out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert text in lines[0]
    assert not out.strip(), out


@pytest.mark.parametrize(("name", "code", "texts"), [c[1:] for c in MULTILINE], ids=[c[0] for c in MULTILINE])
def test_bad_model_file(files: Path, name: str, code: int, texts: list[str]) -> None:
    rc, out, err = _invoke(["build", f"{{d}}/{name}", "-o", "{d}/o.pkg"], files)
    assert rc == code, err
    assert "Traceback" not in out + err and "Warning" not in err
    assert err.startswith("aotc: ") and len(err.strip().splitlines()) <= 6, err
    for t in texts:
        assert t in err, (t, err)


def test_case_table_is_big_enough() -> None:
    assert len(CASES) + len(MULTILINE) >= 25


def test_dynamic_without_range_builds_quietly(tmp_path: Path, aotc_cache: Path) -> None:
    """``--dynamic x:0:batch`` (the form the docs show) builds, and a build off a terminal prints only its
    result: no FutureWarning, no torch log lines, no progress."""
    out = tmp_path / "mlp.pkg"
    env = {**os.environ, "AOTC_CACHE_DIR": str(aotc_cache)}
    cmd = [sys.executable, "-c", "from aotc.cli import main; main()", "build", MLP, "-o", str(out), "--dynamic", "x:0:batch"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    assert p.returncode == 0, p.stderr
    assert p.stderr == "", p.stderr
    assert p.stdout.startswith(f"wrote {out}")
    r = CliRunner().invoke(cli, ["inspect", str(out)])
    assert "dimension batch in [1, inf]" in r.stdout and "s7" not in r.stdout, r.stdout
    assert "growing with the unbounded dimensions" in r.stdout


EMBED = """import torch
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(100, 16)
        self.fc = torch.nn.Linear(16, 4)
    def forward(self, input_ids):
        return self.fc(self.emb(input_ids))
torch.manual_seed(0)
model = M()
example_inputs = (torch.randint(0, 100, (2, 8)),)
"""


def test_token_ids_out_of_range_are_input_mismatch(tmp_path: Path, aotc_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An id past the vocabulary (or negative) is refused before the call, naming the input and the size."""
    import numpy as np

    monkeypatch.setenv("AOTC_CACHE_DIR", str(aotc_cache))
    (tmp_path / "emb.py").write_text(EMBED)
    pkg = tmp_path / "emb.pkg"
    r = CliRunner().invoke(cli, ["build", str(tmp_path / "emb.py"), "-o", str(pkg)])
    assert r.exit_code == 0, r.output
    for at, value in (((0, 2), 150), ((1, 5), -2)):
        ids = np.arange(16, dtype=np.int64).reshape(2, 8)
        ids[at] = value
        bad = f"value {value} at {list(at)}"
        np.save(tmp_path / "ids.npy", ids)
        r = CliRunner().invoke(cli, ["run", str(pkg), "-i", f"input_ids={tmp_path / 'ids.npy'}"])
        assert r.exit_code == 5, r.output
        assert bad in r.stderr and "input 'input_ids'" in r.stderr and "vocabulary size 100" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
    np.save(tmp_path / "ids.npy", np.full((2, 8), 99, np.int64))
    assert CliRunner().invoke(cli, ["run", str(pkg), "-i", f"input_ids={tmp_path / 'ids.npy'}"]).exit_code == 0
    import aotc
    from aotc.errors import InputMismatch

    with aotc.load(pkg) as model, pytest.raises(InputMismatch, match=r"value 100 at \[1, 0\].*vocabulary size 100"):
        model([[1] * 8, [100] + [1] * 7])  # ids as a list are checked too (after conversion), not only arrays
