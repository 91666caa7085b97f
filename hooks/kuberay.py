"""KubeRayHook: create a RayCluster, wait until it is ready, read its endpoints and token, delete it.

    from hooks.kuberay import KubeRayHook
    from hooks.kuberay_manifest import render_raycluster

    manifest = render_raycluster(None, "evergreen-nightly-1a2b3c4d", "evergreen", run_key=run_id)
    hook = KubeRayHook(namespace="evergreen")     # in a pod: its service account; else ~/.kube/config
    cluster = hook.create_and_wait(manifest, timeout=900)
    # {"backend": "kuberay", "name": ..., "namespace": "evergreen",
    #  "address": "evergreen-nightly-1a2b3c4d-head-svc.evergreen.svc.cluster.local:6379",
    #  "dashboard_url": "http://evergreen-nightly-1a2b3c4d-head-svc.evergreen.svc.cluster.local:8265"}
    token = hook.auth_token(cluster["name"])      # Ray 2.60 drivers need RAY_AUTH_MODE=token, RAY_AUTH_TOKEN
    hook.delete_cluster(cluster["name"])          # idempotent (a missing cluster is fine); waits until gone

The hook wraps the kubernetes client's CustomObjectsApi (RayCluster, ray.io/v1) and CoreV1Api (the token
Secret, pod diagnostics) and nothing more. `kubernetes` is imported inside methods: parsing a DAG that
imports this module loads no client.

Connection (conn_type `kuberay`, default conn_id `kuberay_default`; optional, see hooks/base.py): its extra
holds what the arguments leave out, e.g.
    AIRFLOW_CONN_KUBERAY_DEFAULT='{"conn_type": "kuberay", "extra": {"namespace": "evergreen",
                                   "context": "prod", "config_file": "/secrets/kubeconfig"}}'
  namespace, config_file, context, in_cluster, cluster_domain   as the constructor arguments below
An argument given explicitly wins over the extra. API config, first that applies: an explicit
`kubernetes.client.Configuration` (tests), the pod's service account when running in a cluster, a
kubeconfig (`config_file`, `context`; default $KUBECONFIG or ~/.kube/config).

KubeRay behaviour relied on (KubeRay's source, utils.GenerateHeadServiceName, and its v1.6/1.7 CRD
reference): the head Service is `<cluster>-head-svc` unless spec.headGroupSpec.headService.metadata.name
names another; `.status.state` becomes "ready" once every pod is ready; with spec.authOptions.mode=token
(KubeRay >= 1.5.1) the token is in the Secret named after the cluster, key `auth_token`.

Tests: tests/unit/operators/test_kuberay.py (a small HTTP server stands in for the Kubernetes API).
"""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Mapping
from typing import Any

from hooks.base import OptionalConnectionHook
from hooks.kuberay_manifest import GROUP, PLURAL, VERSION

DEFAULT_GCS_PORT, DEFAULT_DASHBOARD_PORT = 6379, 8265


class KubeRayError(RuntimeError):
    """The API server refused, or the cluster did not get where it should; the message says what to check."""


class KubeRayTimeout(KubeRayError, TimeoutError):
    """A RayCluster did not become ready (or go away) in time."""


