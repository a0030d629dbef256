"""C++ code generation: ``kernel.Program`` -> one translation unit implementing ``aotc_abi.h``.

What it is: a printer. Each kernel becomes one ``static void`` function (pointwise and reduction loop
nests written here, their outer loops one flat loop on the thread pool of ``aotc_pool.h``, the inner
ones ``omp simd``; matmul and conv call the templates in ``cpp_templates/`` with a generated epilogue
lambda, the conv ones printed by cpp_conv.py), and ``aotc_run`` binds the ABI's pointer arrays to buffers
and calls the kernels in order.
Values inside the loops (types, the op table, CSE'd temporaries) are spelled by cpp_values.py.
What it is not: an optimiser. Fusion, layouts and the memory plan are decided before; index
simplification is sympy's. The op table (``UNARY``/``BINARY`` in cpp_values.py) is the only place that
knows C spellings.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack
from functools import partial

import sympy
from aotc.schema import INTERFACE_MARK

from .. import kernel as K
from ..ir import DType
from ..options import BuildOptions
from ..symbolic import to_c
from .cpp_block import find_blocks
from .cpp_conv import ConvEmitter, block_function
from .cpp_reduce import ReduceEmitter
from .cpp_values import ACC_DTYPE, STORAGE, Kctx, Values, acc_type, operand_ptr, vtype
from .writer import Writer

HEADERS = ("aotc_abi.h", "aotc_cpu.h")
INDENT = "  "  # one level of generated C++

# ---- kernels ---------------------------------------------------------------------------------------------


def cstring(text: str) -> str:
    """A C string literal (escapes quotes, backslashes and control characters)."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 32 or ord(ch) > 126:
            out.append("".join(f"\\x{b:02x}" for b in ch.encode()) + '""')
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _ident(text: str) -> str:
    s = re.sub(r"\W", "_", text)
    return s if s and not s[0].isdigit() else "_" + s


def _loads(v: K.Value) -> Iterator[str]:
    for n in K.walk(v):
        if isinstance(n, K.Load):
            yield n.buf


def kernel_buffers(k: K.Kernel) -> tuple[list[str], set[str]]:
    """Buffers a kernel touches, in first-use order, and the set it writes."""
    reads: list[str] = []
    writes: list[str] = []
    if isinstance(k, K.Matmul):
        reads += [k.a.buf, k.b.buf]
    if isinstance(k, K.Conv):
        reads += [k.x.buf, k.w.buf]
        if k.pool is not None:
            reads += _loads(k.pool.pre)
    if isinstance(k, K.Attention):
        reads += [op.buf for op in k.operands]
    if isinstance(k, K.Reduce):
        for step in k.steps:
            reads += _loads(step.value)
    if isinstance(k, K.Scan):
        reads += _loads(k.value)
    for st in K.stores(k):
        reads += _loads(st.value)
        writes.append(st.buf)
    order = list(dict.fromkeys(reads + writes))
    return order, set(writes)


