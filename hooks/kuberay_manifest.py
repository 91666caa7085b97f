"""KubeRay manifests: render a RayCluster from the project template and validate it (pure: file in, dict out).

    from hooks.kuberay_manifest import render_raycluster, validate_raycluster, label_value

    manifest = render_raycluster("include/deploy/kuberay/raycluster.yaml", "evergreen-nightly-1a2b3c4d",
                                 "evergreen", image="registry.example.com/evergreen:cpu", run_key=run_id)
    validate_raycluster(manifest)      # [] here: render_raycluster raises KubeRayManifestError otherwise

`render_raycluster` sets the name, namespace, the `evergreen.run_key` label and the images, merges
overrides, and validates the result with messages that name the field and the fix, so a bad manifest
fails before anything reaches the API server. hooks/kuberay.py (KubeRayHook) creates and deletes what
this renders. Nothing here talks to Kubernetes; `yaml` is imported when a template is read.

KubeRay behaviour relied on (KubeRay's source, utils.ValidateRayClusterMetadata, and its v1.6/1.7 CRD
reference): a cluster name is a DNS-1035 label of at most 53 characters; rayStartParams values are strings.

Tests: tests/unit/operators/test_kuberay.py (rendering, validation) and tests/unit/test_deploy_files.py
(the shipped template and RayJob example pass these checks).
"""

from __future__ import annotations

import copy
import hashlib
import re
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parents[1]
RAYCLUSTER_TEMPLATE = PROJECT_ROOT / "include" / "deploy" / "kuberay" / "raycluster.yaml"
GROUP, VERSION, PLURAL = "ray.io", "v1", "rayclusters"
RUN_KEY_LABEL = "evergreen.run_key"
# KubeRay: 63 minus its longest service suffix ("-serve-svc"); a longer name is rejected by the operator
MAX_CLUSTER_NAME = 53

_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_LABEL_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class KubeRayManifestError(ValueError):
    """A RayCluster manifest that KubeRay or the API server would reject; each line names a field and the fix."""


def _unique_label(errors: list[str], where: str, value, seen: set, hint: str, duplicate: str) -> None:
    """A DNS-1123 label not used before among `seen` (container names in a pod, group names in a cluster)."""
    if not isinstance(value, str) or len(value) > 63 or not _DNS1123_LABEL.match(value):
        errors.append(
            f"{where}: {value!r} is not a DNS-1123 label (lowercase letters, digits, '-', <= 63 characters); {hint}"
        )
    elif value in seen:
        errors.append(f"{where}: {value!r} {duplicate}")
    seen.add(value)


def label_value(text: str) -> str:
    """`text` as a valid Kubernetes label value: [A-Za-z0-9_.-], alphanumeric at both ends, <= 63 characters.

    Airflow run ids ("scheduled__2026-12-02T00:00:00+00:00") contain ':' and '+', which labels refuse.
    A value that had to be cut keeps a hash of the whole text, so two long keys stay distinct.
    """
    clean = re.sub(r"[^A-Za-z0-9_.-]+", "-", text)
    clean = re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", clean)
    if len(clean) <= 63 and clean:
        return clean
    digest = hashlib.sha1(text.encode()).hexdigest()[:8]
    head = re.sub(r"[^A-Za-z0-9]+$", "", clean[:54])
    return f"{head}-{digest}" if head else digest


def _groups(manifest: dict) -> list[tuple[str, dict]]:
    """(group name, group spec) for the head ("head") and each worker group."""
    spec = manifest.get("spec") or {}
    out = [("head", spec.get("headGroupSpec") or {})]
    out += [(str(g.get("groupName")), g) for g in spec.get("workerGroupSpecs") or [] if isinstance(g, dict)]
    return out


def _containers(group: dict) -> list[dict]:
    return [
        c for c in (((group.get("template") or {}).get("spec") or {}).get("containers") or []) if isinstance(c, dict)
    ]


