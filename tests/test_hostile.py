"""Hostile packages and inputs: each case runs the real CLI (or a few lines of API use) in its own process.

Every case must end with its exact exit code and one line on stderr (``aotc: ErrorType: ...``): never a
crash, a hang or a traceback. The package's library is built with -DMARK_LOAD, whose constructor leaves a
file: for every refusal of a package, the file must not exist, proving that no package code ran first.
The threat model and the exit codes are in docs/safety.md.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from affine_pkg import B, W, affine_manifest, reference
from aotc.package import read_entries
from aotc_build import package as wpkg
from aotc_build.package import member_hashes, selftest_member, weights_member, write_package

LIB = "cpu/x86-64-v2/model.so"
CUBIN = "cuda/sm_90/k0.cubin"
TIMEOUT = 60


# ---- helpers ---------------------------------------------------------------------------------------------


def run_cli(*args: str, marker: Path | None = None, stdin: Any = subprocess.DEVNULL) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AOTC_TEST_LOADED": str(marker or "/nonexistent/x")}
    cmd = [sys.executable, "-c", "from aotc.__main__ import main; main()", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=TIMEOUT, stdin=stdin, check=False)


def run_many(cases: list[tuple[list[str], Path | None]]) -> list[subprocess.CompletedProcess[str]]:
    """Each (args, marker) case run like ``run_cli``, each in its own forked process (tests/fork_cli.py):
    a crash or hang still shows in that case alone, at a fork's cost instead of an interpreter's start."""
    todo = [{"args": a, "env": {"AOTC_TEST_LOADED": str(m or "/nonexistent/x")}} for a, m in cases]
    r = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("fork_cli.py"))],
        input=json.dumps(todo), capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    return [
        subprocess.CompletedProcess(c["args"], x["rc"], x["stdout"], x["stderr"]) for c, x in zip(todo, json.loads(r.stdout), strict=True)
    ]


def assert_refused(r: subprocess.CompletedProcess[str], code: int, pattern: str) -> None:
    """Exit ``code``, stderr one line ``aotc: <message matching pattern>``, no traceback."""
    lines = r.stderr.strip().splitlines()
    assert r.returncode == code, f"exit {r.returncode}, want {code}: {r.stderr[-2000:]}"
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("aotc: "), r.stderr[-2000:]
    import re

    assert re.search(pattern, lines[0]), f"{pattern!r} not in {lines[0]!r}"


def raw_parts(path: Path) -> tuple[dict, dict[str, bytes]]:
    with zipfile.ZipFile(path) as z:
        return json.loads(z.read("manifest.json")), {n: z.read(n) for n in z.namelist() if n != "manifest.json"}


def write_raw(path: Path, manifest: dict | str | bytes, members: dict[str, bytes]) -> Path:
    """A package with any manifest text (the ZIP CRCs recomputed, as a forger would), bypassing validation."""
    text = manifest if isinstance(manifest, str | bytes) else json.dumps(manifest)
    raw = text.encode() if isinstance(text, str) else text
    wpkg._write_atomic(path, wpkg._layout([("manifest.json", raw), *sorted(members.items())]))
    return path


def rehash(d: dict, members: dict[str, bytes]) -> dict:
    """The manifest's member table as a forger who also edits members would write it."""
    d["members"] = {n: json.loads(json.dumps(wpkg.dataclasses.asdict(member_hashes(b)))) for n, b in sorted(members.items())}
    return d


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory, compile_lib: Callable[..., bytes]) -> Path:
    """The affine package with a self-test, its library marking its load, plus a (never runnable here)
    CUDA target whose cubin is a few bytes: enough for the loader to hash, choose and fall back."""
    work = tmp_path_factory.mktemp("hostile")
    m = affine_manifest()
    _, wblob = weights_member([("W", W), ("b", B)])
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    scale = rng.standard_normal(5).astype(np.float32)
    y, relu = reference(x, scale)
    st, blob = selftest_member([("x", x), ("scale", scale)], [("y", y), ("relu", relu)], 1e-5, 1e-6)
    members = {"weights.safetensors": wblob, LIB: compile_lib("MARK_LOAD"), "selftest.safetensors": blob}
    path = write_package(work / "base.pkg", wpkg.dataclasses.replace(m, selftest=st), members)
    d, got = raw_parts(work / "base.pkg")
    del path
    d["targets"].append(
        {"kind": "cuda", "arch": "sm_90", "triton_version": "3.6.0", "ptxas_version": "12.8", "min_driver": 12080,
         "precision": "fp32", "arena_bytes": 0, "arena": [], "launches": [],
         "kernels": [{"name": "k0", "member": CUBIN, "num_warps": 4, "shared": 0,
                      "params": [{"kind": "global_scratch", "bytes": 8}]}]}
    )  # fmt: skip
    got[CUBIN] = b"\x7fELF" + bytes(60)
    write_raw(work / "base.pkg", rehash(d, got), got)
    np.save(work / "x.npy", x)
    np.save(work / "scale.npy", scale)
    return work / "base.pkg"


