"""KubeRay: render a RayCluster from the project template, create it, wait until it is ready, delete it.

    from operators.kuberay import KubeRayHook, render_raycluster

    manifest = render_raycluster("include/deploy/kuberay/raycluster.yaml", "evergreen-nightly-1a2b3c4d",
                                 "evergreen", image="registry.example.com/evergreen:cpu", run_key=run_id)
    hook = KubeRayHook(namespace="evergreen")     # in a pod: its service account; else ~/.kube/config
    cluster = hook.create_and_wait(manifest, timeout=900)
    # {"backend": "kuberay", "name": ..., "namespace": "evergreen",
    #  "address": "evergreen-nightly-1a2b3c4d-head-svc.evergreen.svc.cluster.local:6379",
    #  "dashboard_url": "http://evergreen-nightly-1a2b3c4d-head-svc.evergreen.svc.cluster.local:8265"}
    token = hook.auth_token(cluster["name"])      # Ray 2.60 drivers need RAY_AUTH_MODE=token, RAY_AUTH_TOKEN
    hook.delete_cluster(cluster["name"])          # idempotent (a missing cluster is fine); waits until gone

`render_raycluster` is a pure function (file in, dict out): it sets the name, namespace, the
`evergreen.run_key` label and the images, merges overrides, and validates the result with messages that
name the field and the fix, so a bad manifest fails before anything reaches the API server.

`KubeRayHook` wraps the kubernetes client's CustomObjectsApi (RayCluster, ray.io/v1) and CoreV1Api (the
token Secret, pod diagnostics) and nothing more. `kubernetes` is imported inside methods: parsing a DAG
that imports this module loads no client. Config, first that applies: an explicit
`kubernetes.client.Configuration` (tests), the pod's service account when running in a cluster, a
kubeconfig (`config_file`, `context`; default $KUBECONFIG or ~/.kube/config).

KubeRay behaviour relied on (KubeRay's source, utils.GenerateHeadServiceName / ValidateRayClusterMetadata,
and its v1.6/1.7 CRD reference): the head Service is `<cluster>-head-svc` unless
spec.headGroupSpec.headService.metadata.name names another; `.status.state` becomes "ready" once every pod
is ready; a cluster name is a DNS-1035 label of at most 53 characters; with spec.authOptions.mode=token
(KubeRay >= 1.5.1) the token is in the Secret named after the cluster, key `auth_token`.

Tests: tests/unit/operators/test_kuberay.py (a small HTTP server stands in for the Kubernetes API).
"""
from __future__ import annotations

import base64
import copy
import hashlib
import json
import os
import re
import time
from pathlib import Path
from typing import Any

from airflow.sdk import BaseHook

PROJECT_ROOT = Path(__file__).resolve().parents[1]
RAYCLUSTER_TEMPLATE = PROJECT_ROOT / "include" / "deploy" / "kuberay" / "raycluster.yaml"
GROUP, VERSION, PLURAL = "ray.io", "v1", "rayclusters"
RUN_KEY_LABEL = "evergreen.run_key"
# KubeRay: 63 minus its longest service suffix ("-serve-svc"); a longer name is rejected by the operator
MAX_CLUSTER_NAME = 53
DEFAULT_GCS_PORT, DEFAULT_DASHBOARD_PORT = 6379, 8265

_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_LABEL_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class KubeRayError(RuntimeError):
    """The API server refused, or the cluster did not get where it should; the message says what to check."""


class KubeRayTimeout(KubeRayError, TimeoutError):
    """A RayCluster did not become ready (or go away) in time."""


class KubeRayManifestError(ValueError):
    """A RayCluster manifest that KubeRay or the API server would reject; each line names a field and the fix."""


# --------------------------------------------------------------------------------------------------
# rendering and validation (pure)
# --------------------------------------------------------------------------------------------------

