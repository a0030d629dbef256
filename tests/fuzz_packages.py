"""Fuzz the loader with mutated packages: manifest fields (the ZIP CRCs recomputed, as a forger would),
member bytes (re-hashed or not), and the file itself (ZIP record fields, raw bytes anywhere, truncation,
appended bytes), each case `aotc verify`-ed in its own forked process.

    python tests/fuzz_packages.py BASE.pkg N [SEED] [ARGS...]   # a summary; exit 1 on any crash, hang or traceback

ARGS are passed to `aotc verify` after the package (e.g. ``--trusted-key KEY.pub`` to fuzz signed packages,
where every mutation must be refused).

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

ALLOWED = {0, 2, 3, 4, 5, 8, 9, 10}
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


ZIP_SIGS = {b"PK\x03\x04": 30, b"PK\x01\x02": 46, b"PK\x05\x06": 22, b"PK\x06\x06": 56, b"PK\x06\x07": 20}


def mutate_file(blob: bytearray, rng: random.Random) -> bytearray:
    """One random change to the laid-out file: a ZIP record's field (sizes, offsets, counts, name lengths,
    methods, flags) set to a value chosen to mislead, raw bytes anywhere, a truncation or bytes appended."""
    kind = rng.random()
    if kind < 0.5:  # a field of a ZIP record
        records = [(i, n) for sig, n in ZIP_SIGS.items() for i in _find_all(blob, sig)]
        if records:
            start, size = rng.choice(records)
            width = rng.choice([2, 4, 4, 8]) if size > 8 else 2
            off = start + 4 + rng.randrange(0, max(1, size - 4 - width + 1))
            old = int.from_bytes(blob[off : off + width], "little")
            value = rng.choice([0, 1, 2, old + 1, old - 1, old + 64, old * 2, len(blob), 2 ** (8 * width) - 1, 2 ** (8 * width - 1)])
            blob[off : off + width] = (value % 2 ** (8 * width)).to_bytes(width, "little")
    elif kind < 0.8:  # raw bytes anywhere
        for _ in range(rng.randint(1, 8)):
            blob[rng.randrange(len(blob))] = rng.randrange(256)
    elif kind < 0.9:
        del blob[rng.randrange(len(blob)) :]
    else:
        blob += bytes(rng.randrange(256) for _ in range(rng.choice([1, 22, 100])))
    return blob


def _find_all(blob: bytearray, sig: bytes) -> list[int]:
    out, i = [], blob.find(sig)
    while i >= 0:
        out.append(i)
        i = blob.find(sig, i + 1)
    return out


def main() -> int:
    sys.path.insert(0, str(Path(__file__).parent))
    from aotc_build import package as wpkg

    base, n = Path(sys.argv[1]), int(sys.argv[2])
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    extra = sys.argv[4:]
    rng = random.Random(seed)
    with zipfile.ZipFile(base) as z:
        d0 = json.loads(z.read("manifest.json"))
        m0 = {x: z.read(x) for x in z.namelist() if x != "manifest.json"}
        comment = z.comment  # a signature (aotc.signing), kept on every mutant
    original = base.read_bytes()
    # With --trusted-key every mutant must be refused: as changed after signing (10) or damaged (3).
    allowed = {3, 10} if "--trusted-key" in extra else ALLOWED
    failures: list[str] = []
    codes: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="aotc-fuzz-") as work:
        for start in range(0, n, 200):  # batches: one fork server each
            cases = []
            for k in range(start, min(n, start + 200)):
                d, members = json.loads(json.dumps(d0)), dict(m0)
                text = None
                whole = rng.random() < 0.3  # the file itself, not its contents
                for _ in range(0 if whole else rng.choice([1, 1, 1, 2, 3])):
                    text = mutate(d, members, rng) or text
                raw = (text if text is not None else json.dumps(d)).encode("latin-1", "replace")
                blob = bytearray(b"".join(wpkg._layout([("manifest.json", raw), *sorted(members.items())])))
                if comment:
                    blob[-2:] = len(comment).to_bytes(2, "little")
                    blob += comment
                for _ in range(rng.choice([1, 1, 2]) if whole else 0):
                    blob = mutate_file(blob, rng)
                if blob == original:
                    continue  # a mutation that changed nothing (a value set to itself)
                path = Path(work) / f"{k}.pkg"
                path.write_bytes(blob)
                cases.append({"args": ["verify", str(path), *extra], "env": {}})
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
                if rc not in allowed or "Traceback" in err or not one_line:
                    keep = Path(tempfile.gettempdir()) / f"aotc-fuzz-fail-{seed}-{Path(case['args'][1]).name}"
                    keep.write_bytes(Path(case["args"][1]).read_bytes())
                    failures.append(f"{keep}: exit {rc}: {err[-500:]}")
            for p in Path(work).glob("*.pkg"):
                p.unlink()
    print(json.dumps({"cases": sum(codes.values()), "seed": seed, "exit_codes": codes, "failures": len(failures)}))
    for f in failures[:20]:
        print(f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