def cpu_target(d: dict) -> dict:
    return d["targets"][0]


# ---- bad packages: (id, edit of (manifest dict, members), exit code, message pattern) --------------------

Edit = Callable[[dict, dict[str, bytes]], Any]


def _set(path: str, value: Any) -> Edit:
    """An edit setting the manifest field at a dotted path (``targets.0.arena_bytes``)."""

    def edit(d: dict, members: dict[str, bytes]) -> None:
        *head, last = path.split(".")
        node: Any = d
        for k in head:
            node = node[int(k)] if isinstance(node, list) else node[k]
        node[int(last) if isinstance(node, list) else last] = value

    return edit


def _members(fn: Callable[[dict[str, bytes]], None], rehashed: bool = False) -> Edit:
    def edit(d: dict, members: dict[str, bytes]) -> None:
        fn(members)
        if rehashed:
            rehash(d, members)

    return edit


def _flip(name: str, at: int = 100) -> Callable[[dict[str, bytes]], None]:
    def fn(members: dict[str, bytes]) -> None:
        b = bytearray(members[name])
        b[min(at, len(b) - 1)] ^= 1
        members[name] = bytes(b)

    return fn


def _text(text: str | bytes) -> Edit:
    def edit(d: dict, members: dict[str, bytes]) -> str | bytes:
        return text

    return edit


def _deep_header(members: dict[str, bytes]) -> None:
    head = b"[" * 100_000 + b"]" * 100_000
    members["weights.safetensors"] = len(head).to_bytes(8, "little") + head