def _merge(base: dict, over: dict, where: str) -> dict:
    """Deep-merge `over` into a copy of `base`: dicts merge, other values (lists too) replace, None deletes.

    `workerGroupSpecs` may also be a dict keyed by groupName, merged into the group of that name:
    {"spec": {"workerGroupSpecs": {"gpu": {"maxReplicas": 4}}}}.
    """
    out = copy.deepcopy(base)
    for key, value in over.items():
        here = f"{where}.{key}" if where else key
        if value is None:
            out.pop(key, None)
        elif key == "workerGroupSpecs" and isinstance(value, dict):
            groups = list(out.get(key) or [])
            names = [g.get("groupName") for g in groups]
            for name, group_over in value.items():
                if name not in names:
                    raise KubeRayManifestError(
                        f"overrides {here}.{name}: the template has no worker group {name!r} (groups: {names}); "
                        "use one of those names, or give workerGroupSpecs as a list to replace all groups"
                    )
                if not isinstance(group_over, dict):
                    raise KubeRayManifestError(
                        f"overrides {here}.{name}: expected a mapping of group fields, got {type(group_over).__name__}"
                    )
                i = names.index(name)
                groups[i] = _merge(groups[i], group_over, f"{here}.{name}")
            out[key] = groups
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value, here)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _check_labels(labels: Any, where: str, errors: list[str]) -> None:
    if labels is None:
        return
    if not isinstance(labels, dict):
        errors.append(f"{where}: expected a mapping of label key -> value, got {type(labels).__name__}")
        return
    for key, value in labels.items():
        prefix, _, name = str(key).rpartition("/")
        if (
            not name
            or len(name) > 63
            or not _LABEL_VALUE.match(name)
            or (prefix and (len(prefix) > 253 or not _LABEL_PREFIX.match(prefix)))
        ):
            errors.append(
                f"{where}: label key {key!r} is invalid: use [prefix/]name with name <= 63 characters of "
                "[A-Za-z0-9_.-], alphanumeric at both ends (prefix: a DNS subdomain)"
            )
        if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.match(value):
            errors.append(
                f"{where}: label {key}={value!r} is invalid: a label value is a string of <= 63 characters "
                "of [A-Za-z0-9_.-], alphanumeric at both ends (hooks.kuberay_manifest.label_value() makes one)"
            )


def _check_group(name: str, group: dict, where: str, errors: list[str]) -> None:
    params = group.get("rayStartParams")  # optional: KubeRay fills in its defaults
    if params is not None and not isinstance(params, dict):
        errors.append(f"{where}.rayStartParams: expected a mapping, got {type(params).__name__}")
    else:
        for key, value in (params or {}).items():
            if not isinstance(value, str):
                errors.append(
                    f"{where}.rayStartParams.{key}: {value!r} is a {type(value).__name__}; the CRD takes "
                    f'strings only: quote it ({key}: "{value}")'
                )
    _check_labels(
        ((group.get("template") or {}).get("metadata") or {}).get("labels"), f"{where}.template.metadata.labels", errors
    )
    containers = _containers(group)
    if not containers:
        errors.append(f"{where}.template.spec.containers: missing or empty; a {name} pod needs its Ray container")
        return
    seen = set()
    for i, container in enumerate(containers):
        cwhere = f"{where}.template.spec.containers[{i}]"
        _unique_label(
            errors,
            f"{cwhere}.name",
            container.get("name"),
            seen,
            "e.g. ray-head / ray-worker",
            "is used twice in this pod; container names must be unique",
        )
        if not isinstance(container.get("image"), str) or not container["image"].strip():
            errors.append(f"{cwhere}.image: missing; pass image= to render_raycluster() or set it in the template")
    # KubeRay turns the Ray container's limits into `ray start --num-cpus/--memory`; without them Ray
    # counts the whole node's CPUs and memory and over-schedules the pod
    limits = (containers[0].get("resources") or {}).get("limits") or {}
    missing = [r for r in ("cpu", "memory") if r not in limits]
    if missing:
        errors.append(
            f"{where}.template.spec.containers[0].resources.limits: no {' or '.join(missing)}; set them "
            "(KubeRay derives ray start --num-cpus/--memory from the limits)"
        )


