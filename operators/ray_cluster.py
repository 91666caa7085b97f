"""RayClusterOperator: a Ray cluster for one DAG run (setup), and its end (teardown, whatever failed).

    setup = RayClusterOperator(task_id="ray_cluster_setup", action="setup")
    teardown = RayClusterOperator(task_id="ray_cluster_teardown", action="teardown")
    setup >> work >> teardown.as_teardown(setups=setup)

Backends (`ray.backend` in the settings, or the `backend` argument):
  local    `ray start --head` on this machine, on its own ports and temp dir (/tmp/eg-ray-<run hash>), with
           its own auth token; teardown stops exactly the processes whose command line names that temp dir,
           never `ray stop` (which would end every Ray process on the machine, other runs' included).
  address  an existing cluster (`ray.address`, `ray.dashboard_url`); teardown leaves it running.
  kuberay  a RayCluster custom resource rendered from `ray.kuberay_manifest` (hooks/kuberay_manifest.py),
           created at setup and deleted at teardown by KubeRayHook (hooks/kuberay.py; `kuberay_conn_id`).
Each backend is a small class with `setup(settings) -> dict` and `teardown(settings) -> dict`, chosen from
CLUSTER_BACKENDS by name; a new backend is one more class and one more entry there.
Setup returns the cluster as XCom: {"backend", "address", "dashboard_url", "env", ...}; drivers and the
Ray job operator connect with it. The temp dir / resource name is derived from the run, so a teardown
finds the cluster even when the setup's XCom never got written (a setup killed half way).
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from airflow.sdk import BaseOperator

from hooks.kuberay import KubeRayHook


def _run_hash(run_key: str) -> str:
    return hashlib.sha1(run_key.encode()).hexdigest()[:8]


def kuberay_name(run_key: str) -> str:
    # KubeRay refuses RayCluster names over 53 characters (MaxRayClusterNameLength): 10 + 34 + 1 + 8
    slug = re.sub(r"[^a-z0-9-]+", "-", run_key.lower()).strip("-")[:34].strip("-")
    return f"evergreen-{slug}-{_run_hash(run_key)}"


@dataclass
class ClusterBackend(ABC):
    """How one kind of Ray cluster is set up for a run and torn down after it.

    run_key: the run the cluster belongs to (names, temp dirs and labels derive from it);
    num_cpus: the local head's CPUs (None: Ray's count); kuberay_conn_id: the KubeRay hook's connection.
    """

    run_key: str
    num_cpus: int | None = None
    kuberay_conn_id: str | None = KubeRayHook.default_conn_name
    log: logging.Logger = field(default_factory=lambda: logging.getLogger(__name__), repr=False)

    @abstractmethod
    def setup(self, settings) -> dict:
        """Start or find the cluster; returns its description (tasks.stages.contracts.ClusterInfo's fields)."""

    @abstractmethod
    def teardown(self, settings) -> dict:
        """End what setup started (safe to call when setup never ran or half ran); returns {"stopped": n}."""


class LocalCluster(ClusterBackend):
    """`ray start --head` on this machine, its own ports, temp dir and token; teardown stops just those processes."""

    def setup(self, settings) -> dict:
        from tasks.rl.cluster import setup_local_cluster

        return setup_local_cluster(settings, self.run_key, num_cpus=self.num_cpus)

    def teardown(self, settings) -> dict:
        from tasks.rl.cluster import teardown_local_cluster

        return {"stopped": teardown_local_cluster(self.run_key)}


class AddressCluster(ClusterBackend):
    """An existing cluster (`ray.address`, `ray.dashboard_url`): used as it is, left running."""

    def setup(self, settings) -> dict:
        self.log.info(
            "using the existing cluster at %s (Jobs API %s)", settings.ray.address, settings.ray.dashboard_url
        )
        return {
            "backend": "address",
            "address": settings.ray.address,
            "dashboard_url": settings.ray.dashboard_url,
            "env": {},
        }

    def teardown(self, settings) -> dict:
        self.log.info("existing cluster %s: left running (not ours to stop)", settings.ray.address)
        return {"stopped": 0}


class KubeRayCluster(ClusterBackend):
    """A RayCluster resource per run, rendered from `ray.kuberay_manifest`, created, then deleted at teardown."""

    def _hook(self, settings) -> KubeRayHook:
        return KubeRayHook(namespace=settings.ray.kuberay_namespace, conn_id=self.kuberay_conn_id)

    def setup(self, settings) -> dict:
        from hooks.kuberay_manifest import render_raycluster

        manifest = render_raycluster(
            settings.ray.kuberay_manifest,
            kuberay_name(self.run_key),
            settings.ray.kuberay_namespace,
            image=settings.ray.kuberay_image,
            run_key=self.run_key,
        )
        return self._hook(settings).create_and_wait(manifest, timeout=900)

    def teardown(self, settings) -> dict:
        self._hook(settings).delete_cluster(kuberay_name(self.run_key))
        return {"stopped": 1}


CLUSTER_BACKENDS: dict[str, type[ClusterBackend]] = {
    "local": LocalCluster,
    "address": AddressCluster,
    "kuberay": KubeRayCluster,
}


class RayClusterOperator(BaseOperator):
    """Set up (action="setup") or tear down (action="teardown") the run's Ray cluster.

    :param backend: a CLUSTER_BACKENDS name; None: the settings' `ray.backend` (the run's params may override it)
    :param kuberay_conn_id: the `kuberay` connection of the KubeRay backend (kubeconfig, context, namespace)
    """

    template_fields = ("run_key", "backend")
    ui_color = "#cfe8fc"

    def __init__(
        self,
        *,
        action: str,
        backend: str | None = None,
        run_key: str = "{{ dag.dag_id }}/{{ run_id }}",
        num_cpus: int | None = None,
        kuberay_conn_id: str | None = KubeRayHook.default_conn_name,
        **kwargs: Any,
    ) -> None:
        if action not in ("setup", "teardown"):
            raise ValueError(f"RayClusterOperator(action={action!r}): expected 'setup' or 'teardown'")
        super().__init__(**kwargs)
        self.action, self.backend, self.run_key, self.num_cpus = action, backend, run_key, num_cpus
        self.kuberay_conn_id = kuberay_conn_id

    def cluster_backend(self, name: str) -> ClusterBackend:
        if name not in CLUSTER_BACKENDS:
            raise ValueError(f"unknown Ray backend {name!r}: use {', '.join(CLUSTER_BACKENDS)} (ray.backend)")
        return CLUSTER_BACKENDS[name](
            run_key=self.run_key, num_cpus=self.num_cpus, kuberay_conn_id=self.kuberay_conn_id, log=self.log
        )

    def execute(self, context) -> dict | None:
        from operators.stages import record_task_time, run_dir_of, settings_for

        settings = settings_for(context["params"])  # the run's params: `overrides` may name another backend
        rd = run_dir_of(context, settings)
        name = self.backend or settings.ray.backend
        self.log.info("Ray cluster %s (%s backend) for %s", self.action, name, self.run_key)
        backend = self.cluster_backend(name)
        started = time.time()
        try:
            if self.action == "teardown":
                return backend.teardown(settings)
            from tasks.stages.contracts import ClusterInfo

            out = ClusterInfo.model_validate(backend.setup(settings)).model_dump()
            rd.write(out, "cluster.json")  # the summary's links; stages get it as XCom
            return out
        finally:
            record_task_time(context, rd, started)
            rd.push()  # only this task's own files: it reads none, so it pulls none
