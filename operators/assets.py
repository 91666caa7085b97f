"""The assets Evergreen's DAGs produce and consume, with the event watchers that feed them.

`retrain_request` is what `drift_monitor` emits (its `extra` carries the reasons) and what
`continuous_post_training` is scheduled on, beside its nightly cron. Three more ways to ask for a run:
  - REST:   POST /api/v2/assets/events {"asset_id": <id of retrain_request>, "extra": {...}} (README)
  - a file: drop any file at <run_dir>/../events/retrain_request (a FileDeleteTrigger watcher fires once and
            removes it); the path follows EVERGREEN_RUN_DIR, or set EVERGREEN_RETRAIN_FILE
  - a queue: EVERGREEN_RETRAIN_QUEUE_SCHEME=sqs|kafka plus EVERGREEN_RETRAIN_QUEUE_KWARGS (JSON, e.g.
            {"sqs_queue": "https://sqs.../retrain"}) adds a MessageQueueTrigger watcher (common.messaging;
            the scheme's provider, apache-airflow-providers-amazon or -apache-kafka, must be installed)
  - the tools: EVERGREEN_TOOL_SOURCE=<mcp:URL or command | OpenAPI URL | file> adds a ToolChangeTrigger
            watcher (triggers/tool_change.py) on `tool_change`: a breaking change of the served tools against
            the champion's toolset (EVERGREEN_TOOL_BASELINE, default env.champion_toolset) starts a run;
            EVERGREEN_TOOL_POLL_S (default 30) is how often a source without notifications is re-read
Watchers only fire for unpaused consumers (a watcher on a paused DAG misses events).
Evaluated at DAG parse time: cheap (environment variables and paths only).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from airflow.sdk import Asset, AssetWatcher

PROJECT_ROOT = Path(__file__).resolve().parents[1]

RETRAIN_REQUEST = Asset(name="retrain_request", uri="evergreen://signals/retrain_request", group="evergreen")


def retrain_file() -> Path:
    if os.environ.get("EVERGREEN_RETRAIN_FILE"):
        return Path(os.environ["EVERGREEN_RETRAIN_FILE"])
    run_dir = Path(os.environ.get("EVERGREEN_RUN_DIR", "runs/local"))
    run_dir = run_dir if run_dir.is_absolute() else PROJECT_ROOT / run_dir
    return run_dir.parent / "events" / "retrain_request"


def retrain_file_drop() -> Asset:
    from airflow.providers.standard.triggers.file import FileDeleteTrigger

    path = retrain_file()
    return Asset(
        name="retrain_file_drop",
        uri=f"file://{path}",
        group="evergreen",
        watchers=[
            AssetWatcher(name="retrain_file_drop", trigger=FileDeleteTrigger(filepath=str(path), poke_interval=5.0))
        ],
    )


def retrain_queue() -> Asset | None:
    scheme = os.environ.get("EVERGREEN_RETRAIN_QUEUE_SCHEME")
    if not scheme:
        return None
    try:
        kwargs = json.loads(os.environ.get("EVERGREEN_RETRAIN_QUEUE_KWARGS", "{}"))
    except json.JSONDecodeError as e:
        raise ValueError(
            f"EVERGREEN_RETRAIN_QUEUE_KWARGS is not JSON ({e}); e.g. "
            '{"sqs_queue": "https://sqs.eu-west-1.amazonaws.com/123/retrain"}'
        ) from None
    from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger

    return Asset(
        name="retrain_queue",
        uri=f"evergreen://queue/{scheme}",
        group="evergreen",
        watchers=[AssetWatcher(name=f"retrain_queue_{scheme}", trigger=MessageQueueTrigger(scheme=scheme, **kwargs))],
    )


def tool_change() -> Asset | None:
    source = os.environ.get("EVERGREEN_TOOL_SOURCE")
    if not source:
        return None
    from triggers.tool_change import ToolChangeTrigger

    trigger = ToolChangeTrigger(
        source=source,
        baseline=os.environ.get("EVERGREEN_TOOL_BASELINE") or None,
        poll_interval=float(os.environ.get("EVERGREEN_TOOL_POLL_S", "30")),
    )
    return Asset(
        name="tool_change",
        uri="evergreen://signals/tool_change",
        group="evergreen",
        watchers=[AssetWatcher(name="tool_change", trigger=trigger)],
    )
