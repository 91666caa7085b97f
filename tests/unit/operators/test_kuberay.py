"""hooks/kuberay_manifest.py (render_raycluster, pure) and hooks/kuberay.py (KubeRayHook's API calls, against the
fake API server of tests/unit/operators/fakes.py; fixtures in conftest.py).

    pytest -q tests/unit/operators/test_kuberay.py        # a few seconds

"""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hooks.kuberay import KubeRayError, KubeRayHook, KubeRayTimeout
from hooks.kuberay_manifest import (
    RAYCLUSTER_TEMPLATE,
    RUN_KEY_LABEL,
    KubeRayManifestError,
    label_value,
    render_raycluster,
    validate_raycluster,
)
from tests.unit.operators.fakes import NS

ROOT = Path(__file__).resolve().parents[3]


def manifest(name="evergreen-test-1a2b3c4d", **kw):
    return render_raycluster(RAYCLUSTER_TEMPLATE, name, NS, **kw)


# --------------------------------------------------------------------------------------------------
# render_raycluster / validate_raycluster
# --------------------------------------------------------------------------------------------------
def _all_containers(m):
    spec = m["spec"]
    groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
    return [c for g in groups for c in g["template"]["spec"]["containers"]]


def test_render_sets_name_namespace_labels_and_image_everywhere():
    run_key = "continuous_post_training/scheduled__2026-12-02T00:00:00+00:00"
    m = manifest(image="registry.example.com/evergreen:abc123", run_key=run_key, labels={"team": "rl"})
    assert m["metadata"]["name"] == "evergreen-test-1a2b3c4d" and m["metadata"]["namespace"] == NS
    want = label_value(run_key)
    assert m["metadata"]["labels"][RUN_KEY_LABEL] == want and m["metadata"]["labels"]["team"] == "rl"
    assert m["metadata"]["labels"]["app.kubernetes.io/name"] == "evergreen"  # template labels kept
    groups = [m["spec"]["headGroupSpec"], *m["spec"]["workerGroupSpecs"]]
    assert all(g["template"]["metadata"]["labels"][RUN_KEY_LABEL] == want for g in groups)
    assert {c["image"] for c in _all_containers(m)} == {"registry.example.com/evergreen:abc123"}
    assert validate_raycluster(m) == []
    # the template on disk is untouched: a second render starts from it again
    assert {c["image"] for c in _all_containers(manifest())} == {"evergreen:cpu", "evergreen:gpu"}


def test_render_without_run_key_labels_with_the_name_and_group_images_override():
    m = manifest(image="evergreen:cpu-2", group_images={"gpu": "evergreen:gpu-2"})
    assert m["metadata"]["labels"][RUN_KEY_LABEL] == "evergreen-test-1a2b3c4d"
    images = {g["groupName"]: g["template"]["spec"]["containers"][0]["image"] for g in m["spec"]["workerGroupSpecs"]}
    assert images == {"cpu": "evergreen:cpu-2", "gpu": "evergreen:gpu-2"}
    assert m["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"] == "evergreen:cpu-2"
    with pytest.raises(KubeRayManifestError, match=r"group_images\['tpu'\].*'cpu', 'gpu', 'head'"):
        manifest(group_images={"tpu": "x"})


