"""The provider metadata Airflow would read if hooks/, operators/ and triggers/ were installed as a package.

Airflow 3 registers connection types (the UI's connection form, conn_type -> hook for
`Connection.get_hook`) only from installed distributions that declare an `apache_airflow_provider` entry
point; this project runs from its source folders (PYTHONPATH), so nothing calls this today. A package
would declare, in its pyproject.toml:

    [project.entry-points.apache_airflow_provider]
    provider_info = "hooks.provider_info:get_provider_info"

and keep "package-name" equal to its distribution name. tests/unit/operators/test_hooks.py checks the
dict against Airflow's own provider_info.schema.json and the hook classes it names.
"""

from __future__ import annotations


def get_provider_info() -> dict:
    # connection forms are declared here, not by hook methods (get_ui_field_behaviour is deprecated since 3.2)
    string = {"type": ["string", "null"]}
    return {
        "package-name": "evergreen-airflow-ray",
        "name": "Evergreen Ray",
        "description": "Ray Jobs and KubeRay hooks, a deferrable Ray job operator and its trigger, Ray cluster "
        "setup/teardown (local, existing address, KubeRay).",
        "integrations": [{"integration-name": "Ray", "external-doc-url": "https://docs.ray.io/", "tags": ["compute"]}],
        "connection-types": [
            {
                "connection-type": "ray_jobs",
                "hook-class-name": "hooks.ray_jobs.RayJobHook",
                "hook-name": "Ray Jobs",
                "conn-fields": {"auth_token": {"label": "Ray auth token (if not the password)", "schema": string}},
                "ui-field-behaviour": {
                    "hidden-fields": ["login"],
                    "relabeling": {
                        "host": "Dashboard URL",
                        "password": "Ray auth token",
                        "schema": "Scheme (http/https, for a bare host)",
                    },
                    "placeholders": {"host": "http://ray-head:8265", "port": "8265"},
                },
            },
            {
                "connection-type": "kuberay",
                "hook-class-name": "hooks.kuberay.KubeRayHook",
                "hook-name": "KubeRay",
                "conn-fields": {
                    "namespace": {"label": "Namespace", "schema": string},
                    "context": {"label": "Kubeconfig context", "schema": string},
                    "config_file": {"label": "Kubeconfig file", "schema": string},
                    "in_cluster": {"label": "Use the pod's service account", "schema": {"type": ["boolean", "null"]}},
                    "cluster_domain": {"label": "Cluster DNS domain", "schema": string},
                },
                "ui-field-behaviour": {
                    "hidden-fields": ["host", "schema", "login", "password", "port"],
                    "relabeling": {},
                    "placeholders": {},
                },
            },
        ],
        "operators": [{"integration-name": "Ray", "python-modules": ["operators.ray_job", "operators.ray_cluster"]}],
        "hooks": [{"integration-name": "Ray", "python-modules": ["hooks.ray_jobs", "hooks.kuberay"]}],
        "triggers": [{"integration-name": "Ray", "python-modules": ["triggers.ray_job"]}],
    }
