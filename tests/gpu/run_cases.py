"""Run GPU test cases built by ``build_artifacts.py`` with nothing but numpy, cffi and libcuda.

    python tests/gpu/run_cases.py ARTIFACTS CASE [CASE ...]

Each case runs in its own process (the pytest side starts one per case), because a case that faults on
purpose leaves CUDA unusable in its process. torch and triton are blocked before anything is imported:
the run proves the runtime needs neither. Prints one JSON line per case.
"""

from __future__ import annotations

import dataclasses
import importlib.abc
import json
import sys
import traceback
from pathlib import Path
from typing import Any


class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> None:
        if name.split(".", maxsplit=1)[0] in ("torch", "triton", "aotc_build"):
            raise ImportError(f"{name} must not be imported by the aotc runtime")


sys.meta_path.insert(0, _Block())
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _paths import ensure_importable  # noqa: E402

ensure_importable()

import numpy as np  # noqa: E402
from aotc import cuda, cuda_ptx, schema  # noqa: E402
from aotc.errors import DeviceError, IncompatiblePackage, PackageCorrupt  # noqa: E402


def package(case_dir: Path, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """The whole user path: aotc.load picks the CUDA target, verify() runs the self-test, then a call."""
    import aotc

    out: dict[str, Any] = {"checks": []}
    for device in ("cuda", "auto"):
        m = aotc.load(case_dir / "model.pkg", device=device)
        out[f"{device}_target"] = f"{m.device} {m.target}"
        out["verify"] = [c.ok for c in m.verify()]
        for i in range(len(meta["trials"])):
            got = m.run({s.name: arrays[f"in{i}:{s.name}"] for s in m.inputs})
            for name, g in got.items():
                c = compare(g, arrays[f"ref{i}:{name}"], meta["rtol"] + 1e-5, meta["atol"] + 1e-5)
                out["checks"].append(dict(c, trial=i, output=name, device=device))
        m.close()
    out["ok"] = all(out["verify"]) and all(c["ok"] for c in out["checks"]) and out["cuda_target"].startswith("cuda:0")
    return out


def load(case_dir: Path) -> tuple[schema.Manifest | None, dict[str, Any], dict[str, np.ndarray]]:
    meta = json.loads((case_dir / "case.json").read_text())
    m = schema.from_json((case_dir / "manifest.json").read_text()) if meta["kind"] != "package" else None
    arrays: dict[str, np.ndarray] = {}
    if (case_dir / "data.npz").exists():
        with np.load(case_dir / "data.npz", allow_pickle=False) as z:
            for k in z.files:
                a = z[k]
                if meta["dtypes"][k] == "bfloat16":
                    import ml_dtypes

                    a = a.view(ml_dtypes.bfloat16)
                arrays[k] = a
    return m, meta, arrays


def reader(case_dir: Path):
    def read(member: str) -> bytes:
        p = case_dir / member
        if not p.is_file():
            raise KeyError(member)
        return p.read_bytes()

    return read


def compare(got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> dict[str, Any]:
    if tuple(got.shape) != tuple(want.shape):
        return {"ok": False, "why": f"shape {got.shape} != {want.shape}"}
    g, w = got.astype(np.float64), want.astype(np.float64)
    diff = np.abs(g - w)
    bad = ~(diff <= atol + rtol * np.abs(w))
    return {"ok": not bad.any(), "max_abs": float(diff.max(initial=0)), "bad": int(bad.sum()),
            "max_rel": float((diff / np.maximum(np.abs(w), 1e-30)).max(initial=0))}  # fmt: skip


def garbage_like(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    return np.frombuffer(b"\xff" * n, dtype).reshape(shape)


def poison(ex: cuda.CudaExecutor) -> None:
    """Fill the executor's staging memory with NaN-like bytes, so an unwritten output cannot pass."""
    if ex._io.ptr:
        ex.drv.check(ex._lib.cuMemsetD8Async(ex._io.ptr, 0xFF, ex._io.size, ex.stream), "cuMemsetD8Async")


def run_case(case_dir: Path) -> dict[str, Any]:
    m, meta, arrays = load(case_dir)
    if meta["kind"] == "package":
        return package(case_dir, meta, arrays)
    assert m is not None
    if meta["kind"] == "fault":
        return fault(m, case_dir)
    out: dict[str, Any] = {"checks": []}
    picked = cuda.pick_target(m.cuda_targets)
    assert picked is not None and picked == m.cuda_targets[0]
    weights = [arrays[f"w:{w.name}"] for w in m.weights.tensors]
    ex = cuda.CudaExecutor(m, picked, reader(case_dir), weights)
    in_names = [t.name for t in m.inputs]
    out_names = [t.name for t in m.outputs]
    order = [0, 1, 0] if len(meta["trials"]) > 1 else [0]
    out_dtypes = [cuda.np_dtype(t.dtype) for t in m.outputs]
    for mode in ("plain", "graph", "zero_copy", "device_out"):
        for i in order:
            syms = meta["trials"][i]
            inputs = [arrays[f"in{i}:{n}"] for n in in_names]
            refs = [arrays[f"ref{i}:{n}"] for n in out_names]
            poison(ex)
            try:
                got = run_mode(ex, mode, inputs, syms, [(r.shape, dt) for r, dt in zip(refs, out_dtypes, strict=True)])
            except Exception as e:  # one failing mode must not hide the others' results
                out["checks"].append({"ok": False, "trial": i, "mode": mode, "why": f"{type(e).__name__}: {e}"})
                if isinstance(e, DeviceError) and "unusable" in str(e):
                    break
                continue
            for name, g, r, dt in zip(out_names, got, refs, out_dtypes, strict=True):
                c = compare(g, r, meta["rtol"], meta["atol"])
                if g.dtype != dt:
                    c.update(ok=False, why=f"dtype {g.dtype} != {dt}")
                c.update(trial=i, mode=mode, output=name)
                out["checks"].append(c)
    out["graph_error"] = ex.graph_error  # programs must capture; a kernel launched with attributes may not
    out["ok"] = all(c["ok"] for c in out["checks"]) and (ex.graph_error is None or meta["kind"] != "program")
    if meta.get("compiled"):
        out["compiled"] = meta["compiled"]
    ex.close()
    return out


def run_mode(
    ex: cuda.CudaExecutor, mode: str, inputs: list[np.ndarray], syms: dict[str, int], outs: list[tuple[Any, Any]]
) -> list[np.ndarray]:
    """One run in one of the ways a caller can run: host arrays (plain or graph), device arrays in and out
    (zero-copy, outputs poisoned first), host in with new device arrays out."""
    if mode in ("plain", "graph"):
        return ex.run(inputs, syms, graph=(mode == "graph"))
    if mode == "zero_copy":
        dev_in = [ex.to_device(a) for a in inputs]
        dev_out = [ex.to_device(garbage_like(shape, dt)) for shape, dt in outs]
        res = ex.run(dev_in, syms, outputs=dev_out)
        assert all(a is b for a, b in zip(res, dev_out, strict=True)), "run() must return the given outputs"
        return [d.numpy() for d in dev_out]
    return [d.numpy() for d in ex.run(inputs, syms, device_outputs=True)]


def fault(m: schema.Manifest, case_dir: Path) -> dict[str, Any]:
    ex = cuda.CudaExecutor(m, m.cuda_targets[0], reader(case_dir), [], graphs=False)
    out: dict[str, Any] = {}
    try:
        ex.run([], {})
        out["first"] = "no error"
    except DeviceError as e:
        out["first"] = str(e)
    try:
        ex.run([], {})
        out["second"] = "no error"
    except DeviceError as e:
        out["second"] = str(e)
    out["ok"] = "unusable" in out["first"] and "earlier fault" in out["second"]
    return out


def refusals(art: Path) -> dict[str, Any]:
    """What the runtime must refuse, on a real driver: other archs, newer drivers, bad cubins, bad dicts."""
    case_dir = art / "pointwise_permute"
    m, _meta, arrays = load(case_dir)
    assert m is not None
    (t,) = m.cuda_targets
    weights = [arrays[f"w:{w.name}"] for w in m.weights.tensors]
    out: dict[str, Any] = {}

    def expect(name: str, exc: type[Exception], fn) -> None:
        try:
            fn()
            out[name] = "no error"
        except exc as e:
            out[name] = f"ok: {e}"
        except Exception as e:  # the wrong type of error is a failure too
            out[name] = f"wrong {type(e).__name__}: {e}"

    newer_arch = dataclasses.replace(t, arch="sm_100")  # neither its cubins nor its PTX run on an older GPU
    expect("newer_arch", IncompatiblePackage, lambda: cuda.pick_target([newer_arch]))
    older = dataclasses.replace(t, arch="sm_80")  # format 5 carries PTX: the driver compiles it for this GPU
    if cuda_ptx.has_ptx(older):
        picked, jit = cuda.choose([older])
        out["older_arch_jit"] = "ok" if picked is older and jit else f"picked {picked and picked.arch}, jit={jit}"
    else:
        expect("older_arch_no_ptx", IncompatiblePackage, lambda: cuda.pick_target([older]))
    newer = dataclasses.replace(t, min_driver=99000)
    expect("newer_driver", IncompatiblePackage, lambda: cuda.pick_target([newer]))
    out["no_cuda_target"] = "ok" if cuda.pick_target([]) is None else "returned a target"
    bad = schema.to_dict(m)
    bad["targets"][0]["launches"] = "nope"
    expect("malformed", PackageCorrupt, lambda: schema.from_dict(bad))

    def garbage(member: str) -> bytes:
        return b"not a cubin" * 10

    expect("bad_cubin", PackageCorrupt, lambda: cuda.CudaExecutor(m, t, garbage, weights))
    expect("missing_member", PackageCorrupt, lambda: cuda.CudaExecutor(m, t, {}, weights))
    out["ok"] = all(v.startswith("ok") for v in out.values())
    out["device"] = cuda.device_info()
    return out


def main(argv: list[str]) -> int:
    art = Path(argv[0])
    for name in argv[1:]:
        try:
            res = refusals(art) if name == "refusals" else run_case(art / name)
        except Exception as e:
            res = {"ok": False, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-3000:]}
        res["case"] = name
        res["torch_imported"] = "torch" in sys.modules or "triton" in sys.modules
        res["ok"] = bool(res.get("ok")) and not res["torch_imported"]
        print(json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
