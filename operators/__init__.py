"""Airflow operators, hooks and triggers for Evergreen's external systems (Ray, MLflow, KubeRay)."""
