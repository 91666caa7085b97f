"""The deployment files (Dockerfile, include/deploy/) parse and agree with each other and with the code.

    pytest -q tests/unit/test_deploy_files.py        # under a second

No Docker engine, Kubernetes or Helm runs on this machine, so these are static checks: what a typo or a
version bump on one side only would break (image names, Ray/Airflow versions, service account names,
namespaces, EVERGREEN_* variables that the settings model must accept).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from hooks.kuberay_manifest import validate_raycluster

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "include" / "deploy"
# what the image needs of the repository: the DAGs, the provider (hooks, operators, triggers), plugins, tasks, inputs
SOURCE_FOLDERS = ("dags", "hooks", "operators", "triggers", "plugins", "tasks", "include")


def _load(rel: str):
    return yaml.safe_load((DEPLOY / rel).read_text())


def _pin(requirements: str, package: str) -> str:
    for line in (ROOT / requirements).read_text().splitlines():
        m = re.match(rf"^{re.escape(package)}(\[[^\]]*\])?==(\S+)", line.strip())
        if m:
            return m.group(2)
    raise AssertionError(f"{package} is not pinned with == in {requirements}")


def _containers(group: dict) -> list[dict]:
    return group["template"]["spec"]["containers"]


def _dockerfile() -> str:
    # join continuation lines so that one RUN is one string
    return re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())


@pytest.mark.parametrize("path", sorted(p.relative_to(DEPLOY).as_posix() for p in DEPLOY.rglob("*.y*ml")))
def test_every_yaml_parses(path):
    docs = [d for d in yaml.safe_load_all((DEPLOY / path).read_text()) if d is not None]
    assert docs, f"{path} is empty"
    assert all(isinstance(d, dict) for d in docs), f"{path}: every document must be a mapping"


def test_the_raycluster_has_a_head_and_cpu_and_gpu_workers_with_resources():
    rc = _load("kuberay/raycluster.yaml")
    assert (rc["apiVersion"], rc["kind"]) == ("ray.io/v1", "RayCluster")
    assert validate_raycluster(rc) == []
    spec = rc["spec"]
    assert spec["rayVersion"] == _pin("requirements.txt", "ray"), "rayVersion must be the Ray in the image"
    head = spec["headGroupSpec"]
    ports = {p["containerPort"] for p in _containers(head)[0]["ports"]}
    assert {6379, 8265} <= ports
    assert head["rayStartParams"]["dashboard-host"] == "0.0.0.0"  # the Jobs API must be reachable off-pod
    groups = {g["groupName"]: g for g in spec["workerGroupSpecs"]}
    assert set(groups) == {"cpu", "gpu"}
    for group in [head, *groups.values()]:
        limits = _containers(group)[0]["resources"]["limits"]
        assert {"cpu", "memory"} <= set(limits)
    gpu = groups["gpu"]
    assert _containers(gpu)[0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert gpu["minReplicas"] == 0 and gpu["maxReplicas"] >= 1
    assert spec["enableInTreeAutoscaling"] is True, "a GPU group that starts at 0 pods needs the autoscaler"
    assert spec["authOptions"]["mode"] == "token", "Ray 2.60 clusters require a token"


def test_the_rayjob_example_runs_the_same_ray_and_a_real_command():
    job = _load("kuberay/rayjob.yaml")
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    assert job["spec"]["rayClusterSpec"]["rayVersion"] == _pin("requirements.txt", "ray")
    assert job["spec"]["entrypoint"].startswith("python -m tasks train ")
    # the example's cluster passes the same checks as the template (wrapped as a RayCluster)
    as_cluster = {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": job["metadata"]["name"], "namespace": job["metadata"]["namespace"]},
        "spec": job["spec"]["rayClusterSpec"],
    }
    assert validate_raycluster(as_cluster) == []


def test_rbac_lets_the_airflow_service_accounts_manage_rayclusters_in_the_template_namespace():
    docs = {d["kind"]: d for d in yaml.safe_load_all((DEPLOY / "kuberay/rbac.yaml").read_text())}
    namespace = _load("kuberay/raycluster.yaml")["metadata"]["namespace"]
    assert docs["Namespace"]["metadata"]["name"] == namespace
    assert docs["Role"]["metadata"]["namespace"] == docs["RoleBinding"]["metadata"]["namespace"] == namespace
    ray_rule = next(r for r in docs["Role"]["rules"] if "ray.io" in r["apiGroups"] and "rayclusters" in r["resources"])
    assert {"create", "get", "delete", "list", "watch"} <= set(ray_rule["verbs"])
    assert any("secrets" in r["resources"] and "get" in r["verbs"] for r in docs["Role"]["rules"])  # the Ray token
    values = _load("helm/values.yaml")
    subjects = {s["name"] for s in docs["RoleBinding"]["subjects"]}
    assert subjects == {
        values["workers"]["kubernetes"]["serviceAccount"]["name"],
        values["triggerer"]["serviceAccount"]["name"],
    }


def test_helm_values_create_the_registry_pool_after_migrating():
    """A task naming a pool that does not exist is never scheduled: the chart's migration job creates it."""
    from operators.pools import REGISTRY_POOL

    script = " ".join(_load("helm/values.yaml")["migrateDatabaseJob"]["args"])
    assert "airflow db migrate &&" in script
    assert f"airflow pools set {REGISTRY_POOL} 1 " in script


