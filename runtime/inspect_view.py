"""What ``aotc inspect`` shows: a package's facts in the user's terms, as text lines or as JSON.

What it is: ``summary(pkg)`` (sizes evaluated over the declared ranges, dimensions by the user's labels
only, the kernel table per target, the build options and the command that rebuilds the package, the file's
date) and ``lines(pkg, status)``, its text form. What it is not: a check; the caller hashes the members.
Note: the package holds no build date (the same input gives the same bytes), so the date shown is the
file's modification time, and says so.
"""

from __future__ import annotations

import datetime
import math
from typing import Any

from .package import Package
from .schema import ITEMSIZE, CpuTarget, CudaTarget, Manifest, Size
from .shapes import evaluate


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def size_range(m: Manifest, size: Size) -> dict[str, Any]:
    """``size`` at every symbol's minimum and maximum (None where a symbol is unbounded)."""
    if isinstance(size, int):
        return {"min": size, "max": size, "at_min": {}, "at_max": {}}
    lo_env = {s.name: max(s.min, 1) for s in m.symbols}
    hi_env = {s.name: s.max for s in m.symbols if s.max is not None}
    lo = evaluate(size, lo_env)
    hi = evaluate(size, hi_env) if len(hi_env) == len(m.symbols) else None
    labels = {s.name: s.label for s in m.symbols}
    return {
        "min": lo,
        "max": hi,
        "at_min": {labels[k]: v for k, v in lo_env.items()},
        "at_max": {labels[k]: v for k, v in hi_env.items()} if hi is not None else None,
    }


def _range_text(r: dict[str, Any]) -> str:
    if r["min"] == r["max"]:
        return _bytes(r["min"])
    at = ", ".join(f"{k}={v}" for k, v in r["at_min"].items())
    if r["max"] is None:
        return f"{_bytes(r['min'])} at {at}, growing with the unbounded dimensions"
    top = ", ".join(f"{k}={v}" for k, v in r["at_max"].items())
    return f"{_bytes(r['min'])} ({at}) to {_bytes(r['max'])} ({top})"


def _kernels(m: Manifest, pkg: Package, t: CpuTarget | CudaTarget) -> list[dict[str, Any]]:
    if isinstance(t, CpuTarget):  # one library holds every kernel: the size is the library's
        return [{"name": k, "target": f"cpu:{t.level}", "launch": "OpenMP loop", "code": t.library} for k in t.kernels]
    launches: dict[str, list[str]] = {}
    for launch in t.launches:
        launches.setdefault(launch.kernel, []).append("(" + ", ".join(m.pretty(g) for g in launch.grid) + ")")
    rows = []
    for k in t.kernels:
        code = k.member or k.ptx or ""
        member = m.members.get(code)
        rows.append(
            {
                "name": k.name,
                "target": f"cuda:{t.arch}",
                "launch": f"grid {' | '.join(launches.get(k.name, ['-']))}, block {k.num_warps * 32}, shared {k.shared:,} B",
                "code": code,
                "code_bytes": member.size if member is not None else None,
            }
        )
    return rows


def summary(pkg: Package) -> dict[str, Any]:
    m = pkg.manifest
    options = m.build.get("options", "")
    mtime = datetime.datetime.fromtimestamp(pkg.path.stat().st_mtime, tz=datetime.timezone.utc)
    return {
        "package": str(pkg.path),
        "bytes": pkg.size,
        "file_date": mtime.strftime("%Y-%m-%d %H:%M:%S UTC"),
        "format_version": m.format_version,
        "model": m.model.name,
        "frontend": m.model.frontend,
        "versions": {k: v for k, v in m.build.items() if k != "options"},
        "options": options,
        "command": f"aotc build {m.model.name}.py -o {pkg.path.name} {options}".rstrip() if options else None,
        "dimensions": [{"label": s.label, "min": s.min, "max": s.max} for s in m.symbols],
        "inputs": {t.name: m.describe(t) for t in m.inputs},
        "outputs": {t.name: m.describe(t) for t in m.outputs},
        "index_ranges": [{"input": r.input, "below": r.size, "table": r.table} for r in m.index_ranges],
        "arena": {_target_name(t): size_range(m, t.arena_bytes) for t in m.targets},
        "kernels": [row for t in m.targets for row in _kernels(m, pkg, t)],
        "weights_bytes": sum(math.prod(int(d) for d in t.shape) * ITEMSIZE[t.dtype] for t in m.weights.tensors),
    }


def _target_name(t: CpuTarget | CudaTarget) -> str:
    return f"cpu:{t.level}" if isinstance(t, CpuTarget) else f"cuda:{t.arch}"


def lines(pkg: Package, status: dict[str, str]) -> list[str]:
    m, s = pkg.manifest, summary(pkg)
    out = [
        f"package   {pkg.path} ({pkg.size:,} bytes, file date {s['file_date']})",
        f"format    aotc format version {m.format_version}",
        f"model     {m.model.name} (source sha256 {m.model.source_sha256[:16]}…, front end {m.model.frontend})",
        "built by  " + ", ".join(f"{k} {v}" for k, v in s["versions"].items()),
    ]
    if s["command"]:
        out.append(f"command   {s['command']}")
    for d in s["dimensions"]:
        out.append(f"dimension {d['label']} in [{d['min']}, {'inf' if d['max'] is None else d['max']}]")
    out += [f"input     {k}: {v}" for k, v in s["inputs"].items()]
    out += [f"output    {k}: {v}" for k, v in s["outputs"].items()]
    out += [f"ids       {r['input']} < {r['below']} ({r['table']})" for r in s["index_ranges"]]
    for t in m.targets:
        arena = _range_text(s["arena"][_target_name(t)])
        if isinstance(t, CpuTarget):
            out.append(
                f"target    cpu:{t.level}  {len(t.kernels)} kernels in {t.library}, arena {arena}, abi {t.abi_version}, {t.compiler}"
                + (f", glibc >= {t.min_glibc}" if t.min_glibc else "")
                + (f", {len(t.packed.tensors)} packed weights in {t.packed.member}" if t.packed else "")
            )
        else:
            out.append(
                f"target    cuda:{t.arch}  {len(t.kernels)} kernels, {len(t.launches)} launches, arena {arena}, {t.precision}, "
                f"triton {t.triton_version}, ptxas {t.ptxas_version}, driver >= {t.min_driver // 1000}.{t.min_driver % 1000 // 10}"
            )
    rows = s["kernels"]
    if rows:
        w = max(len(r["name"]) for r in rows)
        out.append(f"kernels   {'name':{w}}  {'target':12}  {'code':>10}  launch")
        for r in rows:
            code = f"{r['code_bytes']:,} B" if r.get("code_bytes") is not None else "(in .so)"
            out.append(f"          {r['name']:{w}}  {r['target']:12}  {code:>10}  {r['launch']}")
    out.append(f"weights   {len(m.weights.tensors)} tensors, {s['weights_bytes']:,} bytes in {m.weights.member}")
    st = m.selftest
    out.append("selftest  " + ("none" if st is None else f"{st.member} (rtol={st.rtol:g}, atol={st.atol:g})"))
    for name, mem in m.members.items():
        out.append(f"member    {status[name]:8} {name}  {mem.size:,} bytes  sha256 {mem.sha256[:16]}…")
    return out
