"""OptionalConnectionHook: the Airflow-connection handling that Evergreen's hooks share.

    class RayJobHook(OptionalConnectionHook):
        default_conn_name, conn_type, hook_name = "ray_jobs_default", "ray_jobs", "Ray Jobs"

    hook = RayJobHook(dashboard_url, conn_id="ray_jobs_default")
    conn = hook.optional_connection()          # in a worker; `await hook.aoptional_connection()` in a triggerer

A connection is where the deployment keeps what a hook needs beyond its arguments (credentials above
all), in Airflow's Connections or a secrets backend, never in XCom or trigger kwargs. It is optional so
that a hook given everything explicitly (the cluster description of the setup task) behaves the same
whether or not one is defined:
  conn_id=None                     no lookup at all
  conn_id == default_conn_name     used when defined; when not, None (the hook runs on its arguments)
  any other conn_id                must exist: an undefined one raises AirflowNotFoundException, because a
                                   connection named on purpose that is missing is a typo or a missing secret

Airflow lists connection types in its UI (and maps conn_type -> hook for `Connection.get_hook`) only for
installed provider *packages*: ProvidersManager reads the `apache_airflow_provider` entry point's
get_provider_info(). Plugins cannot add connection types in Airflow 3. This project is not installed as a
package, so the types are not registered; connections of these types still work everywhere else
(AIRFLOW_CONN_<ID> variables, `airflow connections add --conn-type ray_jobs ...`, secrets backends),
since a conn_type is a plain string. hooks/provider_info.py holds the get_provider_info() that a package
of hooks/, operators/ and triggers/ would name in its entry point.

Tests: tests/unit/operators/test_hooks.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

if TYPE_CHECKING:
    from airflow.sdk import Connection

_NOT_LOOKED_UP = object()


class OptionalConnectionHook(BaseHook):
    """A hook whose Airflow connection is optional (see the module docstring for the rules)."""

    conn_name_attr = "conn_id"
    default_conn_name = ""
    conn_type = ""
    hook_name = ""

    def __init__(self, conn_id: str | None, logger_name: str | None = None) -> None:
        super().__init__(logger_name=logger_name)
        self.conn_id = conn_id
        self._connection = _NOT_LOOKED_UP

    def optional_connection(self) -> Connection | None:
        """The connection, looked up once (synchronously: workers, scripts); None if there is none to use."""
        if self._connection is _NOT_LOOKED_UP:
            try:
                self._connection = self.get_connection(self.conn_id) if self.conn_id else None
            except AirflowNotFoundException:
                self._connection = self._not_found()
        return self._connection

    async def aoptional_connection(self) -> Connection | None:
        """optional_connection() for an event loop (the triggerer), where a blocking lookup must not run."""
        if self._connection is _NOT_LOOKED_UP:
            try:
                self._connection = await self.aget_connection(self.conn_id) if self.conn_id else None
            except AirflowNotFoundException:
                self._connection = self._not_found()
        return self._connection

    def _not_found(self) -> None:
        if self.conn_id != self.default_conn_name:
            env = "AIRFLOW_CONN_" + self.conn_id.upper()
            raise AirflowNotFoundException(
                f"connection {self.conn_id!r} ({self.hook_name}, conn_type {self.conn_type}) is not defined: add it "
                f"(Admin > Connections, {env}, or the secrets backend), or leave conn_id at "
                f"{self.default_conn_name!r} to run on the explicit arguments alone"
            ) from None
        self.log.debug("no %s connection %r: using the explicit arguments", self.hook_name, self.conn_id)
        return None
