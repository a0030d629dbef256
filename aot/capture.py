"""model.py -> torch.export -> core ATen ExportedProgram.

Loads the user's model.py: it defines ``model`` (an ``nn.Module``) or ``get_model()``, and ``example_inputs``
(a tuple) or ``get_example_inputs()``, optionally ``dynamic_shapes`` in torch.export's form; ``--entry`` and
``--inputs-entry`` name other attributes. Exports it and decomposes to core ATen. Export failures become
``CaptureError`` naming the cause and the user's source line, not a torch traceback.
What it is not: lowering; the ExportedProgram goes to ``aotc_build.lower`` as it is.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import re
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from aotc.errors import CaptureError, UsageError

from .flags import check_dynamic, syntax_message

log = logging.getLogger("aotc.capture")


@dataclass
class Captured:
    program: torch.export.ExportedProgram
    model: torch.nn.Module
    example_inputs: tuple[Any, ...]
    dims: dict[tuple[str, int], tuple[str, int, int | None]]  # (input name, axis) -> the user's Dim: name, min, max
    name: str
    source_sha256: str
    path: Path
    output_names: list[str] = field(default_factory=list)  # from the output pytree: "last_hidden_state", ...
    returns: str = "tuple"  # "dict" when forward() returned outputs by name (dict, named tuple, dataclass)


def _load_module(path: Path) -> Any:
    if not path.is_file():
        raise UsageError(f"model file {str(path)!r} does not exist: pass the path of a model.py")
    name = "aotc_user_" + re.sub(r"\W", "_", path.stem)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UsageError(f"cannot import {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent.resolve()))
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:  # the user's to fix: shown with its caret, exit 2
        raise UsageError(syntax_message(path, e)) from None
    except Exception as e:
        raise CaptureError(f"importing {path} failed: {type(e).__name__}: {e}\n{_user_frame(e, path)}") from None
    finally:
        sys.path.pop(0)
    return module


def _pick(module: Any, path: Path, override: str | None, names: tuple[str, str], what: str) -> Any:
    candidates = (override,) if override else names
    for n in candidates:
        if n and hasattr(module, n):
            obj = getattr(module, n)
            is_factory = n.startswith("get_") or (override is not None and callable(obj) and not isinstance(obj, torch.nn.Module))
            return obj() if is_factory else obj
    raise UsageError(
        f"{path} defines none of {', '.join(c for c in candidates if c)}: define {what} "
        f"(or pass --entry/--inputs-entry to name it)"
    )


def _user_frame(exc: BaseException, path: Path) -> str:
    """The deepest traceback frame inside the user's file, as 'file:line: code'."""
    found = ""
    for fs in traceback.extract_tb(exc.__traceback__):
        if Path(fs.filename).resolve() == path.resolve():
            found = f"  at {path.name}:{fs.lineno}: {fs.line}"
    if not found:
        m = re.search(rf'File "([^"]*{re.escape(path.name)})", line (\d+)', str(exc))
        if m:
            found = f"  at {path.name}:{m.group(2)}"
    return found


def _declared_dims(dynamic_shapes: Any, input_names: list[str]) -> dict[tuple[str, int], tuple[str, int, int | None]]:
    """(input name, axis) -> (Dim name, min, max or None) for every named Dim in dynamic_shapes."""
    out: dict[tuple[str, int], tuple[str, int, int | None]] = {}
    if dynamic_shapes is None:
        return out
    items: list[tuple[str, Any]]
    items = list(dynamic_shapes.items()) if isinstance(dynamic_shapes, dict) else list(zip(input_names, dynamic_shapes, strict=False))
    for name, spec in items:
        if isinstance(spec, dict):
            for axis, dim in spec.items():
                label = getattr(dim, "__name__", None)
                if label:
                    out[(name, int(axis))] = (str(label), int(getattr(dim, "min", 0)), finite(getattr(dim, "max", None)))
    return out


def finite(hi: Any) -> int | None:
    """A Dim's max as an int, or None when unbounded (torch's ``int_oo`` claims ``is_finite`` and fails ``int()``)."""
    if hi is None:
        return None
    try:
        return int(hi)
    except (TypeError, ValueError, AttributeError, OverflowError):
        return None