LIE = "built for another interface than its manifest describes"
BAD = r"PackageCorrupt: manifest field"
PACKAGES: list[tuple[str, Edit, int, str]] = [
    # manifest lies about sizes: refused by the library's own interface record before dlopen
    ("arena_zero", _set("targets.0.arena_bytes", 0), 3, f"{LIE}: its arena_bytes"),
    ("arena_too_small", _set("targets.0.arena_bytes", "s0"), 3, LIE),
    ("output_smaller", _set("outputs.0.shape", ["s0", 1]), 3, f"{LIE}: its outputs"),
    ("output_dtype", _set("outputs.1.dtype", "float16"), 3, LIE),
    ("batch_fixed_1", _set("inputs.0.shape", [1, 4]), 3, f"{LIE}: its inputs"),
    ("input_shape", _set("inputs.0.shape", ["s0", 2]), 3, f"{LIE}: its inputs"),
    ("weight_shape", _set("weights.tensors.0.shape", [2, 3]), 3, r"weight 'W' is float32\[4, 3\]"),
    ("range_max_raised", _set("symbols.0.max", 100000), 3, f"{LIE}: its symbols"),
    ("range_unbounded", _set("symbols.0.max", None), 3, LIE),
    ("range_absurd", _set("symbols.0.max", 10**15), 3, "past 2\\*\\*40"),
    ("range_huge_int", _set("symbols.0.max", 10**40), 3, BAD),
    ("level_forged_up", _set("targets.0.level", "x86-64-v3"), 3, r"x86-64-v3 needs avx|another interface"),
    ("features_forged_empty", _set("targets.0.features", []), 3, r"features.*level x86-64-v2 needs"),
    ("features_forged_short", _set("targets.0.features", ["sse4_2"]), 3, "needs"),
    ("abi_forged", _set("targets.0.abi_version", 7), 4, "ABI version 7"),
    # size expressions: bounded, never a traceback
    ("expr_overflow", _set("targets.0.arena_bytes", "s0*" + "99999999999*" * 8 + "1"), 3, "no buffer can be"),
    ("expr_div_zero", _set("targets.0.arena_bytes", "s0//0"), 3, "division by zero"),
    ("expr_mod_zero", _set("targets.0.arena_bytes", "Mod(s0, s0-s0)"), 3, "division by zero"),
    ("expr_ceildiv_zero", _set("outputs.0.shape", ["CeilDiv(s0, 0)", 3]), 3, "division by zero"),
    ("expr_negative", _set("outputs.0.shape", ["s0-100", 3]), 3, "no buffer can be"),
    ("expr_long", _set("targets.0.arena_bytes", "s0+" * 3000 + "1"), 3, "over the 4096 limit"),
    ("expr_deep_parens", _set("targets.0.arena_bytes", "(" * 1000 + "s0" + ")" * 1000), 3, BAD),
    ("expr_deep_unary", _set("targets.0.arena_bytes", "-" * 4000 + "s0"), 3, BAD),
    ("expr_deep_chain", _set("targets.0.arena_bytes", "s0" + "+s0" * 1000), 3, "nests deeper"),
    ("expr_call_chain", _set("targets.0.arena_bytes", "Max(" * 300 + "s0" + ",1)" * 300), 3, BAD),
    ("expr_python", _set("targets.0.arena_bytes", "__import__('os').system('true')"), 3, "outside the grammar"),
    ("expr_big_const", _set("targets.0.arena_bytes", "9" * 4000), 3, BAD),
    ("expr_nul", _set("targets.0.arena_bytes", "s0\x00"), 3, BAD),
    ("expr_float", _set("targets.0.arena_bytes", "s0*1.5"), 3, "outside the grammar"),
    ("static_dim_huge", _set("outputs.0.shape", ["s0", 2**62]), 3, "no buffer can be"),
    ("static_dim_past_int64", _set("outputs.0.shape", ["s0", 2**70]), 3, "over the 2\\*\\*62 limit"),
    ("rank_huge", _set("outputs.0.shape", [1] * 100), 3, "rank 100"),
    ("negative_size", _set("outputs.0.shape", ["s0", -3]), 3, "negative size"),
    ("bool_size", _set("outputs.0.shape", ["s0", True]), 3, BAD),
    # manifest JSON
    ("json_deep", _text("[" * 100_000 + "]" * 100_000), 3, "nested too deeply"),
    ("json_deep_object", _text('{"a":' * 50_000 + "1" + "}" * 50_000), 3, "nested too deeply"),
    ("json_duplicate_key", lambda d, m: json.dumps(d)[:-1] + ', "format": "aotc"}', 3, "duplicate key 'format'"),
    ("json_nan_atol", _set("selftest.atol", float("nan")), 3, "NaN is not a JSON number"),
    ("json_infinity_atol", _set("selftest.atol", float("inf")), 3, "Infinity is not a JSON number"),
    ("atol_absurd", _set("selftest.atol", 1e9), 3, "bad tolerances"),
    ("rtol_negative", _set("selftest.rtol", -1.0), 3, "bad tolerances"),
    ("json_not_utf8", _text(b"\xff\xfe{}"), 3, "not valid JSON"),
    ("json_garbage", _text("not json"), 3, "not valid JSON"),
    ("json_array", _text("[]"), 3, "not an aotc package"),
    ("json_empty", _text(""), 3, "not valid JSON"),
    ("format_other", _set("format", "onnx"), 3, "not an aotc package"),
    ("format_newer", _set("format_version", 99), 4, "upgrade the runtime"),
    ("format_older", _set("format_version", 3), 4, "rebuild the package"),
    ("format_version_str", _set("format_version", "4"), 3, "expected an integer"),
    ("unknown_field", _set("surprise", 1), 3, "unknown field"),
    ("missing_field", lambda d, m: d.pop("inputs"), 3, "'inputs': missing"),
    ("wrong_type", _set("inputs", {}), 3, "expected a list"),
    ("dtype_unknown", _set("inputs.0.dtype", "complex64"), 3, "unknown dtype"),
    ("symbol_name_code", _set("symbols.0.name", "os.system"), 3, "not an identifier"),
    ("duplicate_input", lambda d, m: d["inputs"].append(d["inputs"][0]), 3, "duplicate name"),
    ("unknown_kind", _set("targets.1.kind", "tpu"), 3, "unknown kind"),
    ("cuda_arch_bad", _set("targets.1.arch", "sm_9x"), 3, "not of the form"),
    ("cuda_param_width", _set("targets.1.kernels.0.params.0.bytes", 4), 3, "not a known parameter"),
    ("cuda_warps_zero", _set("targets.1.kernels.0.num_warps", 0), 3, "at least 1"),
    ("glibc_bad", _set("targets.0.min_glibc", "2.x"), 3, "glibc version"),
    ("glibc_future", _set("targets.0.min_glibc", "9.99"), 4, "needs glibc 9.99"),
    # members: hashes, names, listing
    ("so_flipped", _members(_flip(LIB, 5000)), 3, "model.so' has sha256"),
    ("so_flipped_header", _members(_flip(LIB, 0)), 3, "model.so' has sha256"),
    ("selftest_flipped", _members(_flip("selftest.safetensors")), 3, "selftest.safetensors' has sha256"),
    ("weights_flipped", _members(_flip("weights.safetensors", 200)), 3, "weights.safetensors' has sha256"),
    ("cubin_flipped", _members(_flip(CUBIN, 10)), 3, "k0.cubin' has sha256"),
    (
        "so_no_record",
        _members(lambda m: m.update({LIB: m[LIB].replace(b"aotc-interface-1:", b"aotc-interface-0:")}), True),
        3,
        "no single aotc interface record",
    ),  # fmt: skip
    ("so_two_records", _members(lambda m: m.update({LIB: m[LIB] + b"aotc-interface-1:{}\0"}), True), 3, "no single"),
    ("so_record_lies", _members(lambda m: m.update({LIB: m[LIB].replace(b'"s0*12"', b'"s0*99"')}), True), 3, LIE),
    ("so_garbage_rehashed", _members(lambda m: m.update({LIB: b"\x7fELF" + bytes(5000)}), True), 3, "no single aotc"),
    ("member_unlisted", _members(lambda m: m.update({"extra.bin": b"x"})), 3, "not listed in the manifest"),
    ("member_missing", _members(lambda m: m.pop("selftest.safetensors")), 3, "listed in the manifest but missing"),
    ("member_size_lie", lambda d, m: d["members"]["weights.safetensors"].update(size=1), 3, "the manifest says 1"),
    ("member_sha_short", lambda d, m: d["members"][LIB].update(sha256="ab"), 3, "not a lowercase hex"),
    ("member_chunks_forged", lambda d, m: d["members"][LIB].update(chunks=["0" * 64]), 3, "chunk hashes"),
    ("member_traversal", lambda d, m: d["members"].update({"../x": d["members"][LIB]}), 3, "unsafe"),
    ("member_absolute", _set("targets.0.library", "/etc/passwd"), 3, "unsafe"),
    ("weights_deep_header", _members(_deep_header, True), 3, "nested too deeply"),
    (
        "weights_header_dup",
        _members(lambda m: m.update({"weights.safetensors": b"\x0e" + bytes(7) + b'{"a":1,"a":2}\n'}), True),
        3,
        "duplicate key",
    ),  # fmt: skip
]