def _env(values: dict) -> dict:
    return {e["name"]: e["value"] for e in values["env"]}


def test_helm_values_use_the_evergreen_image_and_set_the_environment():
    values = _load("helm/values.yaml")
    image = f"{values['images']['airflow']['repository']}:{values['images']['airflow']['tag']}"
    assert image == f"{values['defaultAirflowRepository']}:{values['defaultAirflowTag']}"
    head_image = _containers(_load("kuberay/raycluster.yaml")["spec"]["headGroupSpec"])[0]["image"]
    assert image == head_image, "Airflow and the Ray head run the same (CPU) image"
    assert values["airflowVersion"] == _pin("requirements.txt", "apache-airflow")
    assert values["executor"] in ("KubernetesExecutor", "CeleryExecutor")
    env = _env(values)
    assert env["EVERGREEN_RAY__BACKEND"] == "kuberay"
    assert env["EVERGREEN_TRACKING__URI"].startswith("http")
    assert env["EVERGREEN_RAY__KUBERAY_NAMESPACE"] == _load("kuberay/raycluster.yaml")["metadata"]["namespace"]
    assert int(env["AIRFLOW__EXECUTION_API__JWT_EXPIRATION_TIME"]) > 600  # raised above the 600 s default
    secrets = {s["envName"]: s for s in values["secret"]}
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= set(secrets)
    assert not any("KEY" in name for name in env), "S3 keys come from a Secret, never from a value"
    assert values["data"]["metadataSecretName"] and values["postgresql"]["enabled"] is False
    assert values["config"]["core"]["dags_folder"] == "/opt/airflow/evergreen/dags"


def test_every_evergreen_variable_of_the_image_and_the_chart_is_a_setting():
    # tasks.config forbids unknown fields: a misspelt EVERGREEN_X__Y would stop every task at load_settings
    from tasks.config import load_settings

    dockerfile_env = dict(re.findall(r"\b(EVERGREEN_[A-Z0-9_]+)=(\S+)", _dockerfile()))
    for layer in (dockerfile_env, {**dockerfile_env, **_env(_load("helm/values.yaml"))}):
        environ = {k: v for k, v in layer.items() if "__" in k}  # EVERGREEN_CONFIG is a path, not a field
        settings = load_settings(environ=environ)
        assert settings.ray.kuberay_namespace == "evergreen"
    assert settings.ray.backend == "kuberay" and settings.tracking.uri.startswith("http")
    assert dockerfile_env["EVERGREEN_CONFIG"] == "/opt/airflow/evergreen/include/config/pipeline.yaml"


