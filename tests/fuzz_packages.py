"""Fuzz the loader with mutated packages: manifest fields (the ZIP CRCs recomputed, as a forger would),
member bytes (re-hashed or not) and truncations, each case `aotc verify`-ed in its own forked process.

    python tests/fuzz_packages.py BASE.pkg N [SEED]     # prints a summary; exit 1 on any crash, hang or traceback

A library whose bytes change is never re-hashed: code replaced along with its hash is outside what a
package can defend (only signatures can; docs/safety.md). What counts as a failure: a signal (a crash), a
hang (killed after 30 s), a traceback, an exit code outside the documented ones (docs/safety.md), or a
refusal that is not one line ``aotc: ...``. Mutations aim at what reaches native code: sizes, shapes,
ranges, expressions, features, levels, tolerances.
tests/test_hostile.py runs a short seeded run in CI; the long run (10,000 cases) is for a quiet machine.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ALLOWED = {0, 2, 3, 4, 5, 8, 9}
VALUES: list[Any] = [
    0, 1, -1, 2, 3, 4, 12, 64, 65, 2**31, 2**32 + 1, 2**40, 2**62, 2**63, 2**64, 10**30, -(2**63),
    "s0", "s0*12", "s0*0", "s0-1", "s0//0", "Mod(s0, 0)", "CeilDiv(s0, 0)", "Max(s0, 2**70)", "s0*s0*s0*s0*s0*s0*s0*s0",
    "(s0", "", "s1", "x86-64-v4", "x86-64-v3", "sm_90", "float16", "int64", "bool", "ptr", "avx512f",
    None, True, False, [], {}, [1], [[]], 1.5, -0.0, 1e308, "x" * 5000, "-" * 3000 + "s0", "(" * 300 + "s0" + ")" * 300,
]  # fmt: skip


def leaves(node: Any, path: tuple = ()) -> Iterator[tuple]:
    """Every path into the JSON tree (containers too, so whole sections get replaced)."""
    yield path
    if isinstance(node, dict):
        for k, v in node.items():
            yield from leaves(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from leaves(v, (*path, i))


def at(node: Any, path: tuple) -> Any:
    for k in path:
        node = node[k]
    return node


def mutate(d: dict, members: dict[str, bytes], rng: random.Random) -> str | None:
    """One random mutation in place; returns replacement manifest text for text-level mutations."""
    kind = rng.random()
    paths = [p for p in leaves(d) if p]
    if kind < 0.55:  # replace a field's value
        p = rng.choice(paths)
        other = at(d, rng.choice(paths))
        at(d, p[:-1])[p[-1]] = json.loads(json.dumps(rng.choice([*VALUES, other])))  # a copy: no cycles
    elif kind < 0.65:  # an integer nudged, where the lies that reach native code live
        ints = [p for p in paths if isinstance(at(d, p), int) and not isinstance(at(d, p), bool)]
        if ints:
            p = rng.choice(ints)
            at(d, p[:-1])[p[-1]] = at(d, p) + rng.choice([-1, 1, -64, 64, 4096]) if rng.random() < 0.7 else at(d, p) * 2
    elif kind < 0.72:  # a list entry dropped or duplicated
        lists = [p for p in paths if isinstance(at(d, p), list) and at(d, p)]
        if lists:
            lst = at(d, rng.choice(lists))
            i = rng.randrange(len(lst))
            lst.insert(i, json.loads(json.dumps(lst[i]))) if rng.random() < 0.5 else lst.pop(i)
    elif kind < 0.77:  # a key dropped or added
        dicts = [p for p in paths if isinstance(at(d, p), dict) and at(d, p)]
        if dicts:
            obj = at(d, rng.choice(dicts))
            if rng.random() < 0.5:
                obj.pop(rng.choice(list(obj)))
            else:
                obj[rng.choice(["kind", "max", "extra", "chunks", "packed"])] = rng.choice(VALUES)
    elif kind < 0.87:  # a member's bytes changed, and re-hashed half of the time
        name = rng.choice(sorted(members))
        b = bytearray(members[name])
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        if rng.random() < 0.3:
            del b[rng.randrange(len(b)) :]
        members[name] = bytes(b)
        # Code changed and re-hashed is code replaced: it may do anything (docs/safety.md), so only data is re-hashed.
        if rng.random() < 0.5 and isinstance(d.get("members"), dict) and not name.endswith(".so"):
            from aotc_build.package import member_hashes

            d["members"][name] = json.loads(json.dumps(member_hashes(members[name]).__dict__))
    else:  # the manifest's text itself
        text = json.dumps(d)
        b = bytearray(text.encode())
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] = rng.choice(b'{}[]",:0123456789-eE. \\x')
        return b.decode("latin-1")
    return None


def main() -> int:
    sys.path.insert(0, str(Path(__file__).parent))
    from aotc_build import package as wpkg

    base, n = Path(sys.argv[1]), int(sys.argv[2])
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    rng = random.Random(seed)
    with zipfile.ZipFile(base) as z:
        d0 = json.loads(z.read("manifest.json"))
        m0 = {x: z.read(x) for x in z.namelist() if x != "manifest.json"}
    failures: list[str] = []
    codes: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="aotc-fuzz-") as work:
        for start in range(0, n, 200):  # batches: one fork server each
            cases = []
            for k in range(start, min(n, start + 200)):
                d, members = json.loads(json.dumps(d0)), dict(m0)
                text = None
                for _ in range(rng.choice([1, 1, 1, 2, 3])):
                    text = mutate(d, members, rng) or text
                raw = (text if text is not None else json.dumps(d)).encode("latin-1", "replace")
                path = Path(work) / f"{k}.pkg"
                wpkg._write_atomic(path, wpkg._layout([("manifest.json", raw), *sorted(members.items())]))
                cases.append({"args": ["verify", str(path)], "env": {}})
            r = subprocess.run(
                [sys.executable, str(Path(__file__).with_name("fork_cli.py"))],
                input=json.dumps(cases), capture_output=True, text=True, timeout=3600, check=False,
            )  # fmt: skip
            if r.returncode != 0:
                print(r.stderr[-3000:])
                return 1
            for case, res in zip(cases, json.loads(r.stdout), strict=True):
                rc, err = res["rc"], res["stderr"].strip()
                codes[str(rc)] = codes.get(str(rc), 0) + 1
                lines = [ln for ln in err.splitlines() if not ln.startswith("note: ")]
                one_line = rc == 0 or (len(lines) == 1 and lines[0].startswith("aotc: "))
                if rc not in ALLOWED or "Traceback" in err or not one_line:
                    keep = Path(tempfile.gettempdir()) / f"aotc-fuzz-fail-{seed}-{Path(case['args'][1]).name}"
                    keep.write_bytes(Path(case["args"][1]).read_bytes())
                    failures.append(f"{keep}: exit {rc}: {err[-500:]}")
            for p in Path(work).glob("*.pkg"):
                p.unlink()
    print(json.dumps({"cases": n, "seed": seed, "exit_codes": codes, "failures": len(failures)}))
    for f in failures[:20]:
        print(f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