def parse_dynamic(specs: tuple[str, ...], example_inputs: tuple[Any, ...], names: list[str]) -> dict[str, Any]:
    """``--dynamic input:axis:label[:min:max]`` flags -> torch.export dynamic_shapes. The syntax is checked
    before capture (``flags.check_dynamic``); what needs the model (its input names and ranks) is checked here."""
    out: dict[str, dict[int, Any]] = {}
    dims: dict[str, Any] = {}
    for s, spec in zip(specs, check_dynamic(specs), strict=True):
        if spec.input not in names:
            raise UsageError(f"--dynamic {s!r}: the model has no input {spec.input!r} (inputs: {', '.join(names)})")
        x = example_inputs[names.index(spec.input)]
        if spec.axis >= x.dim():
            raise UsageError(f"--dynamic {s!r}: input {spec.input!r} has {x.dim()} axes {list(x.shape)}; use an axis below {x.dim()}")
        size = int(x.shape[spec.axis])
        if size < spec.min or (spec.max is not None and size > spec.max):
            rng = f"[{spec.min}, {'inf' if spec.max is None else spec.max}]"
            raise UsageError(f"--dynamic {s!r}: the example input's size {size} on axis {spec.axis} is outside {rng}; widen the range")
        if size < 2:
            raise UsageError(f"--dynamic {s!r}: example size {size} on axis {spec.axis}: use an example size >= 2 to keep it dynamic")
        kw = {"min": spec.min} if spec.max is None else {"min": spec.min, "max": spec.max}
        dim = dims.setdefault(spec.label, torch.export.Dim(spec.label, **kw))  # one label, one symbol
        out.setdefault(spec.input, {})[spec.axis] = dim
    return out


def _forward_names(model: torch.nn.Module, n: int) -> list[str]:
    import inspect

    params = list(inspect.signature(model.forward).parameters)
    return params[:n] if len(params) >= n else [f"input{i}" for i in range(n)]


def capture(
    path: Path,
    entry: str | None = None,
    inputs_entry: str | None = None,
    dynamic: tuple[str, ...] = (),
    precision: str = "fp32",
) -> Captured:
    path = Path(path)
    module = _load_module(path)
    model = _pick(module, path, entry, ("model", "get_model"), "`model` (an nn.Module) or `get_model()`")
    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"{path}: the model entry is a {type(model).__name__}, not a torch.nn.Module")
    inputs = _pick(
        module, path, inputs_entry, ("example_inputs", "get_example_inputs"),
        "`example_inputs` (a tuple) or `get_example_inputs()`",
    )  # fmt: skip
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    inputs = tuple(inputs)
    for i, x in enumerate(inputs):
        if not isinstance(x, torch.Tensor):
            raise UsageError(f"{path}: example input {i} is a {type(x).__name__}; aotc takes tensors only")
    return capture_module(
        model, inputs, getattr(module, "dynamic_shapes", None), dynamic=dynamic, precision=precision,
        name=path.stem, source_sha256=hashlib.sha256(path.read_bytes()).hexdigest(), path=path,
    )  # fmt: skip


def capture_module(
    model: torch.nn.Module,
    inputs: tuple[Any, ...],
    dynamic_shapes: Any = None,
    *,
    dynamic: tuple[str, ...] = (),
    precision: str = "fp32",
    name: str = "model",
    source_sha256: str = "",
    path: Path | None = None,
) -> Captured:
    """Export an in-memory module (the part of ``capture`` after loading model.py)."""
    model.eval()
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    if half is not None:  # the whole model in that type; integer inputs (token ids) stay as they are
        model = model.to(half)
        inputs = tuple(x.to(half) if x.is_floating_point() else x for x in inputs)
    config = getattr(model, "config", None)
    if getattr(config, "use_cache", False):
        # transformers models return a KV cache object (DynamicCache) that torch.export cannot flatten, and a
        # package returns tensors only: build the model without it, as `use_cache=False` would.
        config.use_cache = False  # type: ignore[union-attr]
        log.info("capture: set model.config.use_cache = False (a package does not return KV caches)")
    names = _forward_names(model, len(inputs))
    if dynamic:
        dynamic_shapes = parse_dynamic(dynamic, inputs, names)
    where = path or Path(f"{name}.py")
    declared = _declared_dims(dynamic_shapes, names)
    try:
        with torch.no_grad():
            try:
                ep = _export(model, inputs, dynamic_shapes, declared, names)
            except Exception as e:
                if not ("not a known type" in str(e) and _register_output_dataclasses(model, inputs)):
                    raise
                ep = _export(model, inputs, dynamic_shapes, declared, names)
            ep = ep.run_decompositions(_decompositions())
    except Exception as e:
        raise CaptureError(_explain(e, where)) from None
    return Captured(
        program=ep,
        model=model,
        example_inputs=inputs,
        dims=declared,
        name=name,
        source_sha256=source_sha256,
        path=where,
        output_names=_output_names(ep),
        returns=_returns(ep),
    )