def validate_raycluster(manifest: Any) -> list[str]:
    """Problems that KubeRay or the API server would reject, one line each (field: problem; fix). [] if none."""
    errors: list[str] = []
    if not isinstance(manifest, dict):
        return [f"the manifest is a {type(manifest).__name__}, not a mapping: the file must hold one RayCluster"]
    if manifest.get("apiVersion") != f"{GROUP}/{VERSION}":
        errors.append(
            f"apiVersion: {manifest.get('apiVersion')!r}; KubeRay serves RayCluster as {GROUP}/{VERSION}: "
            f"set apiVersion: {GROUP}/{VERSION}"
        )
    if manifest.get("kind") != "RayCluster":
        errors.append(f"kind: {manifest.get('kind')!r}; set kind: RayCluster")
    meta = manifest.get("metadata") or {}
    name = meta.get("name")
    if not isinstance(name, str) or not _DNS1035.match(name) or len(name) > MAX_CLUSTER_NAME:
        errors.append(
            f"metadata.name: {name!r} is not a valid RayCluster name: KubeRay needs a DNS-1035 label "
            f"(lowercase letters, digits and '-', starting with a letter) of at most {MAX_CLUSTER_NAME} "
            "characters (its Services append up to 10); shorten or re-slug it"
        )
    namespace = meta.get("namespace")
    if not isinstance(namespace, str) or len(namespace) > 63 or not _DNS1123_LABEL.match(namespace):
        errors.append(
            f"metadata.namespace: {namespace!r} is not a DNS-1123 label (lowercase letters, digits, '-', "
            "<= 63 characters); use the namespace the RBAC Role lives in (include/deploy/kuberay/rbac.yaml)"
        )
    _check_labels(meta.get("labels"), "metadata.labels", errors)
    spec = manifest.get("spec")
    if not isinstance(spec, dict):
        errors.append("spec: missing; a RayCluster needs spec.headGroupSpec (and usually spec.workerGroupSpecs)")
        return errors
    if not isinstance(spec.get("rayVersion"), str) or not spec["rayVersion"]:
        errors.append(
            'spec.rayVersion: missing; set it to the image\'s Ray version as a string ("2.60.0"); '
            "KubeRay needs it for token auth and the autoscaler"
        )
    if not isinstance(spec.get("headGroupSpec"), dict):
        errors.append("spec.headGroupSpec: missing; a RayCluster needs a head group")
    else:
        _check_group("head", spec["headGroupSpec"], "spec.headGroupSpec", errors)
    workers = spec.get("workerGroupSpecs") or []
    if not isinstance(workers, list):
        errors.append(f"spec.workerGroupSpecs: expected a list of groups, got {type(workers).__name__}")
        return errors
    names = set()
    for i, group in enumerate(workers):
        where = f"spec.workerGroupSpecs[{i}]"
        if not isinstance(group, dict):
            errors.append(f"{where}: expected a mapping, got {type(group).__name__}")
            continue
        _unique_label(
            errors,
            f"{where}.groupName",
            group.get("groupName"),
            names,
            "KubeRay puts it in pod names and labels",
            "is used by two groups; give each group its own name",
        )
        counts = {k: group.get(k) for k in ("replicas", "minReplicas", "maxReplicas")}
        bad = [
            k for k, v in counts.items() if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0)
        ]
        for k in bad:
            errors.append(f"{where}.{k}: {counts[k]!r}; expected a whole number >= 0")
        lo, hi, n = counts["minReplicas"], counts["maxReplicas"], counts["replicas"]
        if not bad and lo is not None and hi is not None:
            if lo > hi:
                errors.append(f"{where}: minReplicas {lo} > maxReplicas {hi}; raise maxReplicas or lower minReplicas")
            elif n is not None and not lo <= n <= hi:
                errors.append(
                    f"{where}.replicas: {n} is outside [minReplicas {lo}, maxReplicas {hi}]; KubeRay would "
                    "clamp it: set replicas inside the range"
                )
        _check_group(str(group.get("groupName")), group, where, errors)
    return errors