@pytest.fixture(scope="module")
def refusals(base: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[subprocess.CompletedProcess[str], Path]]:
    """``aotc verify`` of every bad package, each in its own process: result and load marker by case name."""
    work = tmp_path_factory.mktemp("bad")
    cases = []
    for name, edit, _, _ in PACKAGES:
        d, members = raw_parts(base)
        text = edit(d, members)
        path = write_raw(work / f"{name}.pkg", text if isinstance(text, str | bytes) else d, members)
        cases.append((["verify", str(path)], work / f"{name}.loaded"))
    results = run_many(cases)
    return {c[0]: (r, m) for c, r, (_, m) in zip(PACKAGES, results, cases, strict=True)}


@pytest.mark.parametrize("case", PACKAGES, ids=[c[0] for c in PACKAGES])
def test_bad_package(case: tuple[str, Edit, int, str], refusals: dict) -> None:
    name, _, code, pattern = case
    r, marker = refusals[name]
    assert_refused(r, code, pattern)
    assert marker is not None and not marker.exists(), "package code ran before the refusal"


def test_base_package_runs_and_marks(base: Path, tmp_path: Path) -> None:
    """The control: the untouched package verifies (its CUDA target falls back to the CPU) and its code runs."""
    marker = tmp_path / "loaded"
    r = run_cli("verify", str(base), marker=marker)
    assert r.returncode == 0, r.stderr
    assert "ok" in r.stdout and marker.exists()


