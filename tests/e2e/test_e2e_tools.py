"""End to end: the tools of a running MCP server change, and continuous_post_training starts for it.

The stack watches the desk MCP server (EVERGREEN_TOOL_SOURCE, tests/e2e/conftest.py) through the
ToolChangeTrigger in the triggerer; the test rewrites the server's toolset file (v1 -> v2), the server
announces notifications/tools/list_changed, the trigger diffs the new tools against the champion's and
fires `tool_change`, and the DAG run it starts decides to train for that reason, on the watched tools as
its first stage read them (pinned in its run dir: tasks/stages/rollouts.py pin_toolsets).
The run is stopped once it has decided (its training is what test_e2e_rest already covers).
"""

from __future__ import annotations

import json
import shutil
import time

import pytest

from tests.e2e.conftest import TOOLS

pytestmark = [pytest.mark.e2e, pytest.mark.integration]
DAG = "continuous_post_training"


def test_a_breaking_change_of_the_served_tools_starts_a_run_that_trains_for_them(
    airflow_stack, finished_run, tool_server
):
    client = airflow_stack.client()
    before = {r["dag_run_id"] for r in client.runs(DAG)}
    shutil.copy(TOOLS / "registry_v2.json", tool_server.file)  # the server re-reads it and notifies

    deadline, run = time.time() + 300, None
    while run is None and time.time() < deadline:
        run = next((r for r in client.runs(DAG) if r["dag_run_id"] not in before), None)
        time.sleep(2)
    assert run is not None, "no continuous_post_training run within 300 s of the tool change"
    assert run["run_type"] == "asset_triggered"

    decision, opened, pinned = None, None, None
    while decision is None and time.time() < deadline + 300:  # the run's directory: run.json names its run id
        # runs_root pulls the runs from the stack's bucket again: what the run's tasks pushed since
        for path in (airflow_stack.runs_root / DAG).glob("*/run.json"):
            info = json.loads(path.read_text())
            if info["run_id"] == run["dag_run_id"]:
                opened = info
                if (path.parent / "should_train.json").exists():
                    decision = json.loads((path.parent / "should_train.json").read_text())
                    pinned = json.loads((path.parent / "toolsets" / "target_toolset.json").read_text())
        time.sleep(2)
    try:
        assert decision is not None, f"the run started by the tool change did not decide (opened: {opened})"
        payloads = [(e.get("extra") or {}).get("payload") or {} for e in opened["trigger"]["asset_events"]]
        assert any(p.get("kind") == "tool_change" for p in payloads), opened["trigger"]
        assert decision["train"] is True
        assert decision["reason"].startswith("tool change: ") and "calculator -> calculate" in decision["reason"]
        assert f"watched at mcp:{tool_server.url}" in decision["reason"]
        # the run's stages read the served tools as the run's first stage read them (pinned in its run dir)
        served = {t["function"]["name"] for t in json.loads((TOOLS / "registry_v2.json").read_text())["tools"]}
        assert pinned["x-evergreen-source"] == f"mcp:{tool_server.url}"
        assert {t["function"]["name"] for t in pinned["tools"]} == served
    finally:
        client.patch(f"/api/v2/dags/{DAG}/dagRuns/{run['dag_run_id']}", {"state": "failed"})
