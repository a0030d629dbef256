"""sha256 of byte ranges of one buffer (a mapped package), on threads, computed before anyone asks.

What it is: ``Hashes``: ``start`` queues ranges and starts helper threads that hash them, largest first;
``digests`` returns the digests of the ranges asked for, the calling thread hashing what is still queued
(and only those ranges from then on) instead of waiting idle. hashlib releases the GIL while it hashes,
so the helpers run beside whatever Python the caller runs meanwhile.
What it is not: a check. A digest is a pure function of the bytes of the range in the mapping the package
reads from; ``aotc.package.Package`` compares it with the manifest's before it uses the bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from collections.abc import Iterable

HASH_CHUNK = 8 << 20  # members larger than this carry one sha256 per HASH_CHUNK-byte piece, in order
MAX_THREADS = 8
SMALL = 4 << 20  # bytes one thread hashes in a few ms: below this another thread does not pay for itself
JOIN_PER_CORE = 2  # threads per core once the asking thread hashes too (see the Note at the end)

Range = tuple[int, int]  # [start, end) in the buffer


def hash_threads(ranges: Iterable[Range] = (), limit: int | None = None, per_core: int = 1) -> int:
    """Threads worth hashing ``ranges`` on: ``per_core`` per core this process may use (at most MAX_THREADS,
    or ``limit``), one per SMALL bytes of work, one per range, at least one."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    ranges = list(ranges)
    total = sum(e - s for s, e in ranges)
    return max(1, min(limit or MAX_THREADS, cores * per_core, len(ranges), 1 + total // SMALL))


def others_running() -> int:
    """Threads of other processes runnable right now (``/proc/loadavg``'s running count, less this thread);
    0 where it cannot tell."""
    try:
        with open("/proc/loadavg", "rb") as f:
            return max(0, int(f.read().split()[3].split(b"/")[0]) - 1)
    except (OSError, ValueError, IndexError):
        return 0


def ahead_threads(ranges: Iterable[Range]) -> int:
    """Helper threads to hash ``ranges`` before the caller asks: the cores but one, or, while other processes'
    threads are running, JOIN_PER_CORE per core (see the Note at the end)."""
    busy = others_running() > 0
    return hash_threads(ranges, per_core=JOIN_PER_CORE if busy else 1) - (0 if busy else 1)


class Hashes:
    """The sha256 of ranges of ``buf``, computed by helper threads and by the thread that asks."""

    def __init__(self, buf: memoryview) -> None:
        self._buf = buf
        self._todo: list[Range] = []  # smallest first: threads take from the end, the largest first
        self._running: set[Range] = set()
        self._done: dict[Range, str] = {}
        self._helpers = 0  # helper threads still taking work
        self._cond = threading.Condition()

    def start(self, ranges: Iterable[Range], helpers: int) -> None:
        """Queue ``ranges`` (those not hashed or queued yet) and run up to ``helpers`` threads on the queue."""
        with self._cond:
            known = set(self._todo) | self._running | self._done.keys()
            new = [r for r in dict.fromkeys(ranges) if r not in known]
            self._todo = sorted(self._todo + new, key=lambda r: r[1] - r[0])
            more = max(0, min(helpers, len(self._todo)) - self._helpers)
            self._helpers += more
        for _ in range(more):
            threading.Thread(target=self._help, name="aotc-sha256", daemon=True).start()

    def digests(self, ranges: Iterable[Range], threads: int | None = None) -> dict[Range, str]:
        """The hex sha256 of each range, on up to ``threads`` threads counting this one (default: hash_threads,
        JOIN_PER_CORE per core); this thread hashes queued ranges until none is left, then waits for the
        helpers' last ones."""
        wanted = list(dict.fromkeys(ranges))
        with self._cond:
            missing = [r for r in wanted if r not in self._done]
        self.start(missing, helpers=hash_threads(missing, threads, 1 if threads else JOIN_PER_CORE) - 1)
        while True:
            self._work()
            with self._cond:
                if all(r in self._done for r in wanted):
                    return {r: self._done[r] for r in wanted}
                idle = [r for r in wanted if r not in self._done and r not in self._running and r not in self._todo]
                if idle:  # dropped by another caller meanwhile: hash them here
                    self._todo.extend(idle)
                elif not self._todo:
                    self._cond.wait()  # for a helper's range; each one done notifies

    def drop(self, ranges: Iterable[Range]) -> None:
        """Take ``ranges`` off the queue (a load that will not use a member does not pay for hashing it)."""
        gone = set(ranges)
        with self._cond:
            self._todo = [r for r in self._todo if r not in gone]

    def close(self) -> None:
        """Hash nothing more, wait for the ranges being hashed, and let go of the buffer (so that the mapping can
        be closed). Note (why wait): a helper still reading a refused package's mapping when the caller goes on
        to rewrite the file (a retry writes the same path) died of SIGBUS on the truncated pages."""
        with self._cond:
            self._todo = []
            while self._running:
                self._cond.wait()
        with contextlib.suppress(BufferError):  # a slice still exported elsewhere: freed when it goes
            self._buf.release()

    def _help(self) -> None:
        try:
            self._work()
        finally:
            with self._cond:
                self._helpers -= 1

    def _work(self) -> None:
        while True:
            with self._cond:
                if not self._todo:
                    return
                r = self._todo.pop()
                self._running.add(r)
            try:
                got = hashlib.sha256(self._buf[r[0] : r[1]]).hexdigest()
            except Exception as e:  # a closed mapping: the range then matches no manifest digest
                got = f"unreadable ({type(e).__name__})"
            with self._cond:
                self._done[r] = got
                self._running.discard(r)
                self._cond.notify_all()


# Note (why more threads than cores once the caller asks): from then on the caller only waits for digests,
# so threads beyond the cores cost a switch at an 8 MiB chunk's end, nothing on the way; and where another
# process keeps a core busy, the scheduler shares the cores by thread, so 4 hashing threads get ~4/5 of 2
# cores where 2 got 2/3. Before the caller asks (aotc.load importing and parsing), the helpers stay at the
# cores but one: more there took the importing thread's core (cold start, aotc.load before numpy, idle:
# 90 -> 102-106 ms). Measured: benchmarks/cold_start.py's children, MLP package (100 MB), 2 shared cores.
# Unless another process's thread is running when the hashing starts (/proc/loadavg): then the importing
# thread has no core of its own anyway, and only more threads get this process more of the machine.
