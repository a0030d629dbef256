"""C++ code generation for ``kernel.Reduce``: row reductions (sums, maxima, softmax and norm rows) and pools.

What it is: the reduce emitters of cpp.py's ``KernelWriter``, kept in a mixin of their own so that file stays
short; they print with the writer's loop helpers (declared by ``_Host``) and values (cpp_values.py).
What it is not: a second code generator. The kernel function around them, the thread pool loops and the
translation unit are cpp.py's.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager, ExitStack
from typing import Protocol

import sympy

from .. import kernel as K
from ..ir import DType, Op
from .cpp_values import HALF, Values, _unmasked, cast, vtype
from .writer import Writer


class _Host(Protocol):
    """What the reduce emitters use of the kernel writer they are mixed into."""

    k: K.Kernel
    w: Writer
    vals: Values

    def _omp(self, text: str) -> str: ...
    def _parallel_for(self, stack: ExitStack, sizes: list[str], names: list[str], work: str) -> None: ...
    def _sizes(self, prefix: str, ranges: Sequence[sympy.Expr | int]) -> list[str]: ...
    def _for(self, var: str, n: str, lo: str = "0") -> AbstractContextManager[None]: ...
    def _outer(self, stack: ExitStack, sizes: list[str], work: str) -> None: ...
    def _work(self, sizes: Sequence[str]) -> str: ...
    def _rloops(self, stack: ExitStack, rsizes: list[str], clause: str = "") -> None: ...
    def _reduce_lanes(self, sizes: list[str], rsizes: list[str]) -> None: ...
    def _step(self, j: int, step: K.Reduction, rsizes: list[str], cache: Sequence[K.Value] = ()) -> None: ...


class ReduceEmitter:
    """The ``Reduce`` kernel bodies: ``_reduce`` picks the row form (``_step`` per reduction, then the
    outer and row stores) or the form across lanes (``_reduce_lanes``, pools over channels-last input)."""

    def _reduce(self: _Host) -> None:
        k = self.k
        assert isinstance(k, K.Reduce)
        sizes = self._sizes("n", k.ranges)
        rsizes = self._sizes("m", k.reduce_ranges)
        if _across_lanes(k):
            self._reduce_lanes(sizes, rsizes)
            return
        row, outer_st = k.row_stores, k.stores
        work = self._work(sizes + rsizes)
        cached = _row_caches(k)
        with ExitStack() as stack:
            self._outer(stack, sizes, work)
            stack.enter_context(self.vals.scope([]))  # where the later passes find the row caches
            for j, step in enumerate(k.steps):
                self._step(j, step, rsizes, [v for v, at in cached.items() if at == j])
            if outer_st:
                with self.vals.scope([st.value for st in outer_st]):
                    for st in outer_st:
                        self.vals.store(st)
            if row:
                self.vals.hoist_rows([st.value for st in row], _span(rsizes))
                with ExitStack() as rows:
                    self._rloops(rows, rsizes)
                    rows.enter_context(self.vals.scope([st.value for st in row], _span(rsizes)))
                    for st in row:
                        self.vals.store(st)

    def _reduce_lanes(self: _Host, sizes: list[str], rsizes: list[str]) -> None:
        """The reduce with its last outer loop innermost (see _across_lanes): per chunk of up to LANES
        positions of it, one accumulator array per step; each reduce position updates the whole array in an
        ``omp simd`` loop over contiguous elements, then one more such loop writes the stores."""
        k = self.k
        assert isinstance(k, K.Reduce)
        last = _lane_loop(k)
        i = f"i{last}"
        self.w.line(f"const int64_t aotc_chunks = aotc_ceildiv({sizes[last]}, {LANES});")
        with ExitStack() as stack:
            outer = [*sizes[:last], "aotc_chunks"]
            self._parallel_for(stack, outer, [*(f"i{j}" for j in range(last)), "aotc_c"], self._work(sizes + rsizes))
            for j in range(last + 1, len(sizes)):  # the trailing loops of one position (a kept-dims mean)
                self.w.line(f"[[maybe_unused]] const int64_t i{j} = 0;")
            self.w.line(f"const int64_t aotc_lo = aotc_c * {LANES};")
            self.w.line(f"const int64_t aotc_hi = aotc_min(aotc_lo + {LANES}, {sizes[last]});")

            def lanes() -> AbstractContextManager[None]:
                self.w.line(self._omp("simd"))
                return self._for(i, "aotc_hi", "aotc_lo")

            for j, step in enumerate(k.steps):
                vt = vtype(step.dtype)
                acc = f"aotc_acc{j}[{i} - aotc_lo]"
                nan = f"aotc_nan{j}[{i} - aotc_lo]" if step.op is not Op.SUM and step.dtype.is_float else None
                self.w.line(f"{vt} aotc_acc{j}[{LANES}];")
                if nan:  # a flag of its own: g++ 12 leaves aotc_maximum(x, acc) over the array scalar; int32,
                    self.w.line(f"int32_t aotc_nan{j}[{LANES}];")  # as a bool array would take 64 lanes a step
                with lanes():
                    self.w.line(f"{acc} = {_reduce_init(step)};")
                    if nan:
                        self.w.line(f"{nan} = 0;")
                with ExitStack() as loop:
                    for r, n in enumerate(rsizes):
                        loop.enter_context(self._for(f"r{r}", n))
                    loop.enter_context(self.vals.scope([step.value]))
                    # what does not vary along the lanes (a window's in-bounds test) is computed outside
                    # their loop: a mask there is one branch g++ unswitches, not a per-lane blend
                    lane = K.loop_var("i", last)
                    for v in K.walk(step.value):
                        if v in self.vals.safe and isinstance(v, K.Unary | K.Binary | K.Where) and _lane_free(v, lane):
                            self.vals.expr(v)
                    loop.enter_context(lanes())
                    x = cast(self.vals.expr(step.value), step.value.dtype, step.dtype)
                    if step.op is Op.SUM:
                        self.w.line(f"{acc} += {x};")
                    else:  # through a local: ``acc = x > acc ? x : acc`` becomes a masked store, a branch on
                        # the data and a store the next load cannot forward from (3x slower on a max-pool)
                        self.w.line(f"const {vt} aotc_a{j} = {acc};")
                        self.w.line(f"{acc} = {x} {'>' if step.op is Op.RMAX else '<'} aotc_a{j} ? {x} : aotc_a{j};")
                    if nan:
                        self.w.line(f"{nan} |= (int32_t)({x} != {x});")
            stack.enter_context(lanes())
            for j, step in enumerate(k.steps):
                res = f"aotc_acc{j}[{i} - aotc_lo]"
                if step.op is not Op.SUM and step.dtype.is_float:
                    res = f"(aotc_nan{j}[{i} - aotc_lo] ? static_cast<{vtype(step.dtype)}>(NAN) : {res})"
                if step.dtype in HALF:
                    res = f"aotc_round_{HALF[step.dtype]}({res})"
                self.w.line(f"const {vtype(step.dtype)} aotc_red{j} = {res};")
            stack.enter_context(self.vals.scope([st.value for st in k.stores]))
            for st in k.stores:
                self.vals.store(st)

    def _step(self: _Host, j: int, step: K.Reduction, rsizes: list[str], cache: Sequence[K.Value] = ()) -> None:
        """One reduction pass; it also writes the values in ``cache`` (see _row_caches) to row arrays that
        the later passes read instead of computing them again."""
        names = [f"aotc_row{j}_{q}" for q in range(len(cache))]
        for name, v in zip(names, cache, strict=True):
            self.w.line(f"{vtype(v.dtype)} {name}[{rsizes[0]}];")  # a constant: see _row_caches
        vt = vtype(step.dtype)
        acc, nan = f"aotc_acc{j}", f"aotc_nan{j}"
        is_float = step.dtype.is_float
        if step.op is Op.SUM:
            self.w.line(f"{vt} {acc} = 0;")
            clause = f" reduction(+:{acc})"
        else:
            big = "INFINITY" if is_float else f"std::numeric_limits<{vt}>::max()"
            if not is_float and step.op is Op.RMAX:
                big = f"std::numeric_limits<{vt}>::lowest()"
            init = f"-{big}" if is_float and step.op is Op.RMAX else big
            self.w.line(f"{vt} {acc} = {init};")
            clause = f" reduction({'max' if step.op is Op.RMAX else 'min'}:{acc})"
            if is_float:
                self.w.line(f"bool {nan} = false;")
                clause += f" reduction(|:{nan})"
        self.vals.hoist_rows([step.value], _span(rsizes))
        with ExitStack() as stack:
            self._rloops(stack, rsizes, clause)
            stack.enter_context(self.vals.scope([step.value], _span(rsizes)))
            x = cast(self.vals.expr(step.value), step.value.dtype, step.dtype)
            for name, v in zip(names, cache, strict=True):
                self.w.line(f"{name}[r0] = {self.vals.expr(v)};")
            if step.op is Op.SUM:
                self.w.line(f"{acc} += {x};")
            else:
                cmp = ">" if step.op is Op.RMAX else "<"
                self.w.line(f"{acc} = {x} {cmp} {acc} ? {x} : {acc};")
                if is_float:
                    self.w.line(f"{nan} |= {x} != {x};")
        for name, v in zip(names, cache, strict=True):
            self.vals.scopes[-1][v] = f"{name}[r0]"
        res = f"({nan} ? static_cast<{vt}>(NAN) : {acc})" if step.op is not Op.SUM and is_float else acc
        if step.dtype in HALF:
            res = f"aotc_round_{HALF[step.dtype]}({res})"
        self.w.line(f"const {vt} aotc_red{j} = {res};")

    def _rloops(self: _Host, stack: ExitStack, rsizes: list[str], clause: str = "") -> None:
        """Loops r0.. over the reduce space, ``omp simd`` (with ``clause``) on the innermost."""
        for j, n in enumerate(rsizes):
            if j == len(rsizes) - 1:
                self.w.line(self._omp("simd" + clause))
            stack.enter_context(self._for(f"r{j}", n))


LANES = 64  # positions of the last outer loop per chunk of a reduce across lanes (its accumulator arrays)


def _span(rsizes: list[str]) -> tuple[sympy.Symbol, str] | None:
    """The innermost reduce loop (``_rloops``) for Values.scope: its variable and trip count."""
    return (K.loop_var("r", len(rsizes) - 1), rsizes[-1]) if rsizes else None


def _unit_step(e: sympy.Expr, var: sympy.Symbol) -> sympy.Expr:
    """How much ``e`` grows when ``var`` grows by one (not a number when ``e`` is not affine in it)."""
    return sympy.expand(e.subs(var, var + 1) - e)


def _lane_loop(k: K.Reduce) -> int:
    """The outer loop a reduce across lanes vectorises: the last one of more than one position (a global
    average pool that keeps its dims, [N, C, 1, 1] over channels-last input, runs across its channels)."""
    sizes = [sympy.sympify(r) for r in k.ranges]
    return max((j for j, n in enumerate(sizes) if n != 1), default=len(sizes) - 1)


def _across_lanes(k: K.Reduce) -> bool:
    """Whether the reduce runs with its last outer loop (of more than one position: _lane_loop) innermost,
    vectorised across it (_reduce_lanes): when every load and store is contiguous or constant along that
    loop and no load is contiguous along the last reduce loop -- a max/avg pool over channels-last input
    (channels last, window rows and columns the reduce loops), a column sum. The plain order would
    vectorise over a strided window (or not at all: a 3x3 window's masked, data-dependent max stays scalar
    and branchy). Not for kernels with row stores (softmax, norms) or a step that reads an earlier step
    (they need the row's result first)."""
    if k.row_stores or not k.ranges or not k.reduce_ranges or k.has_gather:
        return False
    if any(isinstance(v, K.ReduceRef) for step in k.steps for v in K.walk(step.value)):
        return False
    i = K.loop_var("i", _lane_loop(k))
    r = K.loop_var("r", len(k.reduce_ranges) - 1)
    loads = [v.index.expr for s in k.steps for v in K.walk(s.value) if isinstance(v, K.Load) and isinstance(v.index, K.Index)]
    along = [_unit_step(sympy.sympify(e), i) for e in loads]
    if not any(a == 1 for a in along) or any(a not in (0, 1) for a in along):
        return False
    if any(_unit_step(sympy.sympify(e), r) == 1 for e in loads):
        return False
    return all(_unit_step(sympy.sympify(st.index), i) == 1 for st in k.stores)


ROW_CACHE = 4096  # the longest row (elements of the one reduce loop) whose values a pass may keep for the next


def _row_caches(k: K.Reduce) -> dict[K.Value, int]:
    """Values a reduction pass computes that a later pass or the row stores use again, each with the step
    that keeps it in a row array: layer norm's ``x = a + bias + residual`` (summed for the mean, then read
    for the variance and the output) or softmax's ``exp(x - max)`` (summed, then divided by the sum). The
    later passes read the array instead of loading, gathering and computing again -- 3x on BERT's
    embedding + layer norm, where every pass gathered the rows of three tables. Only over one reduce loop of
    at most ROW_CACHE elements (the arrays live on the stack), and only values worth more than a load."""
    if len(k.reduce_ranges) != 1:
        return {}
    n = sympy.sympify(k.reduce_ranges[0])
    if not (n.is_Integer and 1 < int(n) <= ROW_CACHE):
        return {}
    r = K.loop_var("r", 0)
    out: dict[K.Value, int] = {}
    for j, step in enumerate(k.steps):
        after: set[K.Value] = set()
        for v in [s.value for s in k.steps[j + 1 :]] + [st.value for st in k.row_stores]:
            after.update(K.walk(v))
        safe = _unmasked([step.value])
        found = [v for v in K.walk(step.value) if v in safe and v in after and v not in out and _worth_keeping(v, r)]
        inner = {c for v in found for c in K.walk(v) if c is not v}
        out.update((v, j) for v in found if v not in inner)
    return out


def _worth_keeping(v: K.Value, r: sympy.Symbol) -> bool:
    """``v`` varies along the reduce loop and costs more than reading it back (not a plain load)."""
    if isinstance(v, K.Const | K.Index | K.ReduceRef | K.Masked) or v.dtype is DType.bool:
        return False
    if isinstance(v, K.Load) and isinstance(v.index, K.Index):
        return False
    return any(isinstance(c, K.Index) and r in sympy.sympify(c.expr).free_symbols for c in K.walk(v))


def _lane_free(v: K.Value, lane: sympy.Symbol) -> bool:
    """``v`` reads no buffer and no index that varies with ``lane``."""
    for n in K.walk(v):
        if isinstance(n, K.Load | K.Acc | K.ReduceRef | K.Prefix | K.Masked):
            return False
        if isinstance(n, K.Index) and lane in sympy.sympify(n.expr).free_symbols:
            return False
    return True


def _reduce_init(step: K.Reduction) -> str:
    vt = vtype(step.dtype)
    if step.op is Op.SUM:
        return f"static_cast<{vt}>(0)"
    if step.dtype.is_float:
        return f"{'-' if step.op is Op.RMAX else ''}static_cast<{vt}>(INFINITY)"
    return f"std::numeric_limits<{vt}>::{'lowest' if step.op is Op.RMAX else 'max'}()"
