"""Evergreen's Airflow hooks: clients for external systems, each with an optional Airflow connection.

    ray_jobs.RayJobHook          the Ray Jobs API of a cluster (conn_type ray_jobs, conn_id ray_jobs_default)
    kuberay.KubeRayHook          RayCluster lifecycle on Kubernetes (conn_type kuberay, conn_id kuberay_default)
    kuberay_manifest             render and validate RayCluster manifests (pure, no client)
    base.OptionalConnectionHook  the connection rules they share; why the types are not registered in the UI

Laid out like an Airflow provider (hooks/, operators/, triggers/); provider_info.get_provider_info() is
what a package of them would declare.
"""
