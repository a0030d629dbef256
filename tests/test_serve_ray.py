"""aotc.serve.ray on a local Ray cluster: 2 replicas behind Ray Serve's HTTP proxy answer tritonclient's v2
requests (health, metadata, infer from 8 concurrent clients) with the package's outputs, bit for bit.

Skipped where Ray Serve is not installed (CI does not install it: Ray's start-up alone takes tens of seconds
on two cores). Run it with `pip install 'ray[serve]'` and `pytest tests/test_serve_ray.py`.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import aotc
import numpy as np
import pytest
from serve_util import build_example

pytest.importorskip("ray.serve")
httpclient = pytest.importorskip("tritonclient.http")

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ray_serve_two_replicas(tmp_path: Path, aotc_cache: Path) -> None:
    import ray
    from aotc.serve.ray import app
    from ray import serve

    pkgs = {name: build_example(name, tmp_path, aotc_cache) for name in ("mlp", "transformer")}
    models = {name: aotc.load(p, device="cpu") for name, p in pkgs.items()}
    port = _free_port()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(app(pkgs, num_replicas=2), route_prefix="/", name="aotc")
        status = serve.status().applications["aotc"].deployments["aotc"]
        assert status.replica_states.get("RUNNING") == 2, status
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        deadline = time.monotonic() + 60
        while not client.is_server_ready() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert client.is_model_ready("mlp")
        assert client.get_model_metadata("transformer")["inputs"] == [{"name": "tokens", "datatype": "INT64", "shape": [-1, 64]}]
        errors: list[str] = []

        def one_client(k: int) -> None:
            rng = np.random.default_rng(k)
            c = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
            for i in range(25):
                model = ("mlp", "transformer")[i % 2]
                rows = int(rng.integers(1, 5))
                x = rng.standard_normal((rows, 256)).astype(np.float32) if model == "mlp" else rng.integers(0, 1000, (rows, 64))
                inp = httpclient.InferInput("x" if model == "mlp" else "tokens", list(x.shape), "FP32" if model == "mlp" else "INT64")
                inp.set_data_from_numpy(x)
                try:
                    y = c.infer(model, [inp]).as_numpy("output0")
                except Exception as e:
                    errors.append(f"client {k} request {i}: {e}")
                    return
                if not np.array_equal(y, models[model](x)):
                    errors.append(f"client {k} request {i}: output differs")
                    return

        threads = [threading.Thread(target=one_client, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert not errors, errors[:5]
        bad = httpclient.InferInput("x", [1, 255], "FP32")
        bad.set_data_from_numpy(np.ones((1, 255), np.float32))
        with pytest.raises(Exception, match="axis 1: got size 255"):
            client.infer("mlp", [bad])
        handle = serve.get_app_handle("aotc")
        out = handle.infer.remote("mlp", {"x": np.ones((2, 256), np.float32)}).result()
        assert np.array_equal(out["output0"], models["mlp"](np.ones((2, 256), np.float32)))
    finally:
        serve.shutdown()
        ray.shutdown()
