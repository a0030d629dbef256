"""Memory planning: arena buffers -> byte offsets in one arena, reusing slots whose lifetimes ended.

Sizes are symbolic, so a slot's size is the Max over the buffers it holds; offsets are prefix sums.
The runtime (and generated C++) evaluates them per call, so one plan serves the whole dynamic range.
Note: a kernel never writes a slot that one of its own inputs occupies (no in-place reuse), because
templates read operands while they write results.
What it is not: fusion; ``plan_memory`` takes a finished Program and returns a Plan, changing neither.
"""

from __future__ import annotations

import sympy

from . import kernel as K

ALIGN = 64


def _align(e: sympy.Expr | int) -> sympy.Expr | int:
    e = sympy.sympify(e)
    coeff, _ = e.as_coeff_Mul() if not e.is_Add else (sympy.Integer(0), e)
    if e.is_Integer:
        return -(-int(e) // ALIGN) * ALIGN
    if e.is_Mul and coeff.is_Integer and int(coeff) % ALIGN == 0:
        return e
    return sympy.ceiling(e / ALIGN) * ALIGN


def _block_input(e: K.Kernel, d: K.Kernel, p: K.Kernel) -> str | None:
    """The input of a 1x1 conv -> depthwise conv -> conv chain, each reading the one before: an inverted-
    residual block, which the CPU code may run as one function (codegen/cpp_block.py) whose first stage
    reads its input until the last stage has written its output. That input lives until the last stage,
    so that the output never takes its bytes (else the block would run as three kernels). None for other
    kernels."""
    if not (isinstance(e, K.Conv) and isinstance(d, K.Conv) and isinstance(p, K.Conv)):
        return None
    chain = e.kernel == (1, 1) and d.groups == d.c_in == d.c_out > 1 and d.x.buf in K.writes(e) and p.x.buf in K.writes(d)
    return e.x.buf if chain else None


def plan_memory(prog: K.Program) -> K.Plan:
    """The Program with an offset for each arena buffer (a new Plan; ``prog`` stays as it was)."""
    arena = {b.name: b for b in prog.arena}
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for t, k in enumerate(prog.kernels):
        for name in K.writes(k):
            if name in arena:
                first.setdefault(name, t)
                last[name] = max(last.get(name, t), t)
        for name in K.reads(k):
            if name in arena:
                last[name] = t
    for t in range(len(prog.kernels) - 2):
        x = _block_input(*prog.kernels[t : t + 3])
        if x is not None and x in last:
            last[x] = max(last[x], t + 2)
    slots: list[list] = []  # [size, busy_until]
    where: dict[str, int] = {}
    for t, k in enumerate(prog.kernels):
        for name in sorted(K.writes(k)):
            if name not in arena or name in where:
                continue
            size = _align(arena[name].nbytes())
            free = [s for s in range(len(slots)) if slots[s][1] < t]
            exact = [s for s in free if sympy.expand(sympy.sympify(slots[s][0]) - size) == 0]
            if exact:
                s = exact[0]
            elif free:
                s = free[0]
                slots[s][0] = sympy.Max(slots[s][0], size)
            else:
                slots.append([size, -1])
                s = len(slots) - 1
            slots[s][1] = last[name]
            where[name] = s
    offsets: list[sympy.Expr | int] = []
    acc: sympy.Expr | int = 0
    for size, _ in slots:
        offsets.append(acc)
        acc = sympy.sympify(acc + size)
    return K.Plan.of(prog, {name: offsets[s] for name, s in sorted(where.items())}, acc)
