"""Run an aotc package inside Triton Inference Server, as a Python-backend model.

    python -m aotc.serve.triton_backend mlp.pkg model_repository/       # writes model_repository/mlp/...
    tritonserver --model-repository model_repository

What it is: ``TritonPythonModel`` (the Python backend's model class: ``initialize`` loads the package,
``execute`` runs the requests Triton hands it, batched along the package's batch axis the way
``aotc serve`` batches them, ``finalize`` unloads it) and ``write_model`` (lays out ``NAME/config.pbtxt``,
``NAME/1/model.py`` and ``NAME/1/model.pkg`` for a model repository). ``triton_python_backend_utils`` is
imported only inside the backend's calls: this module imports in any environment.
What it is not: a Triton server. The backend runs in the ``python`` backend's stub process, which must have
``aotc`` installed (the runtime only: numpy, cffi, ml_dtypes, click).

Note: when the package can batch (``batching.batch_symbol``), the config declares ``max_batch_size`` as the
batch range's top (or ``--max-batch``) and the tensors' dims without the batch axis, and turns on Triton's
dynamic batcher; ``execute`` then concatenates the requests of one call that share their other sizes.
Otherwise ``max_batch_size`` is 0 and the dims are the full shapes (-1 for a dynamic size).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import AotcError
from ..loading import load
from ..model import Model
from ..package import Package
from ..schema import Manifest, TensorSpec
from .batching import batch_key, batch_symbol, run_batch
from .protocol import WIRE

PACKAGE_PARAMETER = "aotc_package"  # config.pbtxt parameter: the package path, relative to the version folder
MODEL_PY = "from aotc.serve.triton_backend import TritonPythonModel  # noqa: F401  (Triton's python backend loads this class)\n"


def _utils() -> Any:
    import triton_python_backend_utils  # only inside Triton's python backend

    return triton_python_backend_utils


class TritonPythonModel:
    """The Python backend's model: one aotc package per model instance."""

    model: Model
    max_rows: int

    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        param = config.get("parameters", {}).get(PACKAGE_PARAMETER, {}).get("string_value", "model.pkg")
        path = Path(args["model_repository"]) / str(args["model_version"]) / param
        kind = args.get("model_instance_kind", "CPU")
        device = f"cuda:{args.get('model_instance_device_id', '0')}" if kind == "GPU" else "cpu"
        self.model = load(path, device=device)
        sym = batch_symbol(self.model.manifest)
        self.max_rows = int(config.get("max_batch_size", 0)) if sym is not None else 0

    def execute(self, requests: list[Any]) -> list[Any]:
        """One response per request, in order; a request that fails gets its error and the others still run."""
        pb = _utils()
        feeds: list[dict[str, np.ndarray] | None] = []
        results: list[Any] = [None] * len(requests)
        for i, request in enumerate(requests):
            try:
                feeds.append(self._feeds(pb, request))
            except AotcError as e:
                feeds.append(None)
                results[i] = pb.InferenceResponse(output_tensors=[], error=pb.TritonError(str(e)))
        for group in self._groups(feeds):
            try:
                outs = run_batch(self.model, [feeds[i] for i in group])  # type: ignore[misc]
            except AotcError as e:
                for i in group:
                    results[i] = pb.InferenceResponse(output_tensors=[], error=pb.TritonError(f"{type(e).__name__}: {e}"))
                continue
            for i, out in zip(group, outs, strict=True):
                results[i] = pb.InferenceResponse(output_tensors=[pb.Tensor(k, np.ascontiguousarray(v)) for k, v in out.items()])
        return results

    def finalize(self) -> None:
        self.model.close()

    def _feeds(self, pb: Any, request: Any) -> dict[str, np.ndarray]:
        feeds = {}
        for spec in self.model.inputs:
            t = pb.get_input_tensor_by_name(request, spec.name)
            if t is None:
                raise AotcError(f"input {spec.name!r} is missing; the model takes {self.model.signature()}")
            feeds[spec.name] = t.as_numpy()
        self.model.bind([a.shape for a in feeds.values()])  # InputMismatch now, not inside a batch
        for spec in self.model.inputs:
            if feeds[spec.name].dtype.name != spec.dtype:
                raise AotcError(f"input {spec.name!r}: got dtype {feeds[spec.name].dtype}, expected {spec.dtype}")
        return feeds

    def _groups(self, feeds: list[dict[str, np.ndarray] | None]) -> list[list[int]]:
        """Indices of the good requests, grouped into batches of one key and at most max_rows rows."""
        groups: list[list[int]] = []
        open_: dict[tuple[object, ...], tuple[list[int], int]] = {}
        for i, f in enumerate(feeds):
            if f is None:
                continue
            if self.max_rows <= 1:
                groups.append([i])
                continue
            key, rows = batch_key(f), next(iter(f.values())).shape[0]
            group, have = open_.get(key, ([], 0))
            if not group or have + rows > self.max_rows:
                group, have = [], 0
                groups.append(group)
            group.append(i)
            open_[key] = (group, have + rows)
        return groups


def config_pbtxt(manifest: Manifest, name: str, max_batch: int = 64) -> str:
    """The model's config.pbtxt for Triton's python backend (see the module's note on batching)."""
    sym = batch_symbol(manifest)
    rows = 0 if sym is None else max(1, min(max_batch, sym.max if sym.max is not None else max_batch))

    def tensor(spec: TensorSpec) -> str:
        shape = spec.shape[1:] if rows else spec.shape
        dims = ", ".join(str(d) if isinstance(d, int) else "-1" for d in shape)
        return f'  {{ name: "{spec.name}", data_type: TYPE_{WIRE[spec.dtype]}, dims: [ {dims} ] }}'

    lines = [f'name: "{name}"', 'backend: "python"', f"max_batch_size: {rows}"]
    lines += ["input [", ",\n".join(tensor(s) for s in manifest.inputs), "]"]
    lines += ["output [", ",\n".join(tensor(s) for s in manifest.outputs), "]"]
    if rows:
        lines.append("dynamic_batching { }")
    lines.append("instance_group [ { kind: KIND_CPU, count: 1 } ]")
    lines.append(f'parameters: {{ key: "{PACKAGE_PARAMETER}", value: {{ string_value: "model.pkg" }} }}')
    return "\n".join(lines) + "\n"


def write_model(package: str | Path, repository: str | Path, name: str | None = None, max_batch: int = 64) -> Path:
    """Lay out ``repository/NAME`` (config.pbtxt, 1/model.py, 1/model.pkg); returns that folder."""
    package = Path(package)
    with Package(package) as pkg:  # a readable manifest, or PackageCorrupt before anything is written
        manifest = pkg.manifest
    name = name or package.stem
    folder = Path(repository) / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text(config_pbtxt(manifest, name, max_batch))
    (folder / "1" / "model.py").write_text(MODEL_PY)
    shutil.copyfile(package, folder / "1" / "model.pkg")
    return folder


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        raise SystemExit("usage: python -m aotc.serve.triton_backend PKG REPOSITORY [NAME]")
    print(write_model(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) == 4 else None))
