"""`aotc serve` checked with tritonclient, unchanged, over HTTP and gRPC, with two example packages at once.

One server (mlp + transformer, a 1 MiB request limit) serves the module: health, metadata and config calls;
8 concurrent clients x 200 requests whose outputs must equal the package's own (bit for bit: batching must
not change an answer); malformed requests that must get the protocol's error while the server keeps serving;
the Prometheus metrics. Then a graceful shutdown with requests in flight, the runtime-only install, and the
Triton python backend against a stub of its module. The Ray Serve test lives in test_serve_ray.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import aotc
import numpy as np
import pytest
from serve_util import SERVE, build_example, start_server

pytest.importorskip("aiohttp")
httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

MODELS = ("mlp", "transformer")


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory, aotc_cache: Path) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("serve-pkgs")
    return {name: build_example(name, out, aotc_cache) for name in MODELS}


@pytest.fixture(scope="module")
def server(packages: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp("serve-log") / "server.log"
    srv = start_server([str(p) for p in packages.values()], log, "--max-request-mb", "1")
    yield srv
    assert srv.stop() == 0, log.read_text()


@pytest.fixture(scope="module")
def models(packages: dict[str, Path]) -> dict[str, aotc.Model]:
    return {name: aotc.load(p, device="cpu") for name, p in packages.items()}


def _input(name: str, rows: int, rng: np.random.Generator) -> np.ndarray:
    if name == "mlp":
        return rng.standard_normal((rows, 256)).astype(np.float32)
    return rng.integers(0, 1000, (rows, 64)).astype(np.int64)


def _infer(client, module, model: str, x: np.ndarray) -> np.ndarray:
    name = "x" if model == "mlp" else "tokens"
    inp = module.InferInput(name, list(x.shape), "FP32" if x.dtype == np.float32 else "INT64")
    inp.set_data_from_numpy(x)
    return client.infer(model, [inp]).as_numpy("output0")


def test_health_metadata_and_config(server) -> None:
    h = httpclient.InferenceServerClient(server.http)
    g = grpcclient.InferenceServerClient(server.grpc)
    assert h.is_server_live() and h.is_server_ready() and g.is_server_live() and g.is_server_ready()
    for model in MODELS:
        assert h.is_model_ready(model) and g.is_model_ready(model)
        assert h.is_model_ready(model, "1") and not h.is_model_ready(model, "2")
    assert not h.is_model_ready("nope") and not g.is_model_ready("nope")
    meta = h.get_model_metadata("transformer")
    assert meta["inputs"] == [{"name": "tokens", "datatype": "INT64", "shape": [-1, 64]}]
    assert meta["outputs"] == [{"name": "output0", "datatype": "FP32", "shape": [-1, 64, 128]}]
    gmeta = g.get_model_metadata("mlp", as_json=True)
    assert gmeta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": ["-1", "256"]}]  # int64 fields print as strings
    assert g.get_model_config("mlp", as_json=True)["config"]["input"][0]["data_type"] == "TYPE_FP32"
    assert h.get_model_config("transformer")["output"][0]["dims"] == [-1, 64, 128]
    assert h.get_server_metadata()["name"] == "aotc" and g.get_server_metadata().name == "aotc"
    assert {m["name"] for m in h.get_model_repository_index()} == set(MODELS)


def test_outputs_equal_aotc_run(server, packages: dict[str, Path], tmp_path: Path) -> None:
    """Over both protocols, JSON and binary tensors, both models: what `aotc run` writes, bit for bit."""
    rng = np.random.default_rng(0)
    h = httpclient.InferenceServerClient(server.http)
    g = grpcclient.InferenceServerClient(server.grpc)
    for model in MODELS:
        x = _input(model, 3, rng)
        np.save(tmp_path / "x.npy", x)
        name = "x" if model == "mlp" else "tokens"
        cmd = [*SERVE[:-1], "run", str(packages[model]), "--input", f"{name}={tmp_path / 'x.npy'}", "-o", str(tmp_path / "y.npz")]
        subprocess.run(cmd, check=True, capture_output=True)
        want = np.load(tmp_path / "y.npz")["output0"]
        assert np.array_equal(_infer(h, httpclient, model, x), want)
        assert np.array_equal(_infer(g, grpcclient, model, x), want)
        inp = httpclient.InferInput(name, list(x.shape), "FP32" if model == "mlp" else "INT64")
        inp.set_data_from_numpy(x, binary_data=False)  # JSON in, JSON out
        res = h.infer(model, [inp], outputs=[httpclient.InferRequestedOutput("output0", binary_data=False)], request_id="r7")
        assert res.get_response()["id"] == "r7"
        assert np.array_equal(res.as_numpy("output0"), want)


def test_concurrent_clients(server, models: dict[str, aotc.Model]) -> None:
    """8 clients (4 HTTP, 4 gRPC) x 200 requests of 1-4 rows to either model, at once."""
    errors: list[str] = []
    checked = [0] * 8

    def client(k: int) -> None:
        rng = np.random.default_rng(100 + k)
        module = httpclient if k % 2 else grpcclient
        c = module.InferenceServerClient(server.http if k % 2 else server.grpc)
        for i in range(200):
            model = MODELS[int(rng.integers(0, 2))]
            x = _input(model, int(rng.integers(1, 5)), rng)
            try:
                y = _infer(c, module, model, x)
            except Exception as e:  # reported below, with the client and request
                errors.append(f"client {k} request {i}: {e}")
                return
            if not np.array_equal(y, models[model](x)):
                errors.append(f"client {k} request {i} ({model}, {x.shape}): output differs from the package's")
                return
            checked[k] += 1

    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors[:5]
    assert checked == [200] * 8


def _post(url: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=body, headers=headers or {}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_malformed_requests_get_protocol_errors(server, models: dict[str, aotc.Model]) -> None:
    h = httpclient.InferenceServerClient(server.http)
    g = grpcclient.InferenceServerClient(server.grpc)
    good = np.ones((2, 256), np.float32)
    cases = [
        ("mlp", np.ones((2, 255), np.float32), "FP32", "400", "INVALID_ARGUMENT", "axis 1: got size 255, expected 256"),
        ("mlp", np.ones((2, 256), np.float64), "FP64", "400", "INVALID_ARGUMENT", "got datatype FP64, expected FP32"),
        ("mlp", np.ones((300, 256), np.float32), "FP32", "400", "INVALID_ARGUMENT", "outside the range [1, 256]"),
        ("mlp", np.ones((2048, 256), np.float32), "FP32", "413", "RESOURCE_EXHAUSTED", ""),  # 2 MiB > the 1 MiB limit
        ("nope", good, "FP32", "404", "NOT_FOUND", "unknown model 'nope'"),
        ("transformer", np.ones((2, 64), np.int32), "INT32", "400", "INVALID_ARGUMENT", "expected INT64"),
    ]
    for model, x, dtype, http_status, grpc_status, words in cases:
        for module, client, status in ((httpclient, h, http_status), (grpcclient, g, grpc_status)):
            inp = module.InferInput("x" if model != "transformer" else "tokens", list(x.shape), dtype)
            inp.set_data_from_numpy(x)
            with pytest.raises(InferenceServerException) as info:
                client.infer(model, [inp])
            assert status in str(info.value.status()), (model, x.shape, dtype, info.value)
            assert words in info.value.message(), info.value.message()
            assert np.array_equal(_infer(client, module, "mlp", good), models["mlp"](good))  # still serving
    url = f"http://{server.http}/v2/models/mlp/infer"
    head = b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 256], "parameters": {"binary_data_size": 1024}}]}'
    raw = [
        (b"{not json", None, "not JSON"),
        (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 256], "data": [1, 2]}]}', None, "2 values for shape [1, 256]"),
        (head + bytes(1000), str(len(head)), "runs past the end"),  # 1000 bytes of data where 1024 are declared
        (b'{"inputs": [{"name": "y", "datatype": "FP32", "shape": [1], "data": [1]}]}', None, "has no input 'y'"),
        (b'{"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1], "data": ["a"]}]}', None, "'BYTES' is not supported"),
    ]  # fmt: skip
    for body, length, words in raw:
        status, doc = _post(url, body, {"Inference-Header-Content-Length": length} if length else None)
        assert status == 400 and words in doc["error"], (status, doc)
    floats = b'{"inputs": [{"name": "tokens", "datatype": "INT64", "shape": [1, 2], "data": [1.5, 2]}]}'  # never truncated
    status, doc = _post(f"http://{server.http}/v2/models/transformer/infer", floats)
    assert status == 400 and "not a list of INT64 values" in doc["error"], (status, doc)
    assert server.proc.poll() is None
    tokens = np.ones((1, 64), np.int64)
    assert np.array_equal(_infer(h, httpclient, "transformer", tokens), models["transformer"](tokens))


def test_metrics(server) -> None:
    h = httpclient.InferenceServerClient(server.http)
    x = np.ones((1, 256), np.float32)
    _infer(h, httpclient, "mlp", x)
    with pytest.raises(InferenceServerException):
        _infer(h, httpclient, "nope", x)
    with urllib.request.urlopen(f"http://{server.http}/metrics", timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/plain")
        text = r.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            samples[key] = float(value)
    assert samples['aotc_requests_total{model="mlp",protocol="http"}'] >= 1
    assert samples['aotc_request_errors_total{model="(unknown)",protocol="http",status="not_found"}'] >= 1
    assert samples['aotc_request_duration_seconds_count{model="mlp",protocol="http"}'] >= 1
    assert 'aotc_request_duration_seconds_bucket{le="0.005",model="mlp",protocol="http"}' in samples
    assert samples['aotc_batch_rows_count{model="mlp"}'] >= 1


def test_graceful_shutdown_finishes_requests_in_flight(packages: dict[str, Path], models: dict[str, aotc.Model], tmp_path: Path) -> None:
    """SIGTERM while 6 requests wait in a 400 ms batching window: all 6 answered, exit 0, JSON-lines log."""
    srv = start_server([str(packages["mlp"])], tmp_path / "log", "--batch-delay-ms", "400", "--access-log")
    x = np.random.default_rng(3).standard_normal((6, 2, 256)).astype(np.float32)
    got: dict[int, np.ndarray | Exception] = {}

    def one(i: int) -> None:
        try:
            got[i] = _infer(httpclient.InferenceServerClient(srv.http), httpclient, "mlp", x[i])
        except Exception as e:
            got[i] = e

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    assert srv.stop() == 0
    for t in threads:
        t.join(30)
    for i in range(6):
        assert isinstance(got[i], np.ndarray), got[i]
        assert np.array_equal(got[i], models["mlp"](x[i]))
    events = srv.events()
    assert len(events) == len(srv.log.read_text().splitlines())  # every line is a JSON object
    names = [e["event"] for e in events]
    assert names[-1] == "stopped" and "shutting down" in names
    assert next(e for e in events if e["event"] == "shutting down")["inflight"] >= 1
    assert sum(1 for e in events if e["event"] == "infer" and e["status"] == "ok") == 6


BLOCK_SERVER_LIBS = """
import sys
BLOCKED = {"torch", "triton", "aotc_build", "aiohttp", "grpc", "google", "tritonclient", "prometheus_client", "ray"}
class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is blocked", name=name)
        return None