def _register_output_dataclasses(model: torch.nn.Module, inputs: tuple[Any, ...]) -> bool:
    """A forward() that returns a dataclass of tensors: register its class with torch.export (the user would
    have to otherwise) so its fields become named outputs. Runs the model once, eagerly, only after export
    refused the output; True when there was something to register."""
    import dataclasses

    out = model(*inputs)
    cls = type(out)
    if not (dataclasses.is_dataclass(out) and not isinstance(out, type)):
        return False
    try:
        torch.export.register_dataclass(cls)
    except ValueError:  # registered already, so not the cause
        return False
    log.info("capture: registered the output dataclass %s with torch.export", cls.__qualname__)
    return True


def _returns(ep: Any) -> str:
    """``"dict"`` when every output sits under a name at the top of the output pytree (a dict, a named tuple, a
    registered dataclass, a transformers ModelOutput), else ``"tuple"``."""
    import torch.utils._pytree as pytree

    spec = ep.call_spec.out_spec
    if spec is None or spec.num_leaves == 0:
        return "tuple"
    paths = [p for p, _ in pytree.tree_flatten_with_path(pytree.tree_unflatten([0] * spec.num_leaves, spec))[0]]
    named = all(p and not isinstance(p[0], pytree.SequenceKey) for p in paths)
    fallback = [f"output{k}" for k in range(len(paths))]  # what _output_names gives when keys collide
    return "dict" if named and _output_names(ep) != fallback else "tuple"


def _output_names(ep: Any) -> list[str]:
    """Names for the flattened outputs from their pytree paths: a ModelOutput's or dict's keys, dotted through
    nesting ("last_hidden_state", "pooler_output"); bare tensors and tuples of them stay output0, output1, ..."""
    import torch.utils._pytree as pytree

    spec = ep.call_spec.out_spec
    if spec is None:
        return []
    paths = [p for p, _ in pytree.tree_flatten_with_path(pytree.tree_unflatten([0] * spec.num_leaves, spec))[0]]
    names = []
    for k, path in enumerate(paths):
        if all(isinstance(e, pytree.SequenceKey) for e in path):
            names.append(f"output{k}")
            continue
        parts = [str(getattr(e, "key", getattr(e, "name", getattr(e, "idx", "")))) for e in path]
        names.append(re.sub(r"[^A-Za-z0-9_.]", "_", ".".join(parts)))
    return names if len(set(names)) == len(names) else [f"output{k}" for k in range(len(names))]


def _export(model: torch.nn.Module, inputs: tuple[Any, ...], dynamic_shapes: Any, declared: dict, names: list[str]) -> Any:
    """torch.export with the declared dims. Some torch releases (2.11) cannot prove guards that hold over the
    whole declared range, e.g. ``min(16*seq, 32*seq) == 16*seq`` in transformers' Llama, and report a violated
    constraint. Then export again with each dim as ``Dim.AUTO`` over the same range and keep that program only
    if every declared dim is still its own free symbol over at least the declared range; a real
    specialisation fails that check and the first error stands."""
    try:
        return torch.export.export(model, inputs, dynamic_shapes=dynamic_shapes)
    except Exception as e:
        if dynamic_shapes is None or "Constraints violated" not in str(e):
            raise
        first = e
    try:
        ep = torch.export.export(model, inputs, dynamic_shapes=_as_auto(dynamic_shapes))
    except Exception:
        raise first from None
    if not _keeps_declared_dims(ep, declared, names):
        raise first
    return ep


