"""``aotc bench`` and ``aotc doctor`` on the small affine package: the fields users read, JSON, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from aotc.bench import parse_shapes
from aotc.cli import cli
from aotc.schema import FORMAT_VERSION
from click.testing import CliRunner


def test_bench_selftest_inputs_text(make_package) -> None:
    r = CliRunner().invoke(cli, ["bench", str(make_package()), "--warmup", "2", "-n", "20"])
    assert r.exit_code == 0, r.output
    for field in ("load ", "first call ", "p50 ", "p90 ", "p99 ", "calls/s", "samples/s"):
        assert field in r.stdout, r.stdout
    assert "x: float32[5, 4]" in r.stdout  # the self-test's example inputs by default


def test_bench_shape_json_threads(make_package) -> None:
    r = CliRunner().invoke(
        cli, ["bench", str(make_package()), "--shape", "x:32x4", "--shape", "scale:32", "--threads", "1", "-n", "10", "--json"]
    )
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["inputs"] == {"x": "float32[32, 4]", "scale": "float32[32]"} and d["threads"] == 1 and d["iterations"] == 10
    assert 0 < d["p50_ms"] <= d["p90_ms"] <= d["p99_ms"] and d["samples_per_s"] == 32 * d["calls_per_s"]
    assert d["warning"] is None or "too wide to trust" in d["warning"]


def test_bench_given_input_and_refusals(make_package, tmp_path: Path) -> None:
    pkg = str(make_package())
    np.save(tmp_path / "x.npy", np.ones((3, 4), np.float32))
    np.save(tmp_path / "s.npy", np.ones(3, np.float32))
    r = CliRunner().invoke(cli, ["bench", pkg, "-i", f"x={tmp_path / 'x.npy'}", "-i", f"scale={tmp_path / 's.npy'}", "-n", "5", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["inputs"]["x"] == "float32[3, 4]"
    for args, code, text in (
        (["--shape", "y:3x4"], 2, "no input 'y'"),
        (["--shape", "x:100x4"], 5, "batch"),  # past the declared range [1, 64]
        (["--iterations", "0"], 2, "--iterations"),
    ):
        r = CliRunner().invoke(cli, ["bench", pkg, *args])
        assert r.exit_code == code, (args, r.output)
        assert text in r.stderr and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.output


def test_parse_shapes() -> None:
    assert parse_shapes(("x:8x128", "m:4")) == {"x": (8, 128), "m": (4,)}


def test_doctor_text_and_json(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("AOTC_CACHE_DIR", str(tmp_path / "cache"))
    r = CliRunner().invoke(cli, ["doctor"])
    assert r.exit_code == 0, r.output
    for what in ("aotc", "cpu", "openmp", "compiler", "torch", "triton", "signatures", "cache"):
        assert any(ln.split()[1:2] == [what] for ln in r.stdout.splitlines()), (what, r.stdout)
    assert f"package format version {FORMAT_VERSION}" in r.stdout and str(tmp_path / "cache") in r.stdout
    checks = json.loads(CliRunner().invoke(cli, ["doctor", "--json"]).stdout)
    assert all(c["status"] in ("ok", "missing", "note") for c in checks)
    assert all(c["fix"] for c in checks if c["status"] == "missing")


def test_version_names_the_format() -> None:
    r = CliRunner().invoke(cli, ["--version"])
    assert r.exit_code == 0 and f"package format version {FORMAT_VERSION}" in r.stdout


def test_doctor_lists_gpus_through_a_fake_driver(fake) -> None:
    from aotc.doctor import diagnose

    checks = {c.what: c for c in diagnose(None)}
    assert checks["cuda driver"].status == "ok" and "GPU(s)" in checks["cuda driver"].detail
    gpu = checks["gpu 0"]
    assert gpu.status == "ok" and "--target cuda:sm_" in gpu.detail


def test_doctor_says_whether_linux_enables_amx(monkeypatch) -> None:
    """Where the CPU lists AMX, doctor says whether the kernel enables its tile data (the bf16 matmuls need
    it); the answer here matches what the kernel reports, and a refused syscall reads as a note with a fix."""
    from aotc import doctor

    monkeypatch.setattr(doctor, "cpu_flags", lambda: frozenset({"avx512f", "amx_tile", "amx_bf16"}))
    (amx,) = [c for c in doctor._cpu() if c.what == "amx"]
    assert amx.status in ("ok", "note") and ("tile data" in amx.detail or "does not enable" in amx.detail)

    class NoLibc:
        def __init__(self, *a: object, **k: object) -> None:
            raise OSError("no libc")

    monkeypatch.setattr(doctor.ctypes, "CDLL", NoLibc)
    refused = doctor._amx()
    assert refused.status == "note" and "5.16" in refused.fix
    monkeypatch.setattr(doctor, "cpu_flags", lambda: frozenset({"avx512f"}))
    assert not [c for c in doctor._cpu() if c.what == "amx"]
