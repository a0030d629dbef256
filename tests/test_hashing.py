"""aotc.hashing (sha256 of ranges on threads, ahead of need) and the load path that starts it first."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
from pathlib import Path

import aotc
import aotc.loading
import aotc.package
import numpy as np
import pytest
from aotc import hashing
from aotc.container import Container, member_ranges
from aotc.hashing import HASH_CHUNK, Hashes, ahead_threads, hash_threads
from aotc.package import Package


def _ranges(n: int, size: int) -> list[tuple[int, int]]:
    return [(i * size, (i + 1) * size) for i in range(n)]


def test_digests_match_hashlib_whatever_the_threads() -> None:
    buf = np.random.default_rng(0).integers(0, 256, 3 << 20, np.uint8).tobytes()
    ranges = [*_ranges(12, 1 << 18), (5, 7), (0, 0), (100, 3 << 20)]
    want = {r: hashlib.sha256(buf[r[0] : r[1]]).hexdigest() for r in ranges}
    for threads in (1, 2, 4):
        assert Hashes(memoryview(buf)).digests(ranges, threads) == want
    ahead = Hashes(memoryview(buf))
    ahead.start(ranges, helpers=2)
    assert ahead.digests(ranges[:3]) == {r: want[r] for r in ranges[:3]}
    assert ahead.digests(ranges) == want


def test_dropped_ranges_are_hashed_when_asked_for_later() -> None:
    buf = bytes(range(256)) * 4096
    ranges = _ranges(16, 1 << 16)
    h = Hashes(memoryview(buf))
    h.start(ranges, helpers=0)  # queued, nobody hashing yet
    h.drop(ranges[8:])
    assert h.digests(ranges[:8], threads=1) == {r: hashlib.sha256(buf[r[0] : r[1]]).hexdigest() for r in ranges[:8]}
    assert h.digests(ranges[8:], threads=2) == {r: hashlib.sha256(buf[r[0] : r[1]]).hexdigest() for r in ranges[8:]}


def test_callers_on_several_threads_each_get_their_digests() -> None:
    """One caller's drop must not strand another caller's ranges (they would wait forever)."""
    buf = bytes(range(256)) * 8192
    ranges = _ranges(32, 1 << 16)
    h = Hashes(memoryview(buf))
    h.start(ranges, helpers=1)
    got: dict[int, dict] = {}

    def ask(i: int) -> None:
        mine = ranges[i::4]
        h.drop([r for r in ranges if r not in mine])
        got[i] = h.digests(mine, threads=2)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    for i in range(4):
        assert got[i] == {r: hashlib.sha256(buf[r[0] : r[1]]).hexdigest() for r in ranges[i::4]}


def test_member_ranges_follow_the_chunk_rule() -> None:
    assert member_ranges(64, 10) == [(64, 74)]
    assert member_ranges(0, HASH_CHUNK) == [(0, HASH_CHUNK)]
    assert member_ranges(64, 2 * HASH_CHUNK + 1) == [
        (64, 64 + HASH_CHUNK),
        (64 + HASH_CHUNK, 64 + 2 * HASH_CHUNK),
        (64 + 2 * HASH_CHUNK, 65 + 2 * HASH_CHUNK),
    ]
    assert hash_threads([(0, 10)]) == 1  # small work stays on the caller's thread
    assert 1 <= hash_threads(_ranges(8, HASH_CHUNK)) <= 8


def test_a_joining_caller_hashes_on_twice_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once the caller asks, JOIN_PER_CORE threads a core (capped by ranges and MAX_THREADS); an explicit
    thread count is kept as given."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1})
    ranges = _ranges(12, HASH_CHUNK)
    assert hash_threads(ranges) == 2
    assert hash_threads(ranges, per_core=2) == 4
    assert hash_threads(ranges[:3], per_core=2) == 3
    started: list[int] = []
    h = Hashes(memoryview(bytes(12 * HASH_CHUNK)))
    monkeypatch.setattr(h, "start", lambda rs, helpers: started.append(helpers))
    monkeypatch.setattr(h, "_work", lambda: h._done.update(dict.fromkeys(ranges, "x")))
    h.digests(ranges)
    h._done.clear()
    h.digests(ranges, threads=2)
    assert started == [3, 1]  # helpers besides the caller: 2 per core by default, as asked when asked


def test_hashing_ahead_takes_more_threads_on_a_busy_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before the caller asks: the cores but one while nothing else runs; JOIN_PER_CORE threads a core while
    another process's thread is running (the scheduler shares cores by thread)."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1})
    ranges = _ranges(12, HASH_CHUNK)
    monkeypatch.setattr(hashing, "others_running", lambda: 0)
    assert ahead_threads(ranges) == 1
    monkeypatch.setattr(hashing, "others_running", lambda: 1)
    assert ahead_threads(ranges) == 4
    assert ahead_threads(ranges[:2]) == 2  # one thread a range at most
    monkeypatch.undo()
    assert hashing.others_running() >= 0  # reads /proc/loadavg; 0 where it cannot


def test_a_corrupt_member_is_refused_when_hashed_ahead(make_package, tmp_path: Path) -> None:
    """Digests hashed ahead are of the same mapping the package reads: a flipped weight byte fails the check."""
    path = make_package()
    pkg = Package(path)
    e = pkg.entries["weights.safetensors"]
    data = bytearray(path.read_bytes())
    data[e.offset + e.size - 1] ^= 1
    bad = tmp_path / "bad.pkg"
    bad.write_bytes(bytes(data))
    c = Container(bad, hash_ahead=True)
    with pytest.raises(aotc.PackageCorrupt, match="weights.safetensors"):
        Package(bad, None, c).verify_members(["weights.safetensors"])
    with pytest.raises(aotc.PackageCorrupt, match="weights.safetensors"):
        aotc.load(bad, device="cpu")


def test_load_starts_hashing_before_it_imports_the_schema(make_package) -> None:
    """aotc.loading imports only light modules, so that hashing overlaps the schema's import and the
    manifest's parsing; and the load still checks every member."""
    code = (
        "import sys, numpy as np\n"
        "import aotc.loading\n"
        "print(sorted(m for m in ('aotc.schema', 'aotc.package', 'aotc.model', 'json') if m in sys.modules))\n"
        "import aotc.container\n"
        "seen = []\n"
        "real = aotc.container.Hashes.start\n"
        "def start(self, ranges, helpers):\n"
        "    seen.append('aotc.schema' in sys.modules)\n"
        "    return real(self, ranges, helpers)\n"
        "aotc.container.Hashes.start = start\n"
        "m = aotc.load(sys.argv[1], device='cpu')\n"
        "print(seen[0], sorted(m.package._verified))\n"
    )
    r = subprocess.run([sys.executable, "-c", code, str(make_package())], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0] == "[]"
    assert lines[1] == "False ['cpu/x86-64-v2/model.so', 'selftest.safetensors', 'weights.safetensors']"