# ---- paths that are not package files --------------------------------------------------------------------


def test_package_paths(base: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "empty.pkg").write_bytes(b"")
    (tmp_path / "junk.pkg").write_bytes(os.urandom(4096))
    (tmp_path / "half.pkg").write_bytes(base.read_bytes()[: base.stat().st_size // 2])
    cases = [
        (str(fifo), 2, "not a regular file"),
        ("/dev/stdin", 2, "not a regular file"),
        ("/dev/zero", 2, "not a regular file"),
        ("/proc/self/status", 3, "empty file"),
        ("/proc/self/mem", 3, "empty file|cannot"),
        (str(tmp_path), 2, "is a directory"),
        (str(tmp_path / "missing.pkg"), 2, "does not exist"),
        (str(tmp_path / "empty.pkg"), 3, "empty file"),
        (str(tmp_path / "junk.pkg"), 3, "no ZIP end"),
        (str(tmp_path / "half.pkg"), 3, "PackageCorrupt"),
    ]
    results = run_many([(["run", path], None) for path, _, _ in cases] + [(["inspect", str(fifo)], None)])
    for (_, code, pattern), r in zip([*cases, ("", 2, "not a regular file")], results, strict=True):
        assert_refused(r, code, pattern)


# ---- bad inputs and outputs of `aotc run` ----------------------------------------------------------------


def _npy_header(shape: tuple[int, ...], descr: str = "<f4") -> bytes:
    header = repr({"descr": descr, "fortran_order": False, "shape": shape}).encode()
    header += b" " * (-(10 + len(header) + 1) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header


def test_bad_inputs(base: Path, tmp_path: Path) -> None:
    x, scale = str(base.parent / "x.npy"), str(base.parent / "scale.npy")
    files = {
        "huge.npy": _npy_header((1 << 40, 4)) + bytes(64),
        "empty.npy": b"",
        "short.npy": _npy_header((5, 4)) + bytes(16),
        "long.npy": _npy_header((5, 4)) + bytes(200),
        "magic.npy": b"NOTNUMPY" + bytes(100),
        "header.npy": b"\x93NUMPY\x01\x00\xff\xff" + b"{" * 100,
        "pickle.npy": _npy_header((2,), "|O") + bytes(16),
        "neg.npy": _npy_header((-5, 4)) + bytes(16),
        "v9.npy": b"\x93NUMPY\x09\x00" + bytes(100),
    }
    for n, b in files.items():
        (tmp_path / n).write_bytes(b)
    np.save(tmp_path / "f64.npy", np.zeros((5, 4)))
    np.save(tmp_path / "big_batch.npy", np.zeros((65, 4), np.float32))
    np.save(tmp_path / "rank3.npy", np.zeros((5, 4, 1), np.float32))
    np.save(tmp_path / "cols.npy", np.zeros((5, 5), np.float32))
    np.save(tmp_path / "zero_batch.npy", np.zeros((0, 4), np.float32))
    np.savez(tmp_path / "arch.npz", x=np.zeros(3))
    fifo = tmp_path / "fifo.npy"
    os.mkfifo(fifo)
    t = str(tmp_path)
    cases = [
        ([f"x={t}/huge.npy", f"scale={scale}"], 2, r"header says float32\[1099511627776, 4\]"),
        ([f"x={t}/empty.npy", f"scale={scale}"], 2, "cannot read"),
        ([f"x={t}/short.npy", f"scale={scale}"], 2, "the file holds 16"),
        ([f"x={t}/long.npy", f"scale={scale}"], 2, "the file holds 200"),
        ([f"x={t}/magic.npy", f"scale={scale}"], 2, "cannot read"),
        ([f"x={t}/header.npy", f"scale={scale}"], 2, "cannot read"),
        ([f"x={t}/pickle.npy", f"scale={scale}"], 2, "Python objects"),
        ([f"x={t}/neg.npy", f"scale={scale}"], 2, "cannot read"),
        ([f"x={t}/v9.npy", f"scale={scale}"], 2, "cannot read"),
        ([f"x={t}/arch.npz", f"scale={scale}"], 2, "cannot read"),
        ([f"x={fifo}", f"scale={scale}"], 2, "not a regular file"),
        ([f"x={t}/missing.npy", f"scale={scale}"], 2, "No such file"),
        ([f"x={t}", f"scale={scale}"], 2, "not a regular file|Is a directory"),
        ([f"x={t}/f64.npy", f"scale={scale}"], 5, "holds float64, the package takes float32.*--cast"),
        ([f"x={t}/big_batch.npy", f"scale={scale}"], 5, "outside the range"),
        ([f"x={t}/zero_batch.npy", f"scale={scale}"], 5, "outside the range"),
        ([f"x={t}/rank3.npy", f"scale={scale}"], 5, "got rank 3"),
        ([f"x={t}/cols.npy", f"scale={scale}"], 5, "axis 1: got size 5, expected 4"),
        ([f"x={x}"], 5, "missing input 'scale'"),
        ([f"x={x}", f"scale={scale}", f"z={x}"], 5, "unknown input 'z'"),
        ([f"x={x}", f"x={x}", f"scale={scale}"], 5, "given twice"),
        (["x", f"scale={scale}"], 2, "use NAME=FILE.npy"),
        ([f"=x{x}"], 2, "use NAME=FILE.npy"),
    ]
    results = run_many([(["run", str(base), *(a for i in inputs for a in ("--input", i))], None) for inputs, _, _ in cases])
    for (_, code, pattern), r in zip(cases, results, strict=True):
        assert_refused(r, code, pattern)


def test_bad_options_and_outputs(base: Path, tmp_path: Path) -> None:
    ins = ["--input", f"x={base.parent / 'x.npy'}", "--input", f"scale={base.parent / 'scale.npy'}"]
    marker = tmp_path / "loaded"
    out = tmp_path / "result"
    cases = [
        (["--threads", "100000"], 2, "num_threads must be an int from 0 to 1024"),
        (["--threads", "-1"], 2, "num_threads"),
        (["--threads", "x"], 2, "--threads"),
        (["--device", "tpu"], 2, "unknown device"),
        (["--output", str(tmp_path / "no" / "such" / "out.npz")], 2, "does not exist"),
        (["--output", str(tmp_path)], 2, "is a directory"),
    ]
    results = run_many(
        [(["run", str(base), *ins, *args], marker) for args, _, _ in cases] + [(["run", str(base), *ins, "--output", str(out)], None)]
    )
    for (args, code, pattern), r in zip(cases, results, strict=False):
        if args[1] == "x":  # click's own parse error: exit 2 and its usage text
            assert r.returncode == 2 and "Traceback" not in r.stderr and pattern in r.stderr
            continue
        assert_refused(r, code, pattern)
    assert not marker.exists(), "the model ran before a refusal that needs no model"
    # --output names the file written, exactly, and nothing else is left beside it
    r = results[-1]
    assert r.returncode == 0 and f"wrote {out}" in r.stdout, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result"]
    with np.load(out) as z:
        assert sorted(z.files) == ["relu", "y"]


API = """
import sys, numpy as np, aotc
from aotc.errors import AotcError
pkg = sys.argv[1]
def check(what, fn, kind):
    try:
        fn()
    except AotcError as e:
        assert type(e).__name__ == kind, (what, type(e).__name__, e)
        assert "\\n" not in str(e), (what, e)
        return
    raise AssertionError(f"{what}: no error")
x, s = np.zeros((3, 4), np.float32), np.ones(3, np.float32)
m = aotc.load(pkg, device="cpu")
check("run(list)", lambda: m.run([x, s]), "InputMismatch")
check("run(None)", lambda: m.run(None), "InputMismatch")
check("call(None)", lambda: m(None, s), "InputMismatch")
check("call(3 args)", lambda: m(x, s, x), "InputMismatch")
check("call(str)", lambda: m("abc", s), "InputMismatch")
check("load(None)", lambda: aotc.load(None), "UsageError")
check("load(3)", lambda: aotc.load(3), "UsageError")
check("device=None", lambda: aotc.load(pkg, device=None), "UsageError")
check("threads str", lambda: aotc.load(pkg, device="cpu", num_threads="4"), "UsageError")
check("threads huge", lambda: aotc.load(pkg, device="cpu", num_threads=100000), "UsageError")
check("threads float", lambda: aotc.load(pkg, device="cpu", num_threads=2.5), "UsageError")
check("threads bool", lambda: aotc.load(pkg, device="cpu", num_threads=True), "UsageError")
y, relu = m(x, s)
m.close()
check("closed", lambda: m(x, s), "UsageError")
print("api ok")
"""


def test_api_misuse_is_typed(base: Path) -> None:
    r = subprocess.run([sys.executable, "-c", API, str(base)], capture_output=True, text=True, timeout=TIMEOUT, check=False)
    assert r.returncode == 0 and "api ok" in r.stdout, r.stderr[-3000:]


INTERRUPT = """
import sys, aotc.cli
def interrupted(*a, **k):
    raise KeyboardInterrupt
aotc.cli.load = interrupted
sys.argv = ["aotc", "verify", sys.argv[1]]
aotc.cli.main()
"""


def test_ctrl_c_exits_130_in_one_line(base: Path) -> None:
    r = subprocess.run([sys.executable, "-c", INTERRUPT, str(base)], capture_output=True, text=True, timeout=TIMEOUT, check=False)
    assert r.returncode == 130 and r.stderr.strip() == "aotc: interrupted", r.stderr[-2000:]


def test_ctrl_c_while_the_command_starts(tmp_path: Path) -> None:
    """Ctrl-C while the CLI's imports run (numpy, click): the entry point still says it in one line."""
    code = (
        "import builtins, sys\nreal = builtins.__import__\n"
        "def imp(name, *a, **k):\n    if name == 'click': raise KeyboardInterrupt\n    return real(name, *a, **k)\n"
        "builtins.__import__ = imp\nfrom aotc.__main__ import main\nmain()\n"
    )
    r = subprocess.run([sys.executable, "-c", code, "--help"], capture_output=True, text=True, timeout=TIMEOUT, check=False)
    assert r.returncode == 130 and r.stderr.strip() == "aotc: interrupted", r.stderr[-2000:]


def test_sigint_during_a_run(base: Path, tmp_path: Path) -> None:
    """A real SIGINT while the CLI works: 130 or a finished run, never a traceback or a partial --output."""
    out = tmp_path / "o.npz"
    ins = ["--input", f"x={base.parent / 'x.npy'}", "--input", f"scale={base.parent / 'scale.npy'}"]
    cmd = [sys.executable, "-c", "from aotc.__main__ import main; main()", "run", str(base), *ins, "--output", str(out)]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    import time

    time.sleep(0.3)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=TIMEOUT)
    assert p.returncode in (0, 130, -signal.SIGINT), err  # -SIGINT: before Python set up its handler
    assert "Traceback" not in err, err
    if p.returncode == 130:
        assert err.strip() == "aotc: interrupted"
    assert [q.name for q in tmp_path.iterdir()] in ([], ["o.npz"])


def test_every_package_case_is_distinct() -> None:
    assert len({c[0] for c in PACKAGES}) == len(PACKAGES) >= 70


def test_stale_temp_files_of_killed_writers_are_removed(tmp_path: Path) -> None:
    out = tmp_path / "m.pkg"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    stale = tmp_path / f".m.pkg.{dead.stdout.strip()}.0123456789ab.tmp"
    alive = tmp_path / f".m.pkg.{os.getpid()}.0123456789ab.tmp"
    stale.write_bytes(b"partial")
    alive.write_bytes(b"in progress")
    wpkg._write_atomic(out, [b"new"])
    assert out.read_bytes() == b"new" and not stale.exists() and alive.exists()


def test_entries_checked_against_file(base: Path) -> None:
    """read_entries on the raw file agrees with the manifest (a sanity check of the helpers above)."""
    entries = read_entries(base.read_bytes(), base)
    d, _ = raw_parts(base)
    assert set(entries) - {"manifest.json"} == set(d["members"])


def test_fuzzed_packages_never_crash(base: Path) -> None:
    """A short seeded run of tests/fuzz_packages.py; AOTC_FUZZ_CASES and AOTC_FUZZ_SEED make it the long run
    (10,000 cases: see docs/safety.md), whose summary ``pytest -s`` prints."""
    n, seed = os.environ.get("AOTC_FUZZ_CASES", "150"), os.environ.get("AOTC_FUZZ_SEED", "12")
    r = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("fuzz_packages.py")), str(base), n, seed],
        capture_output=True, text=True, timeout=600 + 2 * int(n), check=False,
    )  # fmt: skip
    print(r.stdout[-4000:])
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
