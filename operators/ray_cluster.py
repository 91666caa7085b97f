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


def local_temp_dir(run_key: str) -> str:
    # short: Ray's unix sockets live under it and must stay under 107 characters
    return f"/tmp/eg-ray-{_run_hash(run_key)}"


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
        from tasks.config import load_settings

        settings = load_settings()
        backend = self.backend or settings.ray.backend
        self.log.info("Ray cluster %s (%s backend) for %s", self.action, backend, self.run_key)
        if backend not in ("local", "address", "kuberay"):
            raise ValueError(f"unknown Ray backend {backend!r}: use local, address or kuberay (ray.backend)")
        started = time.time()
        try:
            return getattr(self, f"_{self.action}_{backend}")(settings)
        finally:
            from operators.stages import record_task_time
            from tasks.loop import RunDir

            record_task_time(context, RunDir.for_run(settings, context["dag"].dag_id, context["run_id"]), started)

    # local ---------------------------------------------------------------------------------------
    def _setup_local(self, settings) -> dict:
        from tasks.rl.cluster import LocalHead, start_local_head

        temp_dir = local_temp_dir(self.run_key)
        old = LocalHead("", temp_dir, None, {})
        if old.pids():  # a retried setup: the first try's head may be half up; start clean
            self.log.warning("a head of this run is already running (%d processes): stopping it first", len(old.pids()))
            old.stop()
        head = start_local_head(temp_dir, port=settings.ray.head_port, num_cpus=self.num_cpus or settings.ray.num_cpus,
                                dashboard_port=settings.ray.dashboard_port)
        self.log.info("Ray head %s up; dashboard %s; temp dir %s", head.address, head.dashboard_url, temp_dir)
        return {"backend": "local", "address": head.address, "dashboard_url": head.dashboard_url,
                "env": head.env, "temp_dir": temp_dir}

    def _teardown_local(self, settings) -> dict:
        from tasks.rl.cluster import LocalHead

        head = LocalHead("", local_temp_dir(self.run_key), None, {})
        stopped = head.stop()
        left = head.pids()
        if left:
            raise RuntimeError(f"Ray processes still alive after teardown: {left}; stop them by hand "
                               f"(kill {' '.join(map(str, left))}) — never `ray stop`, it ends other runs' clusters")
        self.log.info("Ray head of %s stopped: %d processes, none left", self.run_key, stopped)
        return {"stopped": stopped}

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