@pytest.mark.parametrize(
    "run_key", ["a/b:c+d", "x" * 200, "::--::", "", "dag/manual__2026-12-02T10:11:12.123456+00:00"]
)
def test_label_value_is_always_a_valid_label(run_key):
    value = label_value(run_key)
    assert len(value) <= 63 and re.fullmatch(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?", value) and value
    assert label_value(run_key) == value  # deterministic: teardown finds what setup labelled


def test_label_value_keeps_long_keys_apart():
    a, b = "dag/" + "x" * 80 + "1", "dag/" + "x" * 80 + "2"
    assert label_value(a) != label_value(b)
    assert label_value("plain-key_1.0") == "plain-key_1.0"  # valid values pass unchanged


@pytest.mark.parametrize(
    "name, fragment",
    [
        ("Evergreen", "DNS-1035"),
        ("1-evergreen", "starting with a letter"),
        ("ever_green", "DNS-1035"),
        ("e" * 54, "at most 53"),
        ("evergreen-", "DNS-1035"),
    ],
)
def test_invalid_names_are_rejected_with_the_field_and_fix(name, fragment):
    with pytest.raises(KubeRayManifestError) as err:
        manifest(name=name)
    assert "metadata.name" in str(err.value) and fragment in str(err.value) and "shorten" in str(err.value)


def test_invalid_namespace_and_a_53_character_name():
    assert manifest(name="e" * 53)["metadata"]["name"] == "e" * 53
    with pytest.raises(KubeRayManifestError, match=r"metadata\.namespace: 'Ever_Green'.*rbac\.yaml"):
        render_raycluster(RAYCLUSTER_TEMPLATE, "evergreen-x", "Ever_Green")


def test_overrides_merge_by_group_name_delete_with_none_and_lose_to_explicit_args():
    m = manifest(
        image="img:1",
        overrides={
            "metadata": {"name": "ignored", "annotations": {"owner": "rl-team"}},
            "spec": {
                "authOptions": None,
                "workerGroupSpecs": {"gpu": {"maxReplicas": 4}},
                "headGroupSpec": {"rayStartParams": {"num-cpus": "1"}},
            },
        },
    )
    assert m["metadata"]["name"] == "evergreen-test-1a2b3c4d"  # the explicit name wins
    assert m["metadata"]["annotations"] == {"owner": "rl-team"}
    assert "authOptions" not in m["spec"]
    gpu = next(g for g in m["spec"]["workerGroupSpecs"] if g["groupName"] == "gpu")
    assert (
        gpu["maxReplicas"] == 4
        and gpu["minReplicas"] == 0
        and gpu["template"]["spec"]["containers"][0]["image"] == "img:1"
    )
    assert m["spec"]["headGroupSpec"]["rayStartParams"] == {"dashboard-host": "0.0.0.0", "num-cpus": "1"}


def test_overrides_errors_name_the_field_and_the_fix():
    with pytest.raises(KubeRayManifestError, match=r"spec\.workerGroupSpecs\.tpu.*groups: \['cpu', 'gpu'\]"):
        manifest(overrides={"spec": {"workerGroupSpecs": {"tpu": {"replicas": 1}}}})
    with pytest.raises(KubeRayManifestError, match=r"rayStartParams\.num-cpus: 0 is a int.*quote it"):
        manifest(overrides={"spec": {"headGroupSpec": {"rayStartParams": {"num-cpus": 0}}}})
    with pytest.raises(KubeRayManifestError, match=r"minReplicas 3 > maxReplicas 2"):
        manifest(overrides={"spec": {"workerGroupSpecs": {"gpu": {"minReplicas": 3}}}})
    with pytest.raises(KubeRayManifestError, match=r"replicas: 9 is outside \[minReplicas 1, maxReplicas 4\]"):
        manifest(overrides={"spec": {"workerGroupSpecs": {"cpu": {"replicas": 9}}}})


def test_lists_replace_and_missing_resources_are_caught():
    groups = [
        {
            "groupName": "cpu",
            "replicas": 1,
            "minReplicas": 1,
            "maxReplicas": 1,
            "rayStartParams": {},
            "template": {"spec": {"containers": [{"name": "ray-worker", "image": "x"}]}},
        }
    ]
    with pytest.raises(
        KubeRayManifestError,
        match=r"workerGroupSpecs\[0\]\.template\.spec\.containers\[0\]\.resources"
        r"\.limits: no cpu or memory",
    ):
        manifest(overrides={"spec": {"workerGroupSpecs": groups}})
    groups[0]["template"]["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1", "memory": "1Gi"}}
    m = manifest(overrides={"spec": {"workerGroupSpecs": groups}})
    assert [g["groupName"] for g in m["spec"]["workerGroupSpecs"]] == ["cpu"]


def test_every_problem_is_listed_at_once():
    errors = validate_raycluster(
        {
            "apiVersion": "ray.io/v1alpha1",
            "kind": "RayCluster",
            "metadata": {"name": "Bad", "namespace": "ns", "labels": {"k": "a b"}},
            "spec": {"headGroupSpec": {"rayStartParams": {"block": True}, "template": {"spec": {"containers": []}}}},
        }
    )
    text = "\n".join(errors)
    for fragment in (
        "apiVersion",
        "metadata.name",
        "label k='a b'",
        "spec.rayVersion",
        "headGroupSpec.rayStartParams.block",
        "headGroupSpec.template.spec.containers",
    ):
        assert fragment in text, (fragment, text)


def test_template_problems_name_the_file(tmp_path):
    with pytest.raises(KubeRayManifestError, match="does not exist: fix the path"):
        render_raycluster(tmp_path / "nope.yaml", "evergreen-x", NS)
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(KubeRayManifestError, match="holds a list, not one RayCluster"):
        render_raycluster(tmp_path / "list.yaml", "evergreen-x", NS)
    # a relative path is relative to the project, like the settings' kuberay_manifest
    assert render_raycluster("include/deploy/kuberay/raycluster.yaml", "evergreen-x", NS)["kind"] == "RayCluster"


