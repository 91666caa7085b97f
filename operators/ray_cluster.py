"""RayClusterOperator: a Ray cluster for one DAG run (setup), and its end (teardown, whatever failed).

    setup = RayClusterOperator(task_id="ray_cluster_setup", action="setup")
    teardown = RayClusterOperator(task_id="ray_cluster_teardown", action="teardown")
    setup >> work >> teardown.as_teardown(setups=setup)

Backends (`ray.backend` in the settings, or the `backend` argument):
  local    `ray start --head` on this machine, on its own ports and temp dir (/tmp/eg-ray-<run hash>), with
           its own auth token; teardown stops exactly the processes whose command line names that temp dir,
           never `ray stop` (which would end every Ray process on the machine, other runs' included).
  address  an existing cluster (`ray.address`, `ray.dashboard_url`); teardown leaves it running.
  kuberay  a RayCluster custom resource rendered from `ray.kuberay_manifest` (operators/kuberay.py), deleted
           at teardown.
Setup returns the cluster as XCom: {"backend", "address", "dashboard_url", "env", ...}; drivers and the
Ray job operator connect with it. The temp dir / resource name is derived from the run, so a teardown
finds the cluster even when the setup's XCom never got written (a setup killed half way).
"""
from __future__ import annotations

import hashlib
import re
import time
from typing import Any

from airflow.sdk import BaseOperator


def _run_hash(run_key: str) -> str:
    return hashlib.sha1(run_key.encode()).hexdigest()[:8]


def kuberay_name(run_key: str) -> str:
    # KubeRay refuses RayCluster names over 53 characters (MaxRayClusterNameLength): 10 + 34 + 1 + 8
    slug = re.sub(r"[^a-z0-9-]+", "-", run_key.lower()).strip("-")[:34].strip("-")
    return f"evergreen-{slug}-{_run_hash(run_key)}"


class RayClusterOperator(BaseOperator):
    """Set up (action="setup") or tear down (action="teardown") the run's Ray cluster."""

    template_fields = ("run_key", "backend")
    ui_color = "#cfe8fc"

    def __init__(self, *, action: str, backend: str | None = None, run_key: str = "{{ dag.dag_id }}/{{ run_id }}",
                 num_cpus: int | None = None, **kwargs: Any) -> None:
        if action not in ("setup", "teardown"):
            raise ValueError(f"RayClusterOperator(action={action!r}): expected 'setup' or 'teardown'")
        super().__init__(**kwargs)
        self.action, self.backend, self.run_key, self.num_cpus = action, backend, run_key, num_cpus

    def execute(self, context) -> dict | None:
        from operators.stages import record_task_time, run_dir_of, settings_for

        settings = settings_for(context["params"])  # the run's params: `overrides` may name another backend
        rd = run_dir_of(context, settings)
        backend = self.backend or settings.ray.backend
        self.log.info("Ray cluster %s (%s backend) for %s", self.action, backend, self.run_key)
        if backend not in ("local", "address", "kuberay"):
            raise ValueError(f"unknown Ray backend {backend!r}: use local, address or kuberay (ray.backend)")
        started = time.time()
        try:
            out = getattr(self, f"_{self.action}_{backend}")(settings)
            if self.action == "setup":
                from tasks.stages.contracts import ClusterInfo

                out = ClusterInfo.model_validate(out).model_dump()
                rd.write(out, "cluster.json")  # the summary's links; stages get it as XCom
            return out
        finally:
            record_task_time(context, rd, started)

    # local ---------------------------------------------------------------------------------------
    def _setup_local(self, settings) -> dict:
        from tasks.rl.cluster import setup_local_cluster

        return setup_local_cluster(settings, self.run_key, num_cpus=self.num_cpus)

    def _teardown_local(self, settings) -> dict:
        from tasks.rl.cluster import teardown_local_cluster

        return {"stopped": teardown_local_cluster(self.run_key)}

    # address -------------------------------------------------------------------------------------
    def _setup_address(self, settings) -> dict:
        self.log.info("using the existing cluster at %s (Jobs API %s)", settings.ray.address, settings.ray.dashboard_url)
        return {"backend": "address", "address": settings.ray.address, "dashboard_url": settings.ray.dashboard_url,
                "env": {}}

    def _teardown_address(self, settings) -> dict:
        self.log.info("existing cluster %s: left running (not ours to stop)", settings.ray.address)
        return {"stopped": 0}

    # kuberay -------------------------------------------------------------------------------------
    def _kube(self, settings):
        from operators.kuberay import KubeRayHook

        return KubeRayHook(namespace=settings.ray.kuberay_namespace)

    def _setup_kuberay(self, settings) -> dict:
        from operators.kuberay import render_raycluster

        manifest = render_raycluster(settings.ray.kuberay_manifest, kuberay_name(self.run_key),
                                     settings.ray.kuberay_namespace, image=settings.ray.kuberay_image,
                                     run_key=self.run_key)
        return self._kube(settings).create_and_wait(manifest, timeout=900)

    def _teardown_kuberay(self, settings) -> dict:
        self._kube(settings).delete_cluster(kuberay_name(self.run_key))
        return {"stopped": 1}
