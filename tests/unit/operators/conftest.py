"""Fixtures of the operator tests: the fake Kubernetes API server (tests/unit/operators/fakes.py), started once
per module, its state fresh per test, and a KubeRayHook pointed at it."""

from __future__ import annotations

import pytest

from hooks.kuberay import KubeRayHook
from tests.unit.operators.fakes import NS, FakeJobs, FakeKube, jobs_handler, kube_handler, serve


@pytest.fixture(scope="module")
def server():
    holder = {"fake": FakeKube()}

    class Proxy:  # the handler class is built once; tests swap the state behind it
        def __getattr__(self, item):
            return getattr(holder["fake"], item)

        def __setattr__(self, item, value):
            setattr(holder["fake"], item, value)

    with serve(kube_handler(Proxy())) as httpd:
        yield httpd, holder


@pytest.fixture
def fake(server) -> FakeKube:
    _, holder = server
    holder["fake"] = FakeKube()
    return holder["fake"]


@pytest.fixture
def hook(server, fake) -> KubeRayHook:
    from kubernetes import client

    httpd, _ = server
    cfg = client.Configuration()
    cfg.host = f"http://127.0.0.1:{httpd.server_address[1]}"
    return KubeRayHook(namespace=NS, client_configuration=cfg, request_timeout=5)


@pytest.fixture
def jobs():
    """The fake Ray Jobs API: (its URL, its FakeJobs state)."""
    state = FakeJobs()
    with serve(jobs_handler(state)) as httpd:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", state