class KernelWriter(ReduceEmitter, ConvEmitter):
    """Writes one kernel function."""

    def __init__(self, prog: K.Program, k: K.Kernel, fname: str, ptrs: dict[str, str], numel: dict[str, str]) -> None:
        self.prog = prog
        self.k = k
        self.fname = fname
        self.w = Writer(INDENT)
        self.bufs, self.written = kernel_buffers(k)
        dtypes = {b: prog.buffer(b).dtype for b in self.bufs}
        self.ctx = Kctx(k.name, {b: ptrs[b] for b in self.bufs}, numel, dtypes)
        self.vals = Values(self.w, self.ctx)

    def params(self) -> list[str]:
        out = [f"[[maybe_unused]] const int64_t {s.name}" for s in self.prog.symbols]
        for b in self.bufs:
            buf = self.prog.buffer(b)
            const = "" if b in self.written else "const "
            out.append(f"{const}{STORAGE[buf.dtype]}* {self.ctx.bufs[b]}")
        return out

    def write(self) -> str:
        body = Writer(INDENT, depth=1)
        self.w = body
        self.vals.w = body
        emit = {
            K.Pointwise: self._pointwise, K.Reduce: self._reduce, K.Matmul: self._matmul,
            K.Conv: self._conv, K.Scan: self._scan, K.Attention: self._attention,
        }[type(self.k)]  # fmt: skip
        emit()
        out = Writer(INDENT)
        with out.block(f"static void {self.fname}({', '.join(self.params())})"):
            if self.k.has_gather:
                out.line("int64_t aotc_bad = 0;  // set by an out-of-range gather index")
            out.extend(body.lines)
            if self.k.has_gather:
                bufs = ", ".join(self.ctx.checked)
                msg = f"kernel {self.k.name}: a gather index is out of range (reading {bufs})"
                with out.block("if (aotc_bad)"):
                    out.line(f"throw std::out_of_range({cstring(msg)});")
        return out.text()

    def _omp(self, text: str) -> str:
        """An OpenMP pragma line (``simd``); in a kernel that gathers it also ORs the lanes' ``aotc_bad``."""
        return f"#pragma omp {text}{' reduction(|:aotc_bad)' if self.k.has_gather else ''}"

    def _parallel_for(self, stack: ExitStack, sizes: list[str], names: list[str], work: str) -> None:
        """Loops ``names`` over ``sizes`` as one flat loop on the thread pool (aotc_pool_loop.h): the pool takes
        the flat index range in chunks, each chunk recovers its loop variables from the flat index. Threads
        by work (aotc_threads_for: one per AOTC_PAR_MIN_WORK elements). In a kernel that gathers, each chunk
        keeps its own ``aotc_bad`` and ORs it into the kernel's at its end."""
        tasks = " * ".join(sizes)
        if self.k.has_gather:
            self.w.line("int64_t* const aotc_bad_all = &aotc_bad;")
        head = f"aotc_parallel_for({tasks}, {work}, [&](int64_t aotc_t0, int64_t aotc_t1)"
        stack.enter_context(self.w.block(head, "});"))
        self._local_pointers(stack)
        if self.k.has_gather:
            self.w.line("int64_t aotc_bad = 0;")
            stack.callback(lambda: self.w.line("if (aotc_bad) __atomic_store_n(aotc_bad_all, 1, __ATOMIC_RELAXED);"))
        stack.enter_context(self._for("aotc_t", "aotc_t1", "aotc_t0"))
        self._batch_vars(sizes, "aotc_t", names)

    def _local_pointers(self, stack: ExitStack) -> None:
        """Copy the buffer pointers into locals of the loop body (``l_`` + name) and print through those
        until ``stack`` closes. Note: the body captures them by reference, so each use is a load through the
        closure; under a mask (a padded window, a pool's border) that load is conditional, g++ cannot hoist
        it, and the loop stays scalar -- a 3x3 max-pool over NHWC ran 7x slower for it."""
        saved = dict(self.ctx.bufs)
        for b in self.bufs:
            const = "" if b in self.written else "const "
            self.w.line(f"[[maybe_unused]] {const}{STORAGE[self.prog.buffer(b).dtype]}* const l_{saved[b]} = {saved[b]};")
            self.ctx.bufs[b] = f"l_{saved[b]}"
        stack.callback(self.ctx.bufs.update, saved)

    # -- loop helpers --

    def _sizes(self, prefix: str, ranges: Sequence[sympy.Expr | int]) -> list[str]:
        names = []
        for j, r in enumerate(ranges):
            names.append(f"aotc_{prefix}{j}")
            self.w.line(f"const int64_t aotc_{prefix}{j} = {to_c(r)};")
        return names

    def _for(self, var: str, n: str, lo: str = "0") -> AbstractContextManager[None]:
        return self.w.block(f"for (int64_t {var} = {lo}; {var} < {n}; ++{var})")

    def _outer(self, stack: ExitStack, sizes: list[str], work: str) -> None:
        """Parallel loops i0.. over ``sizes`` (one plain block when there are none)."""
        if not sizes:
            stack.enter_context(self.w.block("do", "} while (0);"))
            return
        self._parallel_for(stack, sizes, [f"i{j}" for j in range(len(sizes))], work)

    def _work(self, sizes: Sequence[str]) -> str:
        return " * ".join(sizes) if sizes else "1"

    # -- pointwise --

    def _pointwise(self) -> None:
        k = self.k
        assert isinstance(k, K.Pointwise)
        sizes = self._sizes("n", k.ranges)
        roots = [st.value for st in k.stores]
        if not sizes:
            with self.w.block("do", "} while (0);"), self.vals.scope(roots):
                for st in k.stores:
                    self.vals.store(st)
            return
        last = len(sizes) - 1
        self.w.line(f"const int64_t aotc_chunks = aotc_ceildiv({sizes[last]}, AOTC_CHUNK);")
        outer = [*sizes[:last], "aotc_chunks"]
        with ExitStack() as stack:
            self._parallel_for(stack, outer, [*(f"i{j}" for j in range(last)), "aotc_c"], self._work(sizes))
            self.w.line("const int64_t aotc_lo = aotc_c * AOTC_CHUNK;")
            self.w.line(f"const int64_t aotc_hi = aotc_min(aotc_lo + AOTC_CHUNK, {sizes[last]});")
            self.w.line(self._omp("simd"))
            stack.enter_context(self._for(f"i{last}", "aotc_hi", "aotc_lo"))
            stack.enter_context(self.vals.scope(roots))
            for st in k.stores:
                self.vals.store(st)

    # -- matmul --

    def _batch_vars(self, sizes: list[str], flat: str, names: Sequence[str] | None = None) -> None:
        """Split flat index ``flat`` into ``names`` (default i0..) over ``sizes`` (row-major)."""
        names = names or [f"i{j}" for j in range(len(sizes))]
        rest = flat
        for j in range(len(sizes) - 1, -1, -1):
            if j == 0:
                self.w.line(f"[[maybe_unused]] const int64_t {names[0]} = {rest};")
            else:
                self.w.line(f"[[maybe_unused]] const int64_t {names[j]} = {rest} % {sizes[j]};")
                rest = f"({rest} / {sizes[j]})"

    def _offset_fn(self, expr: sympy.Expr | int, sizes: list[str]) -> str:
        if not sizes:
            return f"[](int64_t) -> int64_t {{ return {to_c(expr)}; }}"
        inner = Writer(INDENT)
        saved = self.w
        self.w = inner
        self._batch_vars(sizes, "aotc_b")
        self.w = saved
        body = " ".join(line.strip() for line in inner.lines)
        return f"[=](int64_t aotc_b) -> int64_t {{ {body} return {to_c(expr)}; }}"

    def _matmul(self) -> None:
        k = self.k
        assert isinstance(k, K.Matmul)
        nb = len(k.batch)
        sizes = self._sizes("b", k.batch)
        for name, e in (("M", k.m), ("N", k.n), ("K", k.k)):
            self.w.line(f"const int64_t aotc_{name} = {to_c(e)};")
        at = acc_type(k.a.dtype, k.b.dtype)
        a, b = k.a, k.b
        self.ctx.acc_dtype = ACC_DTYPE[at]
        self.w.line("[[maybe_unused]] int64_t aotc_bad_epi = 0;")
        if k.packed:  # b: panels packed at build time (codegen/cpp_pack.py) for this level's micro-kernel
            nr = to_c(b.strides[0])
            ok = f"{nr} * 4 == 2 * AOTC_VBYTES || {nr} * 4 == 3 * AOTC_VBYTES"
            self.w.line(f'static_assert({ok}, "weights packed for another panel width");')
            nv = f"{nr} * 4 / AOTC_VBYTES"
            # a bf16 weight stays bf16 only as pairs (cpp_pack.py's bf16_pairs), for matmul_bf16.h
            call = f"aotc_matmul_packed_bf16<{nv}>" if b.dtype is DType.bf16 else f"aotc_matmul_packed<{at}, {nv}>"
        else:
            call = f"aotc_matmul<{at}>"
        self.w.line(f"{call}({self._work(sizes)}, aotc_M, aotc_N, aotc_K,")
        with self.w.indent(2):  # the template's arguments continue its call
            self.w.line(f"{operand_ptr(self.ctx.bufs[a.buf], a.dtype)}, {self._offset_fn(a.offset, sizes)},")
            self.w.line(f"{to_c(a.strides[0])}, {to_c(a.strides[1])},")
            if k.packed:
                self.w.line(f"{operand_ptr(self.ctx.bufs[b.buf], b.dtype)},")
            else:
                self.w.line(f"{operand_ptr(self.ctx.bufs[b.buf], b.dtype)}, {self._offset_fn(b.offset, sizes)},")
                self.w.line(f"{to_c(b.strides[0])}, {to_c(b.strides[1])},")
            head = (
                "[&](int64_t aotc_b, int64_t aotc_m0, int64_t aotc_mb, int64_t aotc_n0, int64_t aotc_nb, "
                f"const {at}* aotc_tile, int64_t aotc_ldt)"
            )
            m, n = f"i{nb}", f"i{nb + 1}"

            def tile() -> None:
                with self.w.block(f"for (int64_t {m} = aotc_m0; {m} < aotc_m0 + aotc_mb; ++{m})"):
                    self.w.line(f"const {at}* aotc_row = aotc_tile + ({m} - aotc_m0) * aotc_ldt;")
                    self.ctx.acc = f"aotc_row[{n} - aotc_n0]"
                    self.w.line(self._omp("simd"))
                    with self.w.block(f"for (int64_t {n} = aotc_n0; {n} < aotc_n0 + aotc_nb; ++{n})"):
                        self._epilogue()

            with self.w.block(head, "});"):
                self._batch_vars(sizes, "aotc_b")
                self._checked_epilogue(tile)
        if self.k.has_gather:
            self.w.line("if (aotc_bad_epi) aotc_bad = 1;")

    def _checked_epilogue(self, emit: Callable[[], None]) -> None:
        """Run ``emit`` (an epilogue inside a template's parallel region); if it gathers, give it a local
        ``aotc_bad`` and pass a failure out through the kernel's ``aotc_bad_epi``."""
        saved = self.w
        self.w = Writer(INDENT, saved.depth)
        self.vals.w = self.w
        emit()
        body, self.w = self.w, saved
        self.vals.w = saved
        if self.k.has_gather:
            self.w.line("int64_t aotc_bad = 0;")
        self.w.extend(body.lines)
        if self.k.has_gather:
            with self.w.block("if (aotc_bad)"):
                self.w.line("__atomic_store_n(&aotc_bad_epi, 1, __ATOMIC_RELAXED);")

    def _epilogue(self) -> None:
        k = self.k
        assert isinstance(k, K.Matmul | K.Conv | K.Attention)
        with self.vals.scope([st.value for st in k.stores]):
            for st in k.stores:
                self.vals.store(st)

    # -- attention --

    def _attention(self) -> None:
        k = self.k
        assert isinstance(k, K.Attention)
        nb = len(k.batch)
        sizes = self._sizes("b", k.batch)
        for name, e in (("L", k.q_len), ("S", k.kv_len), ("E", k.head_dim), ("Ev", k.v_dim)):
            self.w.line(f"const int64_t aotc_{name} = {to_c(e)};")
        self.ctx.acc_dtype = ACC_DTYPE["float"]
        head = f"i{nb - 1}"
        kv_head = sympy.Symbol("aotc_kvh", integer=True, nonnegative=True)

        def operand(op: K.Strided | None, kv: bool) -> str:
            if op is None:
                return "static_cast<const float*>(nullptr), [](int64_t) -> int64_t { return 0; }, 0, 0"
            expr = sympy.sympify(op.offset)
            if kv:  # k's and v's offsets name the kv head with the head variable
                expr = expr.subs(sympy.Symbol(head, integer=True, nonnegative=True), kv_head)
            fn = self._offset_fn(expr, sizes)
            if kv:
                fn = fn.replace(" return ", f" [[maybe_unused]] const int64_t aotc_kvh = {head} / {k.group}; return ", 1)
            ptr = operand_ptr(self.ctx.bufs[op.buf], op.dtype)
            return f"{ptr}, {fn}, {to_c(op.strides[0])}, {to_c(op.strides[1])}"

        kinds = {"none": 0, "bool": 1, "add": 2}
        self.w.line("[[maybe_unused]] int64_t aotc_bad_epi = 0;")
        scale = f"static_cast<float>({k.scale!r})"
        self.w.line(f"aotc_attention({self._work(sizes)}, aotc_L, aotc_S, aotc_E, aotc_Ev, {scale}, "
                    f"{'true' if k.causal else 'false'}, {kinds[k.mask_kind]},")  # fmt: skip
        with self.w.indent(2):
            self.w.line(f"{operand(k.q, False)},")
            self.w.line(f"{operand(k.k, True)},")
            self.w.line(f"{operand(k.v, True)},")
            self.w.line(f"{operand(k.mask, False)},")
            head_fn = "[&](int64_t aotc_b, int64_t aotc_l0, int64_t aotc_lb, const float* aotc_tile, int64_t aotc_ldt)"
            row, col = f"i{nb}", f"i{nb + 1}"

            def tile() -> None:
                with self.w.block(f"for (int64_t {row} = aotc_l0; {row} < aotc_l0 + aotc_lb; ++{row})"):
                    self.w.line(f"const float* aotc_row = aotc_tile + ({row} - aotc_l0) * aotc_ldt;")
                    self.ctx.acc = f"aotc_row[{col}]"
                    self.w.line(self._omp("simd"))
                    with self.w.block(f"for (int64_t {col} = 0; {col} < aotc_Ev; ++{col})"):
                        self._epilogue()

            with self.w.block(head_fn, "});"):
                self._batch_vars(sizes, "aotc_b")
                self._checked_epilogue(tile)
        if self.k.has_gather:
            self.w.line("if (aotc_bad_epi) aotc_bad = 1;")

    # -- scan --

    def _scan(self) -> None:
        k = self.k
        assert isinstance(k, K.Scan)
        sizes = self._sizes("n", k.ranges)
        self.w.line(f"const int64_t aotc_len = {to_c(k.length)};")
        at = "double" if k.dtype.is_float else "int64_t"
        work = self._work([*sizes, "aotc_len"])
        with ExitStack() as stack:
            self._outer(stack, sizes, work)
            self.w.line(f"{at} aotc_acc = 0;")
            stack.enter_context(self._for("r0", "aotc_len"))
            stack.enter_context(self.vals.scope([k.value, *(st.value for st in k.stores)]))
            x = self.vals.expr(k.value)
            self.w.line(f"aotc_acc += static_cast<{at}>({x});")
            self.ctx.prefix = f"static_cast<{vtype(k.dtype)}>(aotc_acc)"
            for st in k.stores:
                self.vals.store(st)


