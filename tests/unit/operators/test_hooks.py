"""hooks/ (connections, the provider info), triggers/ray_job.py (no secret in its kwargs), the cluster backends
of operators/ray_cluster.py and the one definition of a terminal Ray job status.

    pytest -q tests/unit/operators/test_hooks.py        # a few seconds; no Ray head, no Kubernetes

Connections are given the way a deployment gives them, as AIRFLOW_CONN_<ID> variables (URI or JSON),
and read through Airflow's own lookup (BaseHook.get_connection / aget_connection).
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowNotFoundException, TaskDeferred

from hooks.kuberay import KubeRayHook
from hooks.ray_jobs import RayJobHook, job_ended
from operators.ray_cluster import (
    CLUSTER_BACKENDS,
    AddressCluster,
    KubeRayCluster,
    LocalCluster,
    RayClusterOperator,
)
from operators.ray_job import RayJobOperator
from triggers.ray_job import RayJobTrigger, trigger_env

ROOT = Path(__file__).resolve().parents[3]
TOKEN = "tok-" + "9f2c" * 8


def _bearer(hook: RayJobHook) -> str | None:
    hook.resolve()
    return hook._auth[1].get("Authorization")


@pytest.fixture
def no_ray_conns(monkeypatch):
    for name in ("AIRFLOW_CONN_RAY_JOBS_DEFAULT", "AIRFLOW_CONN_KUBERAY_DEFAULT", "AIRFLOW_CONN_RAY_PROD"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


# --------------------------------------------------------------------------------------------------
# the hooks' connection attributes and provider info
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "hook_cls, conn_type, default",
    [(RayJobHook, "ray_jobs", "ray_jobs_default"), (KubeRayHook, "kuberay", "kuberay_default")],
)
def test_hooks_declare_their_connection_like_a_provider(hook_cls, conn_type, default):
    assert (hook_cls.conn_type, hook_cls.default_conn_name, hook_cls.conn_name_attr) == (conn_type, default, "conn_id")
    assert hook_cls.hook_name
    assert hook_cls().conn_id == default


def test_provider_info_matches_airflows_schema_and_the_hooks():
    import importlib

    import airflow
    import jsonschema

    from hooks.provider_info import get_provider_info

    info = get_provider_info()
    schema = json.loads((Path(airflow.__file__).parent / "provider_info.schema.json").read_text())
    jsonschema.validate(info, schema)
    for entry in info["connection-types"]:
        module, name = entry["hook-class-name"].rsplit(".", 1)
        hook_cls = getattr(importlib.import_module(module), name)
        assert hook_cls.conn_type == entry["connection-type"]
        assert hook_cls.hook_name == entry["hook-name"]
    for section in ("operators", "hooks", "triggers"):
        for module in (m for group in info[section] for m in group["python-modules"]):
            importlib.import_module(module)


# --------------------------------------------------------------------------------------------------
# RayJobHook: what comes from the arguments, what from the connection
# --------------------------------------------------------------------------------------------------
def test_uri_connection_gives_url_and_token(no_ray_conns):
    no_ray_conns.setenv("AIRFLOW_CONN_RAY_JOBS_DEFAULT", f"ray-jobs://:{TOKEN}@ray-head:8266")
    hook = RayJobHook()
    assert hook.dashboard_url == "http://ray-head:8266"
    assert _bearer(hook) == f"Bearer {TOKEN}"
    assert TOKEN not in repr(hook)


def test_json_connection_gives_url_and_token(no_ray_conns):
    no_ray_conns.setenv(
        "AIRFLOW_CONN_RAY_JOBS_DEFAULT",
        json.dumps({"conn_type": "ray_jobs", "host": "https://ray.example.com/", "extra": {"auth_token": TOKEN}}),
    )
    hook = RayJobHook.from_cluster({"env": {}})  # a cluster description without a dashboard: the connection's
    assert hook.dashboard_url == "https://ray.example.com"
    assert _bearer(hook) == f"Bearer {TOKEN}"


def test_explicit_arguments_win_and_a_token_only_goes_to_its_own_host(no_ray_conns, tmp_path):
    no_ray_conns.setenv("AIRFLOW_CONN_RAY_JOBS_DEFAULT", f"ray-jobs://:{TOKEN}@ray-head:8265")
    other = RayJobHook("http://127.0.0.1:8265/")
    assert other.dashboard_url == "http://127.0.0.1:8265"
    assert _bearer(other) is None  # this connection's token is for ray-head, never sent elsewhere
    assert _bearer(RayJobHook("http://ray-head:8265")) == f"Bearer {TOKEN}"
    token_file = tmp_path / "token"
    token_file.write_text("from-the-cluster\n")
    env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_file)}
    assert _bearer(RayJobHook("http://ray-head:8265", env)) == "Bearer from-the-cluster"


def test_a_connection_without_host_lends_its_token_to_the_cluster_given(no_ray_conns):
    no_ray_conns.setenv("AIRFLOW_CONN_RAY_JOBS_DEFAULT", json.dumps({"conn_type": "ray_jobs", "password": TOKEN}))
    hook = RayJobHook.from_cluster({"dashboard_url": "http://10.0.0.5:8265", "env": {"RAY_AUTH_MODE": "token"}})
    assert hook.dashboard_url == "http://10.0.0.5:8265" and _bearer(hook) == f"Bearer {TOKEN}"


def test_an_undefined_default_connection_falls_back_a_named_one_fails(no_ray_conns):
    hook = RayJobHook.from_cluster("http://127.0.0.1:8265")
    assert hook.dashboard_url == "http://127.0.0.1:8265" and _bearer(hook) is None
    with pytest.raises(AirflowNotFoundException, match="AIRFLOW_CONN_RAY_PROD"):
        RayJobHook("http://127.0.0.1:8265", conn_id="ray_prod").resolve()
    assert RayJobHook("http://127.0.0.1:8265", conn_id=None).optional_connection() is None
    with pytest.raises(ValueError, match="no Ray dashboard URL"):
        RayJobHook().resolve()
    with pytest.raises(ValueError, match="RAY_AUTH_MODE=token but gives no token"):
        RayJobHook("http://127.0.0.1:8265", {"RAY_AUTH_MODE": "token"}).resolve()


# --------------------------------------------------------------------------------------------------
# the trigger: no token in its kwargs, the token resolved in the triggerer
# --------------------------------------------------------------------------------------------------
class _TI:
    dag_id, run_id, task_id, try_number, map_index = "d", "manual__1", "train", 1, -1

    def xcom_push(self, key, value):
        self.pushed = {key: value}


def test_deferring_puts_no_token_in_the_trigger_kwargs_or_xcom(no_ray_conns, tmp_path, monkeypatch):
    no_ray_conns.setenv("AIRFLOW_CONN_RAY_JOBS_DEFAULT", f"ray-jobs://:{TOKEN}@ray-head:8265")
    token_file = tmp_path / "token"
    token_file.write_text("file-token-" + "7" * 20)
    monkeypatch.setattr(RayJobHook, "submit", lambda self, entrypoint, sid, *a, **kw: sid)
    cluster = {"dashboard_url": "http://ray-head:8265", "env": {"RAY_AUTH_MODE": "token"}}
    op = RayJobOperator(task_id="train", entrypoint="true", cluster=cluster, runtime_env={})
    ti = _TI()
    with pytest.raises(TaskDeferred) as deferred:
        op.execute({"ti": ti})
    classpath, kwargs = deferred.value.trigger.serialize()
    assert classpath == "triggers.ray_job.RayJobTrigger"
    assert TOKEN not in json.dumps(kwargs) and TOKEN not in json.dumps(ti.pushed)
    assert kwargs["conn_id"] == "ray_jobs_default" and kwargs["dashboard_url"] == "http://ray-head:8265"

    # what the triggerer does: rebuild from the kwargs, resolve the token there (async lookup)
    rebuilt = RayJobTrigger(**kwargs)
    hook = asyncio.run(rebuilt._ahook())
    assert hook._auth == ("http://ray-head:8265", {"Authorization": f"Bearer {TOKEN}"})

    # a token file travels as its path, the token itself never
    file_env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_file)}
    _, kwargs = RayJobTrigger("job", "http://ray-head:8265", file_env).serialize()
    assert kwargs["env"] == file_env and "file-token" not in json.dumps(kwargs)


def test_an_inline_token_is_refused_before_submitting(no_ray_conns, monkeypatch):
    with pytest.raises(ValueError, match="RAY_AUTH_TOKEN_PATH"):
        trigger_env({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": TOKEN})

    def never(*args, **kwargs):
        raise AssertionError("submitted despite an inline token")

    monkeypatch.setattr(RayJobHook, "submit", never)
    op = RayJobOperator(
        task_id="train",
        entrypoint="true",
        runtime_env={},
        cluster={"dashboard_url": "http://h:8265", "env": {"RAY_AUTH_TOKEN": TOKEN}},
    )
    with pytest.raises(ValueError, match="metadata database"):
        op.execute({"ti": _TI()})


# --------------------------------------------------------------------------------------------------
# KubeRayHook: the connection's extra fills in what the arguments leave out
# --------------------------------------------------------------------------------------------------
def test_kuberay_connection_extra_and_explicit_arguments(no_ray_conns, tmp_path):
    assert (KubeRayHook().namespace, KubeRayHook().cluster_domain) == ("default", "cluster.local")
    no_ray_conns.setenv(
        "AIRFLOW_CONN_KUBERAY_DEFAULT",
        json.dumps(
            {
                "conn_type": "kuberay",
                "extra": {
                    "namespace": "evergreen",
                    "context": "prod",
                    "config_file": str(tmp_path / "kubeconfig"),
                    "in_cluster": "false",
                },
            }
        ),
    )
    hook = KubeRayHook()
    assert (hook.namespace, hook.context, hook.config_file, hook.in_cluster) == (
        "evergreen",
        "prod",
        str(tmp_path / "kubeconfig"),
        False,
    )
    explicit = KubeRayHook(namespace="other", context="dev")
    assert (explicit.namespace, explicit.context, explicit.config_file) == (
        "other",
        "dev",
        str(tmp_path / "kubeconfig"),
    )
    assert KubeRayHook(conn_id=None).namespace == "default"


# --------------------------------------------------------------------------------------------------
# RayClusterOperator: one strategy class per backend
# --------------------------------------------------------------------------------------------------
def test_each_backend_is_a_strategy_chosen_by_name():
    assert {"local": LocalCluster, "address": AddressCluster, "kuberay": KubeRayCluster} == CLUSTER_BACKENDS
    op = RayClusterOperator(task_id="setup", action="setup", num_cpus=2, kuberay_conn_id="kube_prod")
    for name, cls in CLUSTER_BACKENDS.items():
        backend = op.cluster_backend(name)
        assert type(backend) is cls and (backend.run_key, backend.num_cpus) == (op.run_key, 2)
        assert callable(backend.setup) and callable(backend.teardown)
    assert op.cluster_backend("kuberay").kuberay_conn_id == "kube_prod"
    with pytest.raises(ValueError, match="local, address, kuberay"):
        op.cluster_backend("slurm")


def test_setup_writes_cluster_json_and_teardown_leaves_an_existing_cluster(monkeypatch):
    import operators.stages as stages

    settings = SimpleNamespace(
        ray=SimpleNamespace(backend="address", address="10.0.0.5:6379", dashboard_url="http://10.0.0.5:8265")
    )
    written = {}
    rd = SimpleNamespace(write=lambda obj, *parts: written.setdefault("/".join(parts), obj), push=dict)
    monkeypatch.setattr(stages, "settings_for", lambda params: settings)
    monkeypatch.setattr(stages, "run_dir_of", lambda context, s: rd)
    monkeypatch.setattr(stages, "record_task_time", lambda context, rd, started: None)
    context = {"params": {}}
    out = RayClusterOperator(task_id="setup", action="setup", run_key="d/r").execute(context)
    assert out["backend"] == "address" and out["dashboard_url"] == "http://10.0.0.5:8265"
    assert written["cluster.json"] == out
    assert RayClusterOperator(task_id="teardown", action="teardown", run_key="d/r").execute(context) == {"stopped": 0}


# --------------------------------------------------------------------------------------------------
# terminal job states: Ray's JobStatus.is_terminal(), defined nowhere else
# --------------------------------------------------------------------------------------------------
def test_job_ended_is_rays_own_definition():
    from ray.job_submission import JobStatus

    for status in JobStatus:
        assert job_ended(status) is job_ended(status.value) is status.is_terminal()
    with pytest.raises(ValueError):
        job_ended("TIMEOUT")  # the trigger's own outcomes are not Ray statuses


def test_no_source_file_keeps_its_own_set_of_terminal_statuses():
    status_set = re.compile(r'\{[^}\n]*"(SUCCEEDED|FAILED|STOPPED)"[^}\n]*"(SUCCEEDED|FAILED|STOPPED)"[^}\n]*\}')
    offenders = [
        str(p.relative_to(ROOT))
        for folder in ("hooks", "operators", "triggers", "tasks", "scripts", "plugins")
        for p in sorted((ROOT / folder).rglob("*.py"))
        if status_set.search(p.read_text())
    ]
    assert offenders == [], f"use hooks.ray_jobs.job_ended (JobStatus.is_terminal) in {offenders}"


def test_s3_and_mlflow_credentials_come_from_connections(monkeypatch):
    from hooks.credentials import stage_credentials

    for name in ("AIRFLOW_CONN_EVERGREEN_S3", "AIRFLOW_CONN_EVERGREEN_MLFLOW"):
        monkeypatch.delenv(name, raising=False)
    assert stage_credentials() == {}  # none defined: the ambient environment rules
    monkeypatch.setenv(
        "AIRFLOW_CONN_EVERGREEN_S3",
        json.dumps(
            {
                "conn_type": "aws",
                "login": "AKIDEXAMPLE",
                "password": "s3-secret",
                "extra": {"endpoint_url": "http://127.0.0.1:9000", "region_name": "eu-west-1"},
            }
        ),
    )
    monkeypatch.setenv(
        "AIRFLOW_CONN_EVERGREEN_MLFLOW",
        json.dumps({"conn_type": "http", "login": "evergreen", "password": "mlflow-secret"}),
    )
    assert stage_credentials() == {
        "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
        "AWS_SECRET_ACCESS_KEY": "s3-secret",
        "AWS_DEFAULT_REGION": "eu-west-1",
        "EVERGREEN_S3_ENDPOINT_URL": "http://127.0.0.1:9000",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        "MLFLOW_TRACKING_USERNAME": "evergreen",
        "MLFLOW_TRACKING_PASSWORD": "mlflow-secret",
    }