def render_raycluster(
    template_path: str | Path | None,
    name: str,
    namespace: str,
    image: str | None = None,
    overrides: dict | None = None,
    *,
    run_key: str | None = None,
    group_images: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
) -> dict:
    """The RayCluster to create: the template with `overrides` merged, then name, namespace, labels and images set.

    template_path: a YAML file holding one RayCluster (None: include/deploy/kuberay/raycluster.yaml; a
        relative path is relative to the project, like the settings' paths).
    image: set on every container of every group (head and workers); None keeps the template's.
    overrides: merged into the template first (see `_merge`: dicts merge, lists replace, None deletes,
        workerGroupSpecs may be keyed by groupName). name, namespace, labels and images win over it.
    run_key: the DAG run this cluster belongs to; it becomes the `evergreen.run_key` label (sanitised by
        `label_value`) on the RayCluster and on every pod, so `kubectl get pods -l evergreen.run_key=...`
        finds them. Default: the cluster name.
    group_images: per-group images applied after `image`, keyed by groupName or "head", e.g.
        {"gpu": "registry.example.com/evergreen:gpu"} for CUDA workers beside CPU ones.
    Raises KubeRayManifestError listing every problem (field, problem, fix).
    """
    import yaml

    path = Path(template_path) if template_path else RAYCLUSTER_TEMPLATE
    if not path.is_absolute():
        path = PROJECT_ROOT / path
    if not path.is_file():
        raise KubeRayManifestError(
            f"RayCluster template {path} does not exist: fix the path (ray.kuberay_manifest) "
            f"or use the shipped {RAYCLUSTER_TEMPLATE.relative_to(PROJECT_ROOT)}"
        )
    try:
        manifest = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise KubeRayManifestError(f"RayCluster template {path} is not valid YAML: {e}") from None
    if not isinstance(manifest, dict):
        raise KubeRayManifestError(
            f"RayCluster template {path} holds a {type(manifest).__name__}, not one RayCluster "
            "mapping (apiVersion, kind, metadata, spec)"
        )
    if overrides:
        manifest = _merge(manifest, overrides, "")
    meta = manifest.get("metadata")
    meta = manifest["metadata"] = dict(meta) if isinstance(meta, dict) else {}
    meta["name"], meta["namespace"] = name, namespace
    extra = {**(labels or {}), RUN_KEY_LABEL: label_value(run_key if run_key is not None else str(name))}
    meta["labels"] = {**(meta.get("labels") or {}), **extra}
    for _, group in _groups(manifest):
        template = group.get("template")
        if isinstance(template, dict):
            tmeta = template.setdefault("metadata", {}) or {}
            template["metadata"] = tmeta
            tmeta["labels"] = {**(tmeta.get("labels") or {}), **extra}
    if image:
        for _, group in _groups(manifest):
            for container in _containers(group):
                container["image"] = image
    if group_images:
        known = {gname: group for gname, group in _groups(manifest)}
        for gname, gimage in group_images.items():
            if gname not in known:
                raise KubeRayManifestError(
                    f"group_images[{gname!r}]: no such group in {path.name} (groups: "
                    f"{sorted(known)}); use 'head' or a worker groupName"
                )
            for container in _containers(known[gname]):
                container["image"] = gimage
    errors = validate_raycluster(manifest)
    if errors:
        raise KubeRayManifestError(
            f"RayCluster {name!r} rendered from {path} is invalid:\n  - " + "\n  - ".join(errors)
        )
    return manifest