def _unique_label(errors: list[str], where: str, value, seen: set, hint: str, duplicate: str) -> None:
    """A DNS-1123 label not used before among `seen` (container names in a pod, group names in a cluster)."""
    if not isinstance(value, str) or len(value) > 63 or not _DNS1123_LABEL.match(value):
        errors.append(f"{where}: {value!r} is not a DNS-1123 label (lowercase letters, digits, '-', "
                      f"<= 63 characters); {hint}")
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
    return [c for c in (((group.get("template") or {}).get("spec") or {}).get("containers") or []) if isinstance(c, dict)]


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
                        "use one of those names, or give workerGroupSpecs as a list to replace all groups")
                if not isinstance(group_over, dict):
                    raise KubeRayManifestError(f"overrides {here}.{name}: expected a mapping of group fields, "
                                               f"got {type(group_over).__name__}")
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
        if not name or len(name) > 63 or not _LABEL_VALUE.match(name) or (prefix and (len(prefix) > 253
                                                                                      or not _LABEL_PREFIX.match(prefix))):
            errors.append(f"{where}: label key {key!r} is invalid: use [prefix/]name with name <= 63 characters of "
                          "[A-Za-z0-9_.-], alphanumeric at both ends (prefix: a DNS subdomain)")
        if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.match(value):
            errors.append(f"{where}: label {key}={value!r} is invalid: a label value is a string of <= 63 characters "
                          "of [A-Za-z0-9_.-], alphanumeric at both ends (operators.kuberay.label_value() makes one)")


def _check_group(name: str, group: dict, where: str, errors: list[str]) -> None:
    params = group.get("rayStartParams")  # optional: KubeRay fills in its defaults
    if params is not None and not isinstance(params, dict):
        errors.append(f"{where}.rayStartParams: expected a mapping, got {type(params).__name__}")
    else:
        for key, value in (params or {}).items():
            if not isinstance(value, str):
                errors.append(f"{where}.rayStartParams.{key}: {value!r} is a {type(value).__name__}; the CRD takes "
                              f"strings only: quote it ({key}: \"{value}\")")
    _check_labels(((group.get("template") or {}).get("metadata") or {}).get("labels"),
                  f"{where}.template.metadata.labels", errors)
    containers = _containers(group)
    if not containers:
        errors.append(f"{where}.template.spec.containers: missing or empty; a {name} pod needs its Ray container")
        return
    seen = set()
    for i, container in enumerate(containers):
        cwhere = f"{where}.template.spec.containers[{i}]"
        _unique_label(errors, f"{cwhere}.name", container.get("name"), seen, "e.g. ray-head / ray-worker",
                      "is used twice in this pod; container names must be unique")
        if not isinstance(container.get("image"), str) or not container["image"].strip():
            errors.append(f"{cwhere}.image: missing; pass image= to render_raycluster() or set it in the template")
    # KubeRay turns the Ray container's limits into `ray start --num-cpus/--memory`; without them Ray
    # counts the whole node's CPUs and memory and over-schedules the pod
    limits = ((containers[0].get("resources") or {}).get("limits") or {})
    missing = [r for r in ("cpu", "memory") if r not in limits]
    if missing:
        errors.append(f"{where}.template.spec.containers[0].resources.limits: no {' or '.join(missing)}; set them "
                      "(KubeRay derives ray start --num-cpus/--memory from the limits)")