# ---- the translation unit --------------------------------------------------------------------------------


def _kernel_names(prog: K.Program) -> list[str]:
    out: list[str] = []
    used: set[str] = set()
    for k in prog.kernels:
        base = "aotc_k_" + _ident(k.name)
        name, j = base, 1
        while name in used:
            name, j = f"{base}_{j}", j + 1
        used.add(name)
        out.append(name)
    return out


def _pointer_names(prog: K.Program) -> dict[str, str]:
    out: dict[str, str] = {}
    used: set[str] = set()
    for b in (*prog.inputs, *prog.outputs, *prog.weights, *prog.arena):
        base = "p_" + _ident(b.name)
        name, j = base, 1
        while name in used:
            name, j = f"{base}_{j}", j + 1
        used.add(name)
        out[b.name] = name
    return out


def _numels(prog: K.Program) -> dict[str, str]:
    """Every buffer's element count as C, for bounds checks."""
    return {b.name: to_c(b.numel()) for b in (*prog.inputs, *prog.outputs, *prog.weights, *prog.arena)}


def _uses(prog: K.Program) -> set[str]:
    return {type(k).__name__ for k in prog.kernels}


def generate(prog: K.Plan, options: BuildOptions, interface: str | None = None) -> str:
    """The C++ source of one shared library running ``prog`` through the ABI in ``aotc_abi.h``.
    ``interface``: ``aotc.schema.interface_text`` of what it is built for, embedded for the runtime to check."""
    del options  # nothing in the generated text depends on them yet (the target is a compiler flag)
    ptrs = _pointer_names(prog)
    names = _kernel_names(prog)
    touched = {k.name: kernel_buffers(k) for k in prog.kernels}  # once: BERT-base has ~300 kernels
    numel = _numels(prog)
    for b in (*prog.inputs, *prog.weights):
        for k in prog.kernels:
            if b.name in touched[k.name][1]:
                raise ValueError(f"kernel {k.name} writes {b.kind} {b.name}, which is read-only")
    w = Writer(INDENT)
    w.line("// Generated by aotc (aot/codegen/cpp.py). Do not edit.")
    headers = [*HEADERS]
    uses = _uses(prog)
    if "Matmul" in uses or "Conv" in uses:
        headers.append("matmul.h")
    blocks = find_blocks(prog)
    if "Conv" in uses:
        headers.append("conv_dw.h" if blocks else "conv.h")
    if any(isinstance(k, K.Conv) and k.pool is not None for k in prog.kernels):
        headers.append("conv_pool.h")
    if any(isinstance(k, K.Conv) and k.wino for k in prog.kernels):
        headers.append("conv_wino.h")
    if "Attention" in uses:
        headers.append("attention.h")
    for h in headers:
        w.line(f'#include "{h}"')
    w.line()
    w.line("namespace {")
    w.line()
    calls: list[tuple[str, list[str]]] = []  # the function aotc_run calls and its buffers, in order
    skip = 0
    for j, (k, fname) in enumerate(zip(prog.kernels, names, strict=True)):
        if skip:
            skip -= 1
            continue
        if j in blocks:  # three kernels, one function
            call, skip = f"{fname}_block", 2
            stage = partial(KernelWriter, prog, fname=call, ptrs=ptrs, numel=numel)
            text, used = block_function(prog, blocks[j], call, ptrs, touched, stage)
        else:
            call, text, used = fname, KernelWriter(prog, k, fname, ptrs, numel).write(), touched[k.name][0]
        calls.append((call, used))
        w.extend(text.rstrip("\n").split("\n"))
        w.line()
    w.line("}  // namespace")
    w.line()
    w.line('#define AOTC_EXPORT extern "C" __attribute__((visibility("default")))')
    w.line()
    w.line("AOTC_EXPORT int32_t aotc_abi_version(void) { return AOTC_ABI_VERSION; }")
    w.line()
    w.line("AOTC_EXPORT void aotc_set_num_threads(int32_t n) { aotc_pool_set_threads(n); }")
    w.line()
    if interface is not None:
        w.line("// The sizes this code reads and writes; the runtime compares them with the manifest before dlopen.")
        w.line(f"AOTC_EXPORT __attribute__((used)) const char aotc_interface[] = {cstring(INTERFACE_MARK.decode() + interface)};")
        w.line()
    sig = (
        "AOTC_EXPORT int32_t aotc_run(const int64_t* syms, const void* const* inputs, void* const* outputs, "
        "const void* const* weights, void* arena, char* err, size_t errlen)"
    )
    with w.block(sig):
        w.line("(void)syms; (void)inputs; (void)outputs; (void)weights; (void)arena;")
        w.line(f"const aotc_pool_call aotc_call(aotc_pool_key(syms, {len(prog.symbols)}));  // threads and their policy, per call")
        with w.block("try"):
            for j, s in enumerate(prog.symbols):
                w.line(f"const int64_t {s.name} = syms[{j}];")
            groups = (("inputs", prog.inputs, True), ("outputs", prog.outputs, False),
                      ("weights", prog.weights, True))  # fmt: skip
            for arr, bufs, const in groups:
                for j, b in enumerate(bufs):
                    t = ("const " if const else "") + STORAGE[b.dtype]
                    w.line(f"{t}* {ptrs[b.name]} = static_cast<{t}*>({arr}[{j}]);")
            for b in prog.arena:
                off = to_c(prog.arena_offsets.get(b.name, 0))
                t = STORAGE[b.dtype]
                w.line(f"{t}* {ptrs[b.name]} = reinterpret_cast<{t}*>(static_cast<char*>(arena) + {off});")
            for fname, used in calls:
                args = [s.name for s in prog.symbols] + [ptrs[b] for b in used]
                w.line(f"{fname}({', '.join(args)});")
            w.line("return 0;")
        with w.block("catch (const std::exception& e)"):
            w.line("aotc_set_error(err, errlen, e.what());")
            w.line("return AOTC_ERR_EXCEPTION;")
        with w.block("catch (...)"):
            w.line('aotc_set_error(err, errlen, "unknown C++ exception");')
            w.line("return AOTC_ERR_UNKNOWN;")
    return w.text()
