"""A KubeRay cluster with token auth: every Jobs API call carries its token, and the token is never in XCom.

The cluster is created through KubeRayHook against the fake Kubernetes API server, with the Secret KubeRay
makes for `authOptions.mode: token`; its description (what the setup task puts in XCom) names the cluster, not
the token. The Jobs API client (RayJobHook, in a worker), the trigger (RayJobTrigger, in the triggerer) and a
driver's environment (StageOperator, in a task) read the token from the Secret themselves, through the
kubeconfig the deployment gives them. The fake Ray Jobs API records the Authorization header of every request
`ray.job_submission.JobSubmissionClient` makes. Fakes: tests/unit/operators/fakes.py.

    pytest -q tests/unit/operators/test_kuberay_auth.py      # seconds
"""

from __future__ import annotations

import asyncio
import base64
import json

import pytest
import yaml

from hooks.kuberay import KubeRayError, driver_environment
from hooks.kuberay_manifest import RAYCLUSTER_TEMPLATE, render_raycluster
from hooks.ray_jobs import RayJobHook
from tests.unit.operators.fakes import NS
from triggers.ray_job import RayJobTrigger

TOKEN = "s3cr3t-ray-token"
NAME = "evergreen-auth-1a2b3c4d"


@pytest.fixture
def kubeconfig(server, tmp_path, monkeypatch):
    """The deployment's kubeconfig (KUBECONFIG), pointing at the fake API server: what the hooks built from a
    cluster reference find when no `kuberay` connection is defined."""
    httpd, _ = server
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": f"http://127.0.0.1:{httpd.server_address[1]}"}}],
        "users": [{"name": "u", "user": {"token": "kube-api-token"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u"}}],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    monkeypatch.setenv("KUBECONFIG", str(path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return path


def _secret(fake, token: str = TOKEN) -> None:
    fake.secrets[(NS, NAME)] = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": NAME, "namespace": NS},
        "data": {"auth_token": base64.b64encode(token.encode()).decode()},
    }


@pytest.fixture
def cluster(hook, fake, kubeconfig, jobs) -> dict:
    """The setup task's description of a ready, token-auth RayCluster, its dashboard at the fake Jobs API (as a
    port-forward or an in-cluster Service address would be)."""
    _secret(fake)
    described = hook.create_and_wait(render_raycluster(RAYCLUSTER_TEMPLATE, NAME, NS), timeout=30, poll=0.01)
    url, _ = jobs
    return {**described, "dashboard_url": url}


def test_the_cluster_description_names_the_cluster_and_never_holds_the_token(cluster):
    assert cluster["env"] == {"RAY_AUTH_MODE": "token"}
    assert cluster["kuberay"] == {"name": NAME, "namespace": NS, "conn_id": "kuberay_default"}
    assert TOKEN not in json.dumps(cluster)


def test_every_jobs_api_call_of_the_hook_carries_the_clusters_token(cluster, jobs):
    _, state = jobs
    hook = RayJobHook.from_cluster(json.dumps(cluster), conn_id=None)  # as the templated XCom arrives
    job = hook.submit("python -c 'print(1)'", "evergreen-job-1", runtime_env={})
    assert hook.status(job) == "PENDING"
    assert str(hook.info(job).status) == "SUCCEEDED"
    assert "hello" in hook.logs(job)
    assert hook.stop(job) is False
    paths = {path for _, path, _ in state.requests}
    assert {"/api/version", "/api/jobs/", f"/api/jobs/{job}", f"/api/jobs/{job}/logs", f"/api/jobs/{job}/stop"} <= paths
    assert [auth for _, _, auth in state.requests] == [f"Bearer {TOKEN}"] * len(state.requests)
    assert TOKEN not in repr(hook)


def test_the_trigger_reads_the_token_itself_and_every_call_carries_it(cluster, jobs):
    _, state = jobs
    RayJobHook.from_cluster(cluster, conn_id=None).submit("true", "evergreen-job-2", runtime_env={})
    state.requests.clear()
    trigger = RayJobTrigger(
        "evergreen-job-2",
        dashboard_url=cluster["dashboard_url"],
        env=cluster["env"],
        conn_id=None,
        kuberay=cluster["kuberay"],
        poll_interval=0.01,
    )
    _, kwargs = trigger.serialize()
    assert TOKEN not in json.dumps(kwargs) and kwargs["kuberay"] == cluster["kuberay"]  # the triggerer's kwargs

    async def first_event():
        async for event in RayJobTrigger(**kwargs).run():
            return event.payload

    payload = asyncio.run(first_event())
    assert payload["status"] == "SUCCEEDED", payload
    assert state.requests, "the trigger made no Jobs API call"
    # the log websocket (which the fake refuses) included: every request, on every path
    assert [auth for _, _, auth in state.requests] == [f"Bearer {TOKEN}"] * len(state.requests)


def test_a_driver_task_gets_the_token_in_its_environment_only(cluster, fake):
    assert driver_environment(cluster) == {"RAY_AUTH_TOKEN": TOKEN}
    assert driver_environment({**cluster, "env": {}}) == {}  # auth off: nothing to add
    assert driver_environment({"backend": "local", "env": {"RAY_AUTH_MODE": "token"}}) == {}  # not KubeRay


def test_a_token_cluster_without_its_secret_sends_nothing(cluster, fake, jobs):
    _, state = jobs
    del fake.secrets[(NS, NAME)]
    hook = RayJobHook.from_cluster(cluster, conn_id=None)
    with pytest.raises(KubeRayError, match="v1.5.1"):
        hook.submit("true", "evergreen-job-3", runtime_env={})
    assert state.requests == []  # no unauthenticated call went out