def test_import_does_no_work():
    # DAG parsing imports operators; the kubernetes client must only load when a hook is used
    code = (
        "import sys, hooks.kuberay, hooks.kuberay_manifest, operators.ray_cluster; print('kubernetes' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


# --------------------------------------------------------------------------------------------------
# KubeRayHook against the fake API server
# --------------------------------------------------------------------------------------------------
class _Log:
    """Stands in for the hook's logger (Airflow's structlog setup bypasses caplog)."""

    def __init__(self):
        self.lines: list[str] = []

    def info(self, msg, *args):
        self.lines.append(msg % args)

    warning = info

    def debug(self, msg, *args):  # the connection lookup's "none defined" note
        pass


def test_create_and_wait_returns_the_endpoints(hook, fake, monkeypatch):
    log = _Log()
    monkeypatch.setattr(KubeRayHook, "log", property(lambda self: log))
    m = manifest(image="evergreen:abc")
    fake.gets_until_ready = 3
    cluster = hook.create_and_wait(m, timeout=10, poll=0.01)
    name = "evergreen-test-1a2b3c4d"
    host = f"{name}-head-svc.{NS}.svc.cluster.local"
    assert cluster == {
        "backend": "kuberay",
        "name": name,
        "namespace": NS,
        "address": f"{host}:6379",
        "dashboard_url": f"http://{host}:8265",
        "env": {"RAY_AUTH_MODE": "token"},  # the template's authOptions: the token itself stays in its Secret
        "kuberay": {"name": name, "namespace": NS, "conn_id": "kuberay_default"},
    }
    method, path, body = fake.requests[0]
    assert (method, path) == ("POST", f"/apis/ray.io/v1/namespaces/{NS}/rayclusters")
    assert body == m  # the manifest goes out as rendered
    assert fake.gets[(NS, name)] == 3  # polled until the state turned ready
    assert any("state=(none yet), workers ready 0/1" in line for line in log.lines), log.lines
    assert any("ready after" in line for line in log.lines), log.lines


def test_wait_ready_timeout_says_what_to_check(hook, fake):
    fake.gets_until_ready = 10**6
    fake.pods = [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "evergreen-test-1a2b3c4d-gpu-worker-x7k2p",
                "namespace": NS,
                "labels": {"ray.io/cluster": "evergreen-test-1a2b3c4d"},
            },
            "spec": {"containers": [{"name": "ray-worker", "image": "evergreen:gpu"}]},
            "status": {
                "phase": "Pending",
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
                    }
                ],
            },
        }
    ]
    hook.create_cluster(manifest())
    with pytest.raises(KubeRayTimeout) as err:
        hook.wait_ready("evergreen-test-1a2b3c4d", timeout=0.2, poll=0.02)
    text = str(err.value)
    assert "not ready after 0s" in text and "Insufficient nvidia.com/gpu" in text and "Pending" in text
    assert f"kubectl -n {NS} describe raycluster evergreen-test-1a2b3c4d" in text and "ImagePullBackOff" in text


def test_failed_state_and_a_vanished_cluster_raise_at_once(hook, fake):
    fake.final_state, fake.gets_until_ready = "failed", 1
    hook.create_cluster(manifest())
    with pytest.raises(KubeRayError, match="failed: boom") as err:
        hook.wait_ready("evergreen-test-1a2b3c4d", timeout=30, poll=0.01)
    assert not isinstance(err.value, KubeRayTimeout)
    with pytest.raises(KubeRayError, match="does not exist"):
        hook.wait_ready("evergreen-missing", timeout=30, poll=0.01)


def test_get_cluster_is_none_when_missing(hook, fake):
    assert hook.get_cluster("evergreen-missing") is None


def test_delete_is_idempotent_and_waits_until_gone(hook, fake):
    hook.create_cluster(manifest())
    fake.gets_until_gone = 3
    assert hook.delete_cluster("evergreen-test-1a2b3c4d", poll=0.01) is True
    assert (NS, "evergreen-test-1a2b3c4d") not in fake.clusters
    method, path, _ = [r for r in fake.requests if r[0] == "DELETE"][0]
    assert path.startswith(f"/apis/ray.io/v1/namespaces/{NS}/rayclusters/evergreen-test-1a2b3c4d")
    assert "propagationPolicy=Foreground" in path  # pods go before the resource does
    assert hook.delete_cluster("evergreen-test-1a2b3c4d") is False  # 404: nothing to delete, no error