def validate_raycluster(manifest: Any) -> list[str]:
    """Problems that KubeRay or the API server would reject, one line each (field: problem; fix). [] if none."""
    errors: list[str] = []
    if not isinstance(manifest, dict):
        return [f"the manifest is a {type(manifest).__name__}, not a mapping: the file must hold one RayCluster"]
    if manifest.get("apiVersion") != f"{GROUP}/{VERSION}":
        errors.append(f"apiVersion: {manifest.get('apiVersion')!r}; KubeRay serves RayCluster as {GROUP}/{VERSION}: "
                      f"set apiVersion: {GROUP}/{VERSION}")
    if manifest.get("kind") != "RayCluster":
        errors.append(f"kind: {manifest.get('kind')!r}; set kind: RayCluster")
    meta = manifest.get("metadata") or {}
    name = meta.get("name")
    if not isinstance(name, str) or not _DNS1035.match(name) or len(name) > MAX_CLUSTER_NAME:
        errors.append(f"metadata.name: {name!r} is not a valid RayCluster name: KubeRay needs a DNS-1035 label "
                      f"(lowercase letters, digits and '-', starting with a letter) of at most {MAX_CLUSTER_NAME} "
                      "characters (its Services append up to 10); shorten or re-slug it")
    namespace = meta.get("namespace")
    if not isinstance(namespace, str) or len(namespace) > 63 or not _DNS1123_LABEL.match(namespace):
        errors.append(f"metadata.namespace: {namespace!r} is not a DNS-1123 label (lowercase letters, digits, '-', "
                      "<= 63 characters); use the namespace the RBAC Role lives in (include/deploy/kuberay/rbac.yaml)")
    _check_labels(meta.get("labels"), "metadata.labels", errors)
    spec = manifest.get("spec")
    if not isinstance(spec, dict):
        errors.append("spec: missing; a RayCluster needs spec.headGroupSpec (and usually spec.workerGroupSpecs)")
        return errors
    if not isinstance(spec.get("rayVersion"), str) or not spec["rayVersion"]:
        errors.append("spec.rayVersion: missing; set it to the image's Ray version as a string (\"2.60.0\"); "
                      "KubeRay needs it for token auth and the autoscaler")
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
        _unique_label(errors, f"{where}.groupName", group.get("groupName"), names,
                      "KubeRay puts it in pod names and labels", "is used by two groups; give each group its own name")
        counts = {k: group.get(k) for k in ("replicas", "minReplicas", "maxReplicas")}
        bad = [k for k, v in counts.items() if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0)]
        for k in bad:
            errors.append(f"{where}.{k}: {counts[k]!r}; expected a whole number >= 0")
        lo, hi, n = counts["minReplicas"], counts["maxReplicas"], counts["replicas"]
        if not bad and lo is not None and hi is not None:
            if lo > hi:
                errors.append(f"{where}: minReplicas {lo} > maxReplicas {hi}; raise maxReplicas or lower minReplicas")
            elif n is not None and not lo <= n <= hi:
                errors.append(f"{where}.replicas: {n} is outside [minReplicas {lo}, maxReplicas {hi}]; KubeRay would "
                              "clamp it: set replicas inside the range")
        _check_group(str(group.get("groupName")), group, where, errors)
    return errors


def render_raycluster(template_path: str | Path | None, name: str, namespace: str, image: str | None = None,
                      overrides: dict | None = None, *, run_key: str | None = None,
                      group_images: dict[str, str] | None = None, labels: dict[str, str] | None = None) -> dict:
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
        raise KubeRayManifestError(f"RayCluster template {path} does not exist: fix the path (ray.kuberay_manifest) "
                                   f"or use the shipped {RAYCLUSTER_TEMPLATE.relative_to(PROJECT_ROOT)}")
    try:
        manifest = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise KubeRayManifestError(f"RayCluster template {path} is not valid YAML: {e}") from None
    if not isinstance(manifest, dict):
        raise KubeRayManifestError(f"RayCluster template {path} holds a {type(manifest).__name__}, not one RayCluster "
                                   "mapping (apiVersion, kind, metadata, spec)")
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
                raise KubeRayManifestError(f"group_images[{gname!r}]: no such group in {path.name} (groups: "
                                           f"{sorted(known)}); use 'head' or a worker groupName")
            for container in _containers(known[gname]):
                container["image"] = gimage
    errors = validate_raycluster(manifest)
    if errors:
        raise KubeRayManifestError(f"RayCluster {name!r} rendered from {path} is invalid:\n  - " + "\n  - ".join(errors))
    return manifest