def test_dockerfile_builds_on_airflow_3_3_2_and_installs_the_requirements_like_the_makefile():
    text = _dockerfile()
    froms = re.findall(r"^FROM\s+(\S+)", text, flags=re.M)
    assert froms == ["apache/airflow:3.3.2-python3.11"]
    assert froms[0].split(":")[1].split("-")[0] == _pin("requirements.txt", "apache-airflow")
    assert re.search(r"^ARG REQUIREMENTS=requirements\.txt$", text, flags=re.M)
    installs = [line for line in text.splitlines() if "pip install" in line]
    # torch: the CPU build, the same pin as requirements.txt, from PyTorch's CPU index, before the rest
    torch = _pin("requirements.txt", "torch")
    assert torch.endswith("+cpu")
    torch_cmd = re.search(r'pip install [^;]*--index-url "?\$\{TORCH_CPU_INDEX\}"? "?torch==([^"\s;]+)', text)
    assert torch_cmd and torch_cmd.group(1) == torch
    assert "ARG TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu" in text
    # the requirements, with apache-airflow pinned in the same pip call (the Airflow image's rule)
    req_cmd = re.search(
        r'pip install [^;]*"apache-airflow==\$\{AIRFLOW_VERSION\}" -r "/tmp/evergreen/\$\{REQUIREMENTS\}"', text
    )
    assert req_cmd and text.index(torch_cmd.group(0)) < text.index(req_cmd.group(0)), installs
    assert re.search(r"pip uninstall -y torchvision torchaudio torchcodec triton", text)
    assert re.search(r"COPY [^\n]*requirements\.txt requirements-gpu\.txt /tmp/evergreen/", text)


def test_dockerfile_copies_the_source_folders_and_configures_airflow():
    text = _dockerfile()
    for folder in SOURCE_FOLDERS:
        assert re.search(rf"^COPY --chown=airflow:root {folder} /opt/airflow/evergreen/{folder}$", text, flags=re.M), (
            folder
        )
    for setting in (
        "PYTHONPATH=/opt/airflow/evergreen",
        "AIRFLOW__CORE__DAGS_FOLDER=/opt/airflow/evergreen/dags",
        "AIRFLOW__CORE__PLUGINS_FOLDER=/opt/airflow/evergreen/plugins",
    ):
        assert setting in text
    users = re.findall(r"^USER\s+(\S+)", text, flags=re.M)
    assert users[-1] == "airflow", "the image must not run as root"


def test_dockerignore_keeps_local_state_out():
    patterns = {
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".venv", "runs", ".git", ".stack", "test-artifacts"} <= patterns
    for needed in (*SOURCE_FOLDERS, "requirements.txt", "requirements-gpu.txt"):
        assert needed not in patterns


def test_helm_values_keep_runs_and_task_logs_on_s3():
    """One pod per task shares no disk: the runs live on S3 (each task works in its pod's scratch dir) and the
    task logs go to S3 before the pod is deleted; the settings load with them (an MLflow server is set)."""
    from tasks.config import load_settings

    values = _load("helm/values.yaml")
    env = _env(values)
    assert env["EVERGREEN_RUN_DIR"].startswith("s3://") and env["EVERGREEN_SCRATCH_DIR"].startswith("/")
    settings = load_settings(environ={k: v for k, v in env.items() if k.startswith("EVERGREEN_")})
    assert settings.run_dir == env["EVERGREEN_RUN_DIR"] and settings.tracking.uri
    logging = values["config"]["logging"]
    assert logging["remote_logging"] == "True" and logging["remote_base_log_folder"].startswith("s3://")
    assert "AIRFLOW_CONN_" + logging["remote_log_conn_id"].upper() in {s["envName"] for s in values["secret"]}