def test_delete_timeout_points_at_finalizers(hook, fake):
    hook.create_cluster(manifest())
    fake.gets_until_gone = 10**6
    with pytest.raises(KubeRayTimeout, match="finalizer"):
        hook.delete_cluster("evergreen-test-1a2b3c4d", timeout=0.1, poll=0.01)
    assert hook.delete_cluster("evergreen-test-1a2b3c4d", wait=False) is True


def test_create_reuses_an_existing_cluster_and_waits_out_one_being_deleted(hook, fake):
    first = hook.create_cluster(manifest())
    again = hook.create_cluster(manifest())  # a retried setup task
    assert again["metadata"]["uid"] == first["metadata"]["uid"]
    hook.delete_cluster("evergreen-test-1a2b3c4d", wait=False)
    fake.gets_until_gone = 2
    fresh = hook.create_cluster(manifest(), poll=0.01)  # waits for the old one to go, then creates anew
    assert fresh["metadata"]["uid"] != first["metadata"]["uid"]


def test_missing_rbac_names_the_fix(hook, fake):
    fake.forbid = True
    with pytest.raises(KubeRayError, match=r"HTTP 403 .*forbidden.*rbac\.yaml"):
        hook.create_cluster(manifest())


def test_namespace_mismatch_is_caught_before_the_call(hook, fake):
    other = render_raycluster(RAYCLUSTER_TEMPLATE, "evergreen-x", "other")
    with pytest.raises(KubeRayError, match="namespace='other'"):
        hook.create_cluster(other)
    assert fake.requests == []


def test_head_endpoints_follow_a_custom_service_name_and_ports(hook, fake):
    m = manifest(
        overrides={
            "spec": {
                "headGroupSpec": {
                    "headService": {"metadata": {"name": "eg-head"}},
                    "rayStartParams": {"port": "6380", "dashboard-port": "8266"},
                }
            }
        }
    )
    hook.create_cluster(m)
    assert hook.head_endpoints("evergreen-test-1a2b3c4d") == {
        "address": f"eg-head.{NS}.svc.cluster.local:6380",
        "dashboard_url": f"http://eg-head.{NS}.svc.cluster.local:8266",
    }
    with pytest.raises(KubeRayError, match="does not exist"):
        hook.head_endpoints("evergreen-missing")


def test_auth_token_reads_the_secret_named_after_the_cluster(hook, fake):
    hook.create_cluster(manifest())
    with pytest.raises(KubeRayError, match="v1.5.1"):
        hook.auth_token("evergreen-test-1a2b3c4d")
    fake.secrets[(NS, "evergreen-test-1a2b3c4d")] = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "evergreen-test-1a2b3c4d", "namespace": NS},
        "data": {"auth_token": base64.b64encode(b"s3cr3t-token").decode()},
    }
    assert hook.auth_token("evergreen-test-1a2b3c4d") == "s3cr3t-token"
    hook.create_cluster(manifest(name="evergreen-noauth", overrides={"spec": {"authOptions": None}}))
    assert hook.auth_token("evergreen-noauth") is None


def test_an_unreachable_api_server_names_the_fix():
    from kubernetes import client

    cfg = client.Configuration()
    cfg.host = "http://127.0.0.1:9"  # discard port: nothing listens
    cfg.retries = False
    with pytest.raises(KubeRayError, match=r"cannot reach the Kubernetes API at http://127\.0\.0\.1:9"):
        KubeRayHook(namespace=NS, client_configuration=cfg).get_cluster("evergreen-x")


def test_no_config_names_the_fix(tmp_path):
    with pytest.raises(KubeRayError, match=r"kubeconfig .*nope.*config_file=/path/to/kubeconfig"):
        KubeRayHook(config_file=str(tmp_path / "nope")).get_conn()
    with pytest.raises(KubeRayError, match="service account"):
        KubeRayHook(in_cluster=True).get_conn()


def test_kubeconfig_file_and_context_are_used(tmp_path, server, fake):
    httpd, _ = server
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "other",
        "clusters": [
            {"name": "fake", "cluster": {"server": f"http://127.0.0.1:{httpd.server_address[1]}"}},
            {"name": "nowhere", "cluster": {"server": "http://127.0.0.1:9"}},
        ],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [
            {"name": "fake", "context": {"cluster": "fake", "user": "u"}},
            {"name": "other", "context": {"cluster": "nowhere", "user": "u"}},
        ],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig))
    assert KubeRayHook(namespace=NS, config_file=str(path), context="fake").get_cluster("evergreen-x") is None
    assert fake.requests and fake.requests[0][0] == "GET"