sys.meta_path.insert(0, Blocker())
import aotc, aotc.cli, aotc.serve, aotc.serve.cli, aotc.serve.triton_backend
from aotc.cli import main
sys.argv = ["aotc", "serve", "model.pkg"]
try:
    main()
except SystemExit as e:
    assert e.code == 2, e.code
leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
assert not leaked, leaked
print("SERVE-DEPS-OK")
"""


def test_runtime_only_install_gains_no_server_dependency(tmp_path: Path) -> None:
    """Without the `serve` extra: the runtime, its CLI and the Triton backend import; `aotc serve` says what to install."""
    r = subprocess.run([sys.executable, "-c", BLOCK_SERVER_LIBS], capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False)
    assert r.returncode == 0 and "SERVE-DEPS-OK" in r.stdout, r.stdout + r.stderr
    assert "pip install 'aotc[serve]'" in r.stderr


def test_triton_python_backend(packages: dict[str, Path], models: dict[str, aotc.Model], tmp_path: Path, monkeypatch) -> None:
    """The backend's model.py against a stub of triton_python_backend_utils, with the config Triton would parse."""
    from aotc.serve.triton_backend import write_model
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    monkeypatch.syspath_prepend(str(Path(__file__).parent / "triton_stub"))
    import triton_python_backend_utils as pb

    folder = write_model(packages["mlp"], tmp_path / "repo", "mlp", max_batch=8)
    config = text_format.Parse((folder / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    assert config.max_batch_size == 8 and list(config.input[0].dims) == [256] and config.HasField("dynamic_batching")
    ns: dict = {}
    exec((folder / "1" / "model.py").read_text(), ns)  # what the python backend does with model.py
    backend = ns["TritonPythonModel"]()
    args = {
        "model_config": json.dumps(json_format.MessageToDict(config, preserving_proto_field_name=True)),
        "model_repository": str(folder), "model_version": "1", "model_instance_kind": "CPU", "model_name": "mlp",
    }  # fmt: skip
    backend.initialize(args)
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal((r, 256)).astype(np.float32) for r in (1, 3, 4, 2)]
    requests = [pb.InferenceRequest([pb.Tensor("x", x)]) for x in xs]
    requests.insert(2, pb.InferenceRequest([pb.Tensor("x", np.ones((1, 100), np.float32))]))
    requests.insert(4, pb.InferenceRequest([]))
    responses = backend.execute(requests)
    assert len(responses) == 6
    assert "axis 1: got size 100" in responses[2].error().message()
    assert "input 'x' is missing" in responses[4].error().message()
    good = [r for i, r in enumerate(responses) if i not in (2, 4)]
    for x, r in zip(xs, good, strict=True):
        assert not r.has_error()
        assert np.array_equal(pb.get_output_tensor_by_name(r, "output0").as_numpy(), models["mlp"](x))
    backend.finalize()


def test_serve_refuses_bad_arguments(packages: dict[str, Path], tmp_path: Path) -> None:
    """A package that cannot load exits with its error class's code before listening; two names clash: usage."""
    bad = tmp_path / "bad.pkg"
    bad.write_bytes(b"not a package")
    r = subprocess.run([*SERVE, str(bad), "--http-port", "0", "--grpc-port", "0"], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == aotc.PackageCorrupt.exit_code and "PackageCorrupt" in r.stderr, r.stderr
    pkg = str(packages["mlp"])
    r = subprocess.run([*SERVE, pkg, f"mlp={pkg}"], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2 and "two packages are named 'mlp'" in r.stderr, r.stderr