LOAD_BEFORE_NUMPY = """
import os, sys
before = set(sys.modules)
import aotc, aotc.container
seen = []
real = aotc.container.Hashes.start
def start(self, ranges, helpers):
    seen.append(sorted(m for m in ('numpy', 'typing', 'dataclasses', 'json') if m in sys.modules and m not in before))
    return real(self, ranges, helpers)
aotc.container.Hashes.start = start
during = []
def hook(event, args):
    if event == 'import' and args[0] == 'numpy':
        during.append(os.environ.get('OPENBLAS_THREAD_TIMEOUT'))
sys.addaudithook(hook)
m = aotc.load(sys.argv[1], device='cpu')
import numpy as np
y = m.run({"x": np.ones((2, 4), np.float32), "scale": np.ones(2, np.float32)})
print(seen[0], during, os.environ.get('OPENBLAS_THREAD_TIMEOUT'), sorted(m.package._verified))
"""


def test_load_before_numpy_hashes_beside_numpy_import_with_openblas_quiet(make_package) -> None:
    """A script that calls aotc.load before it imports numpy: the hashing starts before numpy's import (and
    before typing's, dataclasses' and json's: ~10 ms that then run beside it), numpy's import runs with
    OpenBLAS's idle spin off (its threads would take the hashing's core) and leaves the environment as it
    was; a user's own setting wins; and every member is still checked."""
    pkg = str(make_package())
    members = "['cpu/x86-64-v2/model.so', 'selftest.safetensors', 'weights.safetensors']"
    env = {k: v for k, v in os.environ.items() if k not in aotc.loading.BLAS_TIMEOUT_VARS}
    for preset, during, after in ((None, "'4'", "None"), ("12", "'12'", "12")):
        e = env if preset is None else {**env, "OPENBLAS_THREAD_TIMEOUT": preset}
        r = subprocess.run([sys.executable, "-c", LOAD_BEFORE_NUMPY, pkg], capture_output=True, text=True, env=e, check=False)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == f"[] [{during}] {after} {members}"


def test_field_types_agree_with_get_type_hints_for_every_record() -> None:
    """aotc.reader resolves the records' annotations itself (cheaper at a cold start than get_type_hints)."""
    import dataclasses
    import typing

    import aotc.manifest
    import aotc.schema
    from aotc.reader import field_types

    records = {
        c
        for mod in (aotc.manifest, aotc.schema, aotc.package)
        for c in vars(mod).values()
        if isinstance(c, type) and dataclasses.is_dataclass(c)
    }
    assert len(records) > 10
    for cls in records:
        fields = [f.name for f in dataclasses.fields(cls)]
        got, want = field_types(cls), typing.get_type_hints(cls)
        assert {n: got[n] for n in fields} == {n: want[n] for n in fields}, cls


CLOSE_THEN_TRUNCATE = """
import mmap, os, sys
from aotc.hashing import HASH_CHUNK, Hashes
path = sys.argv[1]
with open(path, "wb") as f:
    f.truncate(16 * HASH_CHUNK)
fd = os.open(path, os.O_RDONLY)
mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
os.close(fd)
h = Hashes(memoryview(mm))
h.start([(i * HASH_CHUNK, (i + 1) * HASH_CHUNK) for i in range(16)], helpers=4)
h.close()
with open(path, "wb"):  # a retry rewriting the refused package's path truncates the mapped file
    pass
print("ok")
"""


def test_close_waits_for_the_ranges_being_hashed(tmp_path: Path) -> None:
    """After ``close`` no helper reads the mapping: truncating the file then cannot kill the process (SIGBUS)."""
    for _ in range(3):
        r = subprocess.run([sys.executable, "-c", CLOSE_THEN_TRUNCATE, str(tmp_path / "big.bin")],
                           check=False, capture_output=True, text=True, timeout=120)  # fmt: skip
        assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stderr[-2000:])
