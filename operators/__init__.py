"""Evergreen's Airflow operators: Ray cluster setup/teardown, the deferrable Ray job, stages, assets, DAG defaults.

Their hooks (clients with Airflow connections) are in hooks/, their triggers in triggers/: hooks/,
operators/ and triggers/ are laid out like an Airflow provider package.
"""