# --------------------------------------------------------------------------------------------------
# the hook
# --------------------------------------------------------------------------------------------------
class KubeRayHook(BaseHook):
    """RayCluster lifecycle through the Kubernetes API (see the module docstring for an example).

    namespace: where the clusters live (the RBAC Role's namespace, ray.kuberay_namespace).
    config_file / context: a kubeconfig and a context in it (outside a cluster).
    in_cluster: force (True) or forbid (False) the pod's service account; None: use it when running in a pod
        and no kubeconfig was named.
    client_configuration: a ready kubernetes.client.Configuration (takes precedence; tests point it at a fake).
    cluster_domain: the cluster's DNS domain in service addresses (KubeRay's CLUSTER_DOMAIN, default cluster.local).
    request_timeout: seconds one API call may take.
    """

    conn_type = "kuberay"
    hook_name = "KubeRay"

    def __init__(self, namespace: str = "default", config_file: str | None = None, context: str | None = None,
                 in_cluster: bool | None = None, client_configuration: Any = None,
                 cluster_domain: str = "cluster.local", request_timeout: float = 30.0,
                 logger_name: str | None = None) -> None:
        super().__init__(logger_name=logger_name)
        self.namespace, self.config_file, self.context = namespace, config_file, context
        self.in_cluster, self.client_configuration, self.cluster_domain = in_cluster, client_configuration, cluster_domain
        self.request_timeout = request_timeout
        self._api_client = None

    # -- client ------------------------------------------------------------------------------------
    def get_conn(self):
        """The kubernetes ApiClient (built once per hook)."""
        if self._api_client is None:
            from kubernetes import client, config

            cfg = self.client_configuration
            if cfg is None:
                cfg = client.Configuration()
                in_cluster = self.in_cluster
                if in_cluster is None:
                    in_cluster = not (self.config_file or self.context) and "KUBERNETES_SERVICE_HOST" in os.environ
                try:
                    if in_cluster:
                        config.load_incluster_config(client_configuration=cfg)
                    else:
                        # persist_config=False: never write refreshed credentials back into the user's kubeconfig
                        config.load_kube_config(config_file=self.config_file, context=self.context,
                                                client_configuration=cfg, persist_config=False)
                except (config.ConfigException, OSError) as e:
                    where = "the pod's service account" if in_cluster else \
                        f"kubeconfig {self.config_file or '$KUBECONFIG or ~/.kube/config'}" + \
                        (f" (context {self.context})" if self.context else "")
                    raise KubeRayError(f"no usable Kubernetes API config from {where}: {str(e).rstrip('.')}. Run "
                                       "inside a pod with a service account, or pass config_file=/path/to/kubeconfig "
                                       "(and context=NAME), or set KUBECONFIG") from None
            self._api_client = client.ApiClient(cfg)
        return self._api_client

    def _custom(self):
        from kubernetes import client

        return client.CustomObjectsApi(self.get_conn())

    def _core(self):
        from kubernetes import client

        return client.CoreV1Api(self.get_conn())

    def _call(self, what: str, fn, *args, **kwargs):
        """fn(*args, **kwargs) with a deadline; an unreachable API server becomes a KubeRayError naming the fix.

        ApiException (an HTTP answer) passes through: the caller knows whether its 404 is fine."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            # a stalled API server must not hang a task forever: every call has a deadline
            return fn(*args, _request_timeout=self.request_timeout, **kwargs)
        except ApiException:
            raise
        except HTTPError as e:
            host = getattr(self.get_conn().configuration, "host", "?")
            raise KubeRayError(f"{what}: cannot reach the Kubernetes API at {host} ({e}); check the kubeconfig / "
                               "in-cluster config and that the API server is reachable from here") from None

    def _api_error(self, e, what: str) -> KubeRayError:
        try:
            message = json.loads(e.body or "{}").get("message") or e.reason
        except (TypeError, ValueError):
            message = e.reason
        hint = {
            401: "the credentials were refused: refresh the kubeconfig or the service account token",
            403: f"the service account lacks RBAC for this in namespace {self.namespace}: apply "
                 "include/deploy/kuberay/rbac.yaml (and check the Helm values' service account names match its subjects)",
            404: f"the RayCluster CRD or namespace {self.namespace!r} does not exist: install the KubeRay operator "
                 "(helm install kuberay-operator kuberay/kuberay-operator) and create the namespace",
            422: "the API server rejected the manifest: fix the field it names (render_raycluster validates most)",
        }.get(e.status, "see the message; `kubectl -n %s get events` may say more" % self.namespace)
        return KubeRayError(f"{what}: HTTP {e.status} {message}; {hint}")

    # -- RayCluster lifecycle ----------------------------------------------------------------------
    def get_cluster(self, name: str) -> dict | None:
        """The RayCluster as a dict, or None when it does not exist."""
        from kubernetes.client.exceptions import ApiException

        try:
            return self._call(f"get RayCluster {self.namespace}/{name}", self._custom().get_namespaced_custom_object,
                              GROUP, VERSION, self.namespace, PLURAL, name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise self._api_error(e, f"get RayCluster {self.namespace}/{name}") from None

    def create_cluster(self, manifest: dict, poll: float = 2.0) -> dict:
        """Create the RayCluster; returns the object the API server stored.

        A cluster of the same name that already exists (a retried setup task) is reused, not an error;
        one still being deleted is waited out first (up to 300 s, polling every `poll` s), then created anew.
        """
        from kubernetes.client.exceptions import ApiException

        meta = manifest.get("metadata") or {}
        name, namespace = meta.get("name"), meta.get("namespace") or self.namespace
        if namespace != self.namespace:
            raise KubeRayError(f"RayCluster {name!r} is for namespace {namespace!r} but this hook works in "
                               f"{self.namespace!r}: render it with the hook's namespace, or build the hook with "
                               f"namespace={namespace!r}")
        what = f"create RayCluster {namespace}/{name}"
        for attempt in range(2):
            try:
                obj = self._call(what, self._custom().create_namespaced_custom_object,
                                 GROUP, VERSION, namespace, PLURAL, manifest)
                self.log.info("created RayCluster %s/%s (uid %s)", namespace, name, (obj.get("metadata") or {}).get("uid"))
                return obj
            except ApiException as e:
                if e.status != 409:
                    raise self._api_error(e, what) from None
            existing = self.get_cluster(name)
            if existing is None:
                continue  # gone between the 409 and the read: create again
            if (existing.get("metadata") or {}).get("deletionTimestamp"):
                if attempt:
                    break
                self.log.info("RayCluster %s/%s exists but is being deleted: waiting for it to go", namespace, name)
                self._wait_gone(name, timeout=300.0, poll=poll)
                continue
            self.log.warning("RayCluster %s/%s already exists (a retried setup?): reusing it", namespace, name)
            return existing
        raise KubeRayError(f"{what}: the name stays taken; delete it (kubectl -n {namespace} delete raycluster {name}) "
                           "and retry")

    def wait_ready(self, name: str, timeout: float = 900.0, poll: float = 5.0) -> dict:
        """Poll until `.status.state == "ready"`; returns the cluster. Logs progress when the state changes and
        every 30 s. Raises KubeRayError if it fails or disappears, KubeRayTimeout (what to check) after `timeout`."""
        start = time.monotonic()
        deadline, last_state, last_log = start + timeout, None, 0.0
        while True:
            obj = self.get_cluster(name)
            if obj is None:
                raise KubeRayError(f"RayCluster {self.namespace}/{name} does not exist (deleted while waiting?); "
                                   f"check `kubectl -n {self.namespace} get events` and create it again")
            status = obj.get("status") or {}
            state = status.get("state") or ""
            now = time.monotonic()
            if state == "ready":
                self.log.info("RayCluster %s/%s ready after %.0fs (%s/%s workers ready)", self.namespace, name,
                              now - start, status.get("readyWorkerReplicas", 0), status.get("desiredWorkerReplicas", 0))
                return obj
            if state.lower() == "failed":
                raise KubeRayError(f"RayCluster {self.namespace}/{name} failed: {status.get('reason') or 'no reason given'}"
                                   f"; {self._diagnosis(name, obj)}")
            if state != last_state or now - last_log >= 30:
                self.log.info("RayCluster %s/%s: state=%s, workers ready %s/%s, %.0fs of %.0fs", self.namespace, name,
                              state or "(none yet)", status.get("readyWorkerReplicas", 0),
                              status.get("desiredWorkerReplicas", "?"), now - start, timeout)
                last_state, last_log = state, now
            if now >= deadline:
                raise KubeRayTimeout(f"RayCluster {self.namespace}/{name} not ready after {timeout:.0f}s "
                                     f"(state={state or 'none'}); {self._diagnosis(name, obj)}")
            time.sleep(max(0.0, min(poll, deadline - now)))

    def _diagnosis(self, name: str, obj: dict) -> str:
        """What to check, with the pods' own complaints when they can be read (best effort)."""
        ns = self.namespace
        lines = []
        for cond in (obj.get("status") or {}).get("conditions") or []:
            if cond.get("status") == "False" and cond.get("message"):
                lines.append(f"condition {cond.get('type')}: {cond['message']}")
        try:
            pods = self._core().list_namespaced_pod(ns, label_selector=f"ray.io/cluster={name}").items
            for pod in pods:
                reasons = [f"{c.reason}: {c.message}" for c in (pod.status.conditions or [])
                           if c.status == "False" and c.message]
                for cs in pod.status.container_statuses or []:
                    waiting = cs.state.waiting if cs.state else None
                    if waiting and waiting.reason:
                        reasons.append(f"{cs.name} {waiting.reason}" + (f": {waiting.message}" if waiting.message else ""))
                lines.append(f"pod {pod.metadata.name} {pod.status.phase}" + (f" ({'; '.join(reasons)})" if reasons else ""))
            if not pods:
                lines.append("no pods yet: is the KubeRay operator running and watching this namespace?")
        except Exception as e:  # diagnostics must never hide the real error
            lines.append(f"(pods not readable: {e.__class__.__name__})")
        seen = "\n  ".join(lines)
        return (("\n  " + seen + "\n") if seen else "") + (
            f"check: kubectl -n {ns} describe raycluster {name}; kubectl -n {ns} get pods -l ray.io/cluster={name}; "
            f"kubectl -n {ns} get events --sort-by=.lastTimestamp; the KubeRay operator's log. Pending pods: no node "
            "has the cpu/memory/nvidia.com/gpu the template asks for (lower it or add nodes); ImagePullBackOff: the "
            "nodes cannot pull the image (push it, set ray.kuberay_image); no state at all: the operator is not "
            "running or is older than the manifest's fields (authOptions needs KubeRay >= 1.5.1)")

    def delete_cluster(self, name: str, wait: bool = True, timeout: float = 300.0, poll: float = 2.0) -> bool:
        """Delete the RayCluster (and, through Foreground propagation, its pods before it); idempotent.

        Returns True if it existed, False if there was nothing to delete. wait=True returns only once the
        resource is gone, so its nodes are free when the teardown task ends.
        """
        from kubernetes.client.exceptions import ApiException

        what = f"delete RayCluster {self.namespace}/{name}"
        try:
            self._call(what, self._custom().delete_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL,
                       name, propagation_policy="Foreground")
        except ApiException as e:
            if e.status == 404:
                self.log.info("RayCluster %s/%s does not exist: nothing to delete", self.namespace, name)
                return False
            raise self._api_error(e, what) from None
        self.log.info("deleting RayCluster %s/%s", self.namespace, name)
        if wait:
            self._wait_gone(name, timeout, poll)
        return True

    def _wait_gone(self, name: str, timeout: float, poll: float) -> None:
        start = time.monotonic()
        while self.get_cluster(name) is not None:
            if time.monotonic() - start >= timeout:
                raise KubeRayTimeout(
                    f"RayCluster {self.namespace}/{name} still exists {timeout:.0f}s after its deletion: a finalizer "
                    f"may hold it (kubectl -n {self.namespace} get raycluster {name} -o jsonpath='{{.metadata.finalizers}}') "
                    f"or its pods do not terminate (kubectl -n {self.namespace} get pods -l ray.io/cluster={name}); "
                    "check that the KubeRay operator is running")
            time.sleep(poll)
        self.log.info("RayCluster %s/%s gone after %.0fs", self.namespace, name, time.monotonic() - start)

    # -- endpoints and auth ------------------------------------------------------------------------
    def head_endpoints(self, name: str, cluster: dict | None = None) -> dict:
        """{"address": "<head svc>.<ns>.svc.<domain>:<gcs port>", "dashboard_url": "http://<head svc>...:<dashboard port>"}.

        The Service name is the one KubeRay reports in status.head.serviceName, else the spec's
        headService.metadata.name, else KubeRay's default `<name>-head-svc`; the ports come from the head's
        rayStartParams (`port`, `dashboard-port`) or Ray's defaults (6379, 8265).
        """
        obj = cluster if cluster is not None else self.get_cluster(name)
        if obj is None:
            raise KubeRayError(f"RayCluster {self.namespace}/{name} does not exist: create it first (create_and_wait)")
        head = (obj.get("spec") or {}).get("headGroupSpec") or {}
        service = (((obj.get("status") or {}).get("head") or {}).get("serviceName")
                   or (((head.get("headService") or {}).get("metadata") or {}).get("name"))
                   or f"{name}-head-svc")
        params = head.get("rayStartParams") or {}
        host = f"{service}.{self.namespace}.svc.{self.cluster_domain}"
        return {"address": f"{host}:{int(params.get('port', DEFAULT_GCS_PORT))}",
                "dashboard_url": f"http://{host}:{int(params.get('dashboard-port', DEFAULT_DASHBOARD_PORT))}"}

    def create_and_wait(self, manifest: dict, timeout: float = 900.0, poll: float = 5.0) -> dict:
        """Create the cluster, wait until ready; returns {"backend", "name", "namespace", "address", "dashboard_url"}.

        A cluster that does not get ready is left in place for the DAG's teardown task to delete (it always
        runs); the error already carries what its pods reported.
        """
        obj = self.create_cluster(manifest, poll=poll)
        name = obj["metadata"]["name"]
        ready = self.wait_ready(name, timeout=timeout, poll=poll)
        return {"backend": "kuberay", "name": name, "namespace": self.namespace, **self.head_endpoints(name, ready)}

    def auth_token(self, name: str) -> str | None:
        """The cluster's Ray auth token (for RAY_AUTH_TOKEN with RAY_AUTH_MODE=token), None if auth is off.

        Kept out of create_and_wait's result on purpose: that dict goes to XCom, a token must not.
        """
        from kubernetes.client.exceptions import ApiException

        obj = self.get_cluster(name)
        if obj is None:
            raise KubeRayError(f"RayCluster {self.namespace}/{name} does not exist: no token to read")
        auth = (obj.get("spec") or {}).get("authOptions") or {}
        if auth.get("mode") != "token":
            return None
        secret_name = auth.get("secretName") or name
        what = f"read Secret {self.namespace}/{secret_name} (Ray token of {name})"
        try:
            secret = self._call(what, self._core().read_namespaced_secret, secret_name, self.namespace)
        except ApiException as e:
            if e.status == 404:
                raise KubeRayError(f"{what}: not found; KubeRay creates it for authOptions.mode=token from v1.5.1 on: "
                                   "upgrade the operator, or create it (key auth_token) and set authOptions.secretName") from None
            raise self._api_error(e, what) from None
        data = (secret.data or {}).get("auth_token")
        if not data:
            raise KubeRayError(f"{what}: no key auth_token; KubeRay stores the token under auth_token")
        return base64.b64decode(data).decode()