class KubeRayHook(OptionalConnectionHook):
    """RayCluster lifecycle through the Kubernetes API (see the module docstring for an example).

    namespace: where the clusters live (the RBAC Role's namespace, ray.kuberay_namespace); default "default".
    config_file / context: a kubeconfig and a context in it (outside a cluster).
    in_cluster: force (True) or forbid (False) the pod's service account; None: use it when running in a pod
        and no kubeconfig was named.
    client_configuration: a ready kubernetes.client.Configuration (takes precedence; tests point it at a fake).
    cluster_domain: the cluster's DNS domain in service addresses (KubeRay's CLUSTER_DOMAIN, default cluster.local).
    request_timeout: seconds one API call may take.
    conn_id: a `kuberay` connection whose extra fills in the arguments not given; None: none.
    Unset arguments are read from the connection on first use, not when the hook is made.
    """

    default_conn_name = "kuberay_default"
    conn_type = "kuberay"
    hook_name = "KubeRay"

    def __init__(
        self,
        namespace: str | None = None,
        config_file: str | None = None,
        context: str | None = None,
        in_cluster: bool | None = None,
        client_configuration: Any = None,
        cluster_domain: str | None = None,
        request_timeout: float = 30.0,
        *,
        conn_id: str | None = default_conn_name,
        logger_name: str | None = None,
    ) -> None:
        super().__init__(conn_id, logger_name=logger_name)
        self._given = {
            "namespace": namespace,
            "config_file": config_file,
            "context": context,
            "in_cluster": in_cluster,
            "cluster_domain": cluster_domain,
        }
        self.client_configuration, self.request_timeout = client_configuration, request_timeout
        self._extra: dict | None = None
        self._api_client = None

    def _setting(self, key: str, default: Any = None) -> Any:
        """The argument if given, else the connection's extra[key], else `default`."""
        if self._given[key] is not None:
            return self._given[key]
        if self._extra is None:
            conn = self.optional_connection()
            self._extra = conn.extra_dejson if conn is not None else {}
        return self._extra.get(key, default)

    @property
    def namespace(self) -> str:
        return self._setting("namespace", "default")

    @property
    def config_file(self) -> str | None:
        # $KUBECONFIG as it is now: the kubernetes client reads it once, when it is imported
        return self._setting("config_file") or os.environ.get("KUBECONFIG") or None

    @property
    def context(self) -> str | None:
        return self._setting("context")

    @property
    def in_cluster(self) -> bool | None:
        value = self._setting("in_cluster")
        return value if value is None or isinstance(value, bool) else str(value).lower() in ("1", "true", "yes")

    @property
    def cluster_domain(self) -> str:
        return self._setting("cluster_domain", "cluster.local")

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
                        config.load_kube_config(
                            config_file=self.config_file,
                            context=self.context,
                            client_configuration=cfg,
                            persist_config=False,
                        )
                except (config.ConfigException, OSError) as e:
                    where = (
                        "the pod's service account"
                        if in_cluster
                        else f"kubeconfig {self.config_file or '$KUBECONFIG or ~/.kube/config'}"
                        + (f" (context {self.context})" if self.context else "")
                    )
                    raise KubeRayError(
                        f"no usable Kubernetes API config from {where}: {str(e).rstrip('.')}. Run "
                        "inside a pod with a service account, or pass config_file=/path/to/kubeconfig "
                        "(and context=NAME), or set KUBECONFIG"
                    ) from None
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
            raise KubeRayError(
                f"{what}: cannot reach the Kubernetes API at {host} ({e}); check the kubeconfig / "
                "in-cluster config and that the API server is reachable from here"
            ) from None

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
        }.get(e.status, f"see the message; `kubectl -n {self.namespace} get events` may say more")
        return KubeRayError(f"{what}: HTTP {e.status} {message}; {hint}")

    # -- RayCluster lifecycle ----------------------------------------------------------------------
    def get_cluster(self, name: str) -> dict | None:
        """The RayCluster as a dict, or None when it does not exist."""
        from kubernetes.client.exceptions import ApiException

        try:
            return self._call(
                f"get RayCluster {self.namespace}/{name}",
                self._custom().get_namespaced_custom_object,
                GROUP,
                VERSION,
                self.namespace,
                PLURAL,
                name,
            )
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
            raise KubeRayError(
                f"RayCluster {name!r} is for namespace {namespace!r} but this hook works in "
                f"{self.namespace!r}: render it with the hook's namespace, or build the hook with "
                f"namespace={namespace!r}"
            )
        what = f"create RayCluster {namespace}/{name}"
        for attempt in range(2):
            try:
                obj = self._call(
                    what, self._custom().create_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, manifest
                )
                self.log.info(
                    "created RayCluster %s/%s (uid %s)", namespace, name, (obj.get("metadata") or {}).get("uid")
                )
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
        raise KubeRayError(
            f"{what}: the name stays taken; delete it (kubectl -n {namespace} delete raycluster {name}) and retry"
        )

    def wait_ready(self, name: str, timeout: float = 900.0, poll: float = 5.0) -> dict:
        """Poll until `.status.state == "ready"`; returns the cluster. Logs progress when the state changes and
        every 30 s. Raises KubeRayError if it fails or disappears, KubeRayTimeout (what to check) after `timeout`."""
        start = time.monotonic()
        deadline, last_state, last_log = start + timeout, None, 0.0
        while True:
            obj = self.get_cluster(name)
            if obj is None:
                raise KubeRayError(
                    f"RayCluster {self.namespace}/{name} does not exist (deleted while waiting?); "
                    f"check `kubectl -n {self.namespace} get events` and create it again"
                )
            status = obj.get("status") or {}
            state = status.get("state") or ""
            now = time.monotonic()
            if state == "ready":
                self.log.info(
                    "RayCluster %s/%s ready after %.0fs (%s/%s workers ready)",
                    self.namespace,
                    name,
                    now - start,
                    status.get("readyWorkerReplicas", 0),
                    status.get("desiredWorkerReplicas", 0),
                )
                return obj
            if state.lower() == "failed":
                raise KubeRayError(
                    f"RayCluster {self.namespace}/{name} failed: {status.get('reason') or 'no reason given'}"
                    f"; {self._diagnosis(name, obj)}"
                )
            if state != last_state or now - last_log >= 30:
                self.log.info(
                    "RayCluster %s/%s: state=%s, workers ready %s/%s, %.0fs of %.0fs",
                    self.namespace,
                    name,
                    state or "(none yet)",
                    status.get("readyWorkerReplicas", 0),
                    status.get("desiredWorkerReplicas", "?"),
                    now - start,
                    timeout,
                )
                last_state, last_log = state, now
            if now >= deadline:
                raise KubeRayTimeout(
                    f"RayCluster {self.namespace}/{name} not ready after {timeout:.0f}s "
                    f"(state={state or 'none'}); {self._diagnosis(name, obj)}"
                )
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
                reasons = [
                    f"{c.reason}: {c.message}"
                    for c in (pod.status.conditions or [])
                    if c.status == "False" and c.message
                ]
                for cs in pod.status.container_statuses or []:
                    waiting = cs.state.waiting if cs.state else None
                    if waiting and waiting.reason:
                        reasons.append(
                            f"{cs.name} {waiting.reason}" + (f": {waiting.message}" if waiting.message else "")
                        )
                lines.append(
                    f"pod {pod.metadata.name} {pod.status.phase}" + (f" ({'; '.join(reasons)})" if reasons else "")
                )
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
            "running or is older than the manifest's fields (authOptions needs KubeRay >= 1.5.1)"
        )

    def delete_cluster(self, name: str, wait: bool = True, timeout: float = 300.0, poll: float = 2.0) -> bool:
        """Delete the RayCluster (and, through Foreground propagation, its pods before it); idempotent.

        Returns True if it existed, False if there was nothing to delete. wait=True returns only once the
        resource is gone, so its nodes are free when the teardown task ends.
        """
        from kubernetes.client.exceptions import ApiException

        what = f"delete RayCluster {self.namespace}/{name}"
        try:
            self._call(
                what,
                self._custom().delete_namespaced_custom_object,
                GROUP,
                VERSION,
                self.namespace,
                PLURAL,
                name,
                propagation_policy="Foreground",
            )
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
                    "check that the KubeRay operator is running"
                )
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
        service = (
            ((obj.get("status") or {}).get("head") or {}).get("serviceName")
            or (((head.get("headService") or {}).get("metadata") or {}).get("name"))
            or f"{name}-head-svc"
        )
        params = head.get("rayStartParams") or {}
        host = f"{service}.{self.namespace}.svc.{self.cluster_domain}"
        return {
            "address": f"{host}:{int(params.get('port', DEFAULT_GCS_PORT))}",
            "dashboard_url": f"http://{host}:{int(params.get('dashboard-port', DEFAULT_DASHBOARD_PORT))}",
        }

    def create_and_wait(self, manifest: dict, timeout: float = 900.0, poll: float = 5.0) -> dict:
        """Create the cluster, wait until ready; returns {"backend", "name", "namespace", "address", "dashboard_url"}.

        A cluster that does not get ready is left in place for the DAG's teardown task to delete (it always
        runs); the error already carries what its pods reported.
        """
        obj = self.create_cluster(manifest, poll=poll)
        name = obj["metadata"]["name"]
        ready = self.wait_ready(name, timeout=timeout, poll=poll)
        token_auth = (((ready.get("spec") or {}).get("authOptions") or {}).get("mode")) == "token"
        return {
            "backend": "kuberay",
            "name": name,
            "namespace": self.namespace,
            **self.head_endpoints(name, ready),
            # drivers run in the cluster's pods, where KubeRay puts the token in their environment; a client outside
            # (the Jobs API from a worker, the trigger) reads it from the Secret by this reference (auth_token)
            "env": {"RAY_AUTH_MODE": "token"} if token_auth else {},
            "kuberay": {"name": name, "namespace": self.namespace, "conn_id": self.conn_id},
        }

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
                raise KubeRayError(
                    f"{what}: not found; KubeRay creates it for authOptions.mode=token from v1.5.1 on: "
                    "upgrade the operator, or create it (key auth_token) and set authOptions.secretName"
                ) from None
            raise self._api_error(e, what) from None
        data = (secret.data or {}).get("auth_token")
        if not data:
            raise KubeRayError(f"{what}: no key auth_token; KubeRay stores the token under auth_token")
        return base64.b64decode(data).decode()


def referenced_token(ref: Mapping[str, Any]) -> str | None:
    """The token of the KubeRay cluster a description's `kuberay` reference ({name, namespace, conn_id}) names,
    read from its Secret; None where its auth is off."""
    return KubeRayHook(namespace=ref.get("namespace"), conn_id=ref.get("conn_id")).auth_token(str(ref["name"]))


def driver_environment(cluster: Mapping[str, Any] | None) -> dict[str, str]:
    """What a driver outside a KubeRay cluster (an Airflow task that attaches to it) needs beside the cluster
    description's env: the cluster's token, read from its Secret, for this task's process only (never XCom or a
    file). Drivers inside the cluster's pods have it already (KubeRay sets RAY_AUTH_TOKEN in every Ray container).
    {} for other clusters and for a KubeRay cluster whose auth is off."""
    ref = (cluster or {}).get("kuberay")
    if not ref or ((cluster or {}).get("env") or {}).get("RAY_AUTH_MODE") != "token":
        return {}
    token = referenced_token(ref)
    if not token:
        return {}
    from airflow.sdk.log import mask_secret

    mask_secret(token)
    return {"RAY_AUTH_TOKEN": token}
