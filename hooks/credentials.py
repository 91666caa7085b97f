"""The S3 and MLflow credentials of a deployment, from Airflow Connections (or a secrets backend), handed
to a stage as the environment variables its client reads (boto3: AWS_*; MLflow: MLFLOW_TRACKING_*).

    env = stage_credentials()      # {} where neither connection is defined: the ambient environment rules
    os.environ.update(env)         # StageOperator does this in the task's own process, before the stage

Connections (both optional; the default names are looked up, nothing else):
  evergreen_s3      conn_type aws:  login = access key id, password = secret key; extra: endpoint_url,
                    region_name, aws_session_token
  evergreen_mlflow  conn_type http: login / password (basic auth), or extra {"token": ...}; the tracking URI
                    itself is a setting (tracking.uri), not a secret
Secrets never go into XCom, trigger kwargs, settings files or logs: they live in the task process's
environment for as long as it runs.
"""

from __future__ import annotations

import json

from hooks.base import OptionalConnectionHook


def _extra(conn) -> dict:
    try:
        return json.loads(conn.extra) if conn.extra else {}
    except json.JSONDecodeError:
        raise ValueError(f"connection {conn.conn_id!r}: extra is not JSON") from None


class _CredentialsHook(OptionalConnectionHook):
    """A connection whose fields become environment variables (`variables`); none defined: {}."""

    def environment(self) -> dict[str, str]:
        conn = self.optional_connection()
        if conn is None:
            return {}
        return {k: str(v) for k, v in self.variables(conn, _extra(conn)).items() if v}

    def variables(self, conn, extra: dict) -> dict:
        raise NotImplementedError


class S3CredentialsHook(_CredentialsHook):
    default_conn_name, conn_type, hook_name = "evergreen_s3", "aws", "Evergreen S3"

    def variables(self, conn, extra: dict) -> dict:
        return {
            "AWS_ACCESS_KEY_ID": conn.login,
            "AWS_SECRET_ACCESS_KEY": conn.password,
            "AWS_SESSION_TOKEN": extra.get("aws_session_token"),
            "AWS_DEFAULT_REGION": extra.get("region_name"),
            "EVERGREEN_S3_ENDPOINT_URL": extra.get("endpoint_url"),
            "AWS_ENDPOINT_URL": extra.get("endpoint_url"),
        }


class MlflowCredentialsHook(_CredentialsHook):
    default_conn_name, conn_type, hook_name = "evergreen_mlflow", "http", "Evergreen MLflow"

    def variables(self, conn, extra: dict) -> dict:
        return {
            "MLFLOW_TRACKING_USERNAME": conn.login,
            "MLFLOW_TRACKING_PASSWORD": conn.password,
            "MLFLOW_TRACKING_TOKEN": extra.get("token"),
        }


def stage_credentials() -> dict[str, str]:
    """The environment the deployment's connections give a stage ({} where none is defined)."""
    return {
        **S3CredentialsHook("evergreen_s3").environment(),
        **MlflowCredentialsHook("evergreen_mlflow").environment(),
    }