def _as_auto(spec: Any) -> Any:
    if isinstance(spec, dict):
        return {k: _as_auto(v) for k, v in spec.items()}
    if isinstance(spec, (tuple, list)):
        return type(spec)(_as_auto(v) for v in spec)
    if getattr(spec, "__name__", None) and hasattr(spec, "min") and hasattr(spec, "max"):  # a named Dim
        return torch.export.Dim.AUTO(min=spec.min, max=spec.max)
    return spec


def _keeps_declared_dims(ep: Any, declared: dict, names: list[str]) -> bool:
    import sympy

    user = [s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    shapes = {n.name: n.meta["val"].shape for n in ep.graph.nodes if n.op == "placeholder"}
    symbol_of: dict[str, Any] = {}
    for (name, axis), (dim, lo, hi) in declared.items():
        if name not in names or names.index(name) >= len(user):
            return False
        size = shapes[user[names.index(name)]][axis]
        expr = size.node.expr if hasattr(size, "node") else size
        if not isinstance(expr, sympy.Symbol) or symbol_of.setdefault(dim, expr) != expr:
            return False
        vr = ep.range_constraints.get(expr)
        # AUTO dims start at 2 (torch traces 0 and 1 as general sizes, as it does for a named Dim(min=1))
        if vr is None or int(vr.lower) > max(lo, 2) or (hi is not None and (finite(vr.upper) or hi) < hi):
            return False
    return len(set(symbol_of.values())) == len(symbol_of)  # distinct declared dims stay distinct


def _decompositions() -> Any:
    """Core ATen, except ops aotc lowers whole: attention stays one op so fusion sees its structure
    (and torch's own SDPA decomposition fails on some transformers models with dynamic shapes)."""
    table = torch.export.default_decompositions()
    for op in (torch.ops.aten.scaled_dot_product_attention.default,):
        table.pop(op, None)
    return table


_CAUSES = (
    ("structure of `inputs` and `dynamic_shapes`", "dynamic_shapes does not match the model's inputs"),
    ("GuardOnDataDependentSymNode", "data-dependent control flow (a Python branch or size that depends on tensor values)"),
    ("data-dependent", "data-dependent control flow (a Python branch or size that depends on tensor values)"),
    ("Constraints violated", "a dynamic dimension was specialised by the model code"),
    ("graph break", "a graph break (code torch.export cannot trace)"),
    ("Unsupported", "code torch.export cannot trace"),
    ("fake", "an op with no fake-tensor (meta) implementation"),
)  # fmt: skip


def _explain(e: Exception, path: Path) -> str:
    text = str(e)
    cause = next((c for key, c in _CAUSES if key.lower() in text.lower()), "torch.export failed")
    first = text.strip().splitlines()[0] if text.strip() else type(e).__name__
    where = _user_frame(e, path)
    hint = "fix: rewrite that line to avoid it, or mark the dimension dynamic with a matching range"
    detail = ""
    if "data-dependent" in cause:
        hint = ("fix: compute both branches and pick with torch.where(cond, a, b), or use "
                "torch.cond(pred, true_fn, false_fn, operands); a shape must not depend on tensor values")  # fmt: skip
    if "Cache" in text and "not a known type" in text:
        cause = "the model returns a cache object (e.g. transformers' DynamicCache), not tensors"
        hint = "fix: build the model with use_cache=False (model.config.use_cache = False), or return only tensors"
    if "structure of `inputs` and `dynamic_shapes`" in text:
        hint = ("fix: give dynamic_shapes one entry per forward() argument, in order (a tuple) or by name (a dict); "
                "an argument gathered by *args takes a tuple of entries")  # fmt: skip
    if "Constraints violated" in text:
        # torch's own account: which dimension, what the code required, and its suggested Dim ranges
        lines = [ln.rstrip() for ln in text.strip().splitlines()[1:]]
        keep = [ln for ln in lines if ln.startswith("  ") or ln.startswith("Suggested fixes")][:12]
        detail = "".join(f"\n  {ln}" for ln in keep)
        hint = "fix: adjust dynamic_shapes (or --dynamic) to torch's suggested fixes above"
    return f"cannot capture {path.name}: {cause}.\n  {type(e).__name__}: {first}{detail}\n{where}\n  {hint}".rstrip()
