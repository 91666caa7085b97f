"""The MLflow model registry: versions, aliases (champion, challenger, previous), promotion, rollback.

    from tasks.promotion.registry import ModelRegistry
    reg = ModelRegistry("evergreen-agent")                       # the tracking URI MLflow is set to
    v = reg.register(run_id, "model", run_key=airflow_run_id, tags={"registry_hash": h})   # once per run_key
    reg.set_challenger(v)
    reg.promote(v, run_key=airflow_run_id, decision=decision.to_dict())   # challenger -> champion, champion -> previous
    reg.rollback(run_key="rollback__2026-12-03")                  # champion -> previous

Idempotence: a version is registered once per `run_key` (an Airflow run id): a retried step finds the
version it made before (tag `evergreen.run_key`). A promotion is journalled on the registered model
(tag `evergreen.move.<hash of run_key>` = from/to/state) before any alias moves; a retry re-applies the
same target state from the journal and a finished move is never applied twice. MLflow has no
multi-alias transaction, so "atomic" here means crash-consistent: after any interruption, rerunning
the step ends in the intended state, and no other state is ever the final one.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

log = logging.getLogger(__name__)
CHAMPION, CHALLENGER, PREVIOUS = "champion", "challenger", "previous"


def _move_key(run_key: str) -> str:
    # tag keys allow few characters; an Airflow run id has ':' and '+'
    return "evergreen.move." + hashlib.sha1(run_key.encode()).hexdigest()[:16]


class ModelRegistry:
    def __init__(self, name: str, client: Any = None) -> None:
        from tasks.tracking import fail_fast

        fail_fast()
        from mlflow import MlflowClient
        from mlflow.exceptions import MlflowException

        self.name = name
        self.client = client or MlflowClient()
        self._error = MlflowException
        try:
            self.client.get_registered_model(name)
        except MlflowException as e:
            if "RESOURCE_DOES_NOT_EXIST" not in str(e.error_code):
                raise
            self.client.create_registered_model(name, description="Evergreen agent (continuous post-training)")

    # ---- versions ----

    def register(self, run_id: str, artifact_path: str, run_key: str, tags: dict[str, Any] | None = None) -> str:
        """The version for `run_key`, created from the run's artifact directory if it does not exist yet."""
        found = self.client.search_model_versions(f"name = '{self.name}' and tag.`evergreen.run_key` = '{run_key}'")
        if found:
            log.info("registry: version %s already registered for run %s", found[0].version, run_key)
            return str(found[0].version)
        source = f"{self.client.get_run(run_id).info.artifact_uri.rstrip('/')}/{artifact_path}"
        tags = {"evergreen.run_key": run_key, **{k: str(v) for k, v in (tags or {}).items()}}
        version = str(self.client.create_model_version(self.name, source=source, run_id=run_id, tags=tags).version)
        log.info("registry: registered %s version %s from %s", self.name, version, source)
        return version

    def tag_version(self, version: str, tags: dict[str, Any]) -> None:
        for k, v in tags.items():
            self.client.set_model_version_tag(self.name, version, k, v if isinstance(v, str) else json.dumps(v))

    def aliases(self) -> dict[str, str]:
        # versions as strings: a REST store answers strings, a SQLite store in-process answers ints
        return {alias: str(v) for alias, v in self.client.get_registered_model(self.name).aliases.items()}

    def version_of(self, alias: str) -> str | None:
        return self.aliases().get(alias)

    def set_challenger(self, version: str) -> None:
        self.client.set_registered_model_alias(self.name, CHALLENGER, version)

    # ---- moves ----

    def _journal(self, run_key: str) -> dict | None:
        tag = self.client.get_registered_model(self.name).tags.get(_move_key(run_key))
        return json.loads(tag) if tag else None

    def _write_journal(self, run_key: str, entry: dict) -> None:
        self.client.set_registered_model_tag(self.name, _move_key(run_key), json.dumps(entry))

    def _apply(self, run_key: str, entry: dict) -> dict:
        if entry["from"] is not None:
            self.client.set_registered_model_alias(self.name, PREVIOUS, entry["from"])
        self.client.set_registered_model_alias(self.name, CHAMPION, entry["to"])
        if entry["kind"] == "promote" and self.version_of(CHALLENGER) == entry["to"]:
            self.client.delete_registered_model_alias(self.name, CHALLENGER)
        entry = {**entry, "state": "done"}
        self._write_journal(run_key, entry)
        return entry

    def moved_for(self, run_key: str) -> bool:
        """Whether this run key's alias move has already finished (a retried step must not redo it)."""
        entry = self._journal(run_key)
        return bool(entry and entry["state"] == "done")

    def promote(self, version: str, run_key: str, decision: dict | None = None) -> dict:
        """Champion := version, previous := the old champion; once per run_key. Returns the journal entry
        with `moved` (False when this run_key had already promoted)."""
        entry = self._journal(run_key)
        if entry and entry["state"] == "done":
            log.info(
                "registry: run %s already moved champion %s -> %s; nothing to do", run_key, entry["from"], entry["to"]
            )
            return {**entry, "moved": False}
        if entry is None:
            entry = {
                "kind": "promote",
                "run_key": run_key,
                "from": self.version_of(CHAMPION),
                "to": str(version),
                "state": "started",
            }
            self._write_journal(run_key, entry)
        if decision is not None:
            self.tag_version(entry["to"], {"evergreen.decision": "promoted", "evergreen.decision_detail": decision})
        done = self._apply(run_key, entry)
        log.info(
            "registry: %s champion %s -> %s (previous %s) for run %s",
            self.name,
            done["from"],
            done["to"],
            done["from"],
            run_key,
        )
        return {**done, "moved": True}

    def record_not_promoted(self, version: str, decision: dict) -> None:
        """A 'not promoted' decision is logged on the version too; aliases stay as they are."""
        self.tag_version(version, {"evergreen.decision": "not_promoted", "evergreen.decision_detail": decision})

    def rollback(self, run_key: str) -> dict:
        """Champion := previous (and previous := the rolled-back champion); once per run_key."""
        entry = self._journal(run_key)
        if entry and entry["state"] == "done":
            return {**entry, "moved": False}
        if entry is None:
            current, previous = self.version_of(CHAMPION), self.version_of(PREVIOUS)
            if previous is None:
                raise ValueError(f"{self.name} has no '{PREVIOUS}' alias: nothing to roll back to")
            entry = {"kind": "rollback", "run_key": run_key, "from": current, "to": previous, "state": "started"}
            self._write_journal(run_key, entry)
        done = self._apply(run_key, entry)
        log.info("registry: rolled %s champion back %s -> %s for run %s", self.name, done["from"], done["to"], run_key)
        return {**done, "moved": True}
