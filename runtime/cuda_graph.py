"""CUDA graphs for the CUDA executor: capture a launch sequence once, replay it per call.

What it is: ``Graphs``, instantiated graphs keyed by what they bake in (the symbol binding and the
caller-owned device pointers), at most ``limit`` kept, least recently used dropped. A failed capture is
remembered in ``error`` and later calls launch plainly. What it is not: the launch loop
(``aotc.cuda_launch``) or the decision whether to use a graph (the executor's).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

from .cuda_driver import CAPTURE_THREAD_LOCAL, Driver
from .errors import DeviceError


class Graphs:
    def __init__(self, drv: Driver, stream: Any, limit: int = 16) -> None:
        self.drv, self.stream, self.limit = drv, stream, limit
        self.error: str | None = None
        self._execs: OrderedDict[Hashable, Any] = OrderedDict()

    def __contains__(self, key: Hashable) -> bool:
        return key in self._execs

    def count(self, binding: Hashable) -> int:
        """How many graphs this symbol binding has (keys are (binding, baked-in pointers))."""
        return sum(1 for k in self._execs if isinstance(k, tuple) and k[0] == binding)

    def run(self, key: Hashable, record: Callable[[], None], what: Callable[[], str]) -> bool:
        """Replay the graph for ``key``, capturing ``record()`` first if there is none; False when capture
        failed and nothing ran (the caller then launches plainly). ``what()`` names the kernels for an error
        message; it is called only on failure, to keep a replay's host time short."""
        ge = self._execs.get(key)
        if ge is None:
            ge = self._capture(record)
            if ge is None:
                return False
            self._execs[key] = ge
            while len(self._execs) > self.limit:
                self.drv.lib.cuGraphExecDestroy(self._execs.popitem(last=False)[1])
        else:
            self._execs.move_to_end(key)
        r = self.drv.lib.cuGraphLaunch(ge, self.stream)
        if r:
            raise self.drv.error(r, "cuGraphLaunch", hint=what())
        return True

    def _capture(self, record: Callable[[], None]) -> Any:
        """The launches ``record`` makes as an instantiated graph; None (and ``error`` set) if capture fails."""
        drv = self.drv
        ffi, lib = drv.ffi, drv.lib
        r = lib.cuStreamBeginCapture_v2(self.stream, CAPTURE_THREAD_LOCAL)
        if r:
            self.error = f"cuStreamBeginCapture: {drv.error_name(r)}"
            return None
        err = None
        try:
            record()
        except DeviceError as e:
            err = str(e)
        g = ffi.new("CUgraph *")
        r = lib.cuStreamEndCapture(self.stream, g)
        drv.guard()
        if err is None and r:
            err = f"cuStreamEndCapture: {drv.error_name(r)}"
        ge = ffi.new("CUgraphExec *")
        if err is None:
            r = lib.cuGraphInstantiateWithFlags(ge, g[0], 0)
            if r:
                err = f"cuGraphInstantiateWithFlags: {drv.error_name(r)}"
        if g[0] != ffi.NULL:
            lib.cuGraphDestroy(g[0])
        if err is not None:
            self.error = err
            return None
        return ge[0]

    def clear(self) -> None:
        """Destroy every graph (the pointers they baked in moved)."""
        for ge in self._execs.values():
            self.drv.lib.cuGraphExecDestroy(ge)
        self._execs.clear()
