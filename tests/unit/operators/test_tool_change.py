"""triggers/tool_change.py: the live watch on the served tools, and how its event reaches the run."""

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from operators.stages import settings_for
from tasks.stages.signals import tool_change_of
from triggers.tool_change import ToolChangeTrigger

TOOLS = Path(__file__).resolve().parents[3] / "include" / "tools"


async def _events(trigger, edits, per_edit=1.0):
    """Run the trigger; apply each edit (a callable) in turn, collecting what it yields after each."""
    out, queue = [], asyncio.Queue()

    async def consume():
        async for event in trigger.run():
            await queue.put(event.payload)

    task = asyncio.create_task(consume())
    try:
        for edit in edits:
            edit()
            got = []
            try:
                while True:
                    got.append(await asyncio.wait_for(queue.get(), per_edit))
            except TimeoutError:
                pass
            out.append(got)
    finally:
        task.cancel()
    return out


def test_fires_once_per_breaking_toolset_and_again_after_the_tools_came_back(tmp_path):
    served = tmp_path / "registry.json"
    shutil.copy(TOOLS / "registry_v1.json", served)
    trigger = ToolChangeTrigger(source=str(served), baseline="1", env="desk", poll_interval=0.1)
    v2 = lambda: shutil.copy(TOOLS / "registry_v2.json", served)  # noqa: E731
    v1 = lambda: shutil.copy(TOOLS / "registry_v1.json", served)  # noqa: E731
    unreadable = lambda: served.write_text("{not json")  # noqa: E731
    rounds = asyncio.run(_events(trigger, [lambda: None, v2, unreadable, v2, v1, v2]))
    assert rounds[0] == []  # the champion's tools: nothing to say
    assert len(rounds[1]) == 1 and rounds[1][0]["kind"] == "tool_change"  # one event, not one per poll
    assert "calculator -> calculate" in rounds[1][0]["summary"] and rounds[1][0]["source"] == str(served)
    assert rounds[2] == [] and rounds[3] == []  # an outage of the source is survived; the same tools: no repeat
    assert rounds[4] == []  # back to compatible tools clears the state ...
    assert len(rounds[5]) == 1  # ... so the next break fires again
    assert json.loads(json.dumps(trigger.serialize()[1])) == {
        "source": str(served),
        "baseline": "1",
        "env": "desk",
        "poll_interval": 0.1,
    }


def test_a_run_started_by_a_tool_change_trains_for_the_watched_tools_unless_a_param_says_otherwise(monkeypatch):
    from tasks.config import SettingsError

    trigger = {
        "asset_events": [
            {
                "extra": {
                    "from_trigger": True,
                    "payload": {
                        "kind": "tool_change",
                        "source": str(TOOLS / "registry_v2.json"),
                        "summary": "tool change: ...",
                    },
                }
            }
        ]
    }
    with pytest.raises(SettingsError, match="EVERGREEN_TOOL_SOURCE"):  # a source this deployment does not watch
        settings_for({}, trigger)
    monkeypatch.setenv("EVERGREEN_TOOL_SOURCE", str(TOOLS / "registry_v2.json"))
    assert tool_change_of(trigger)["source"].endswith("registry_v2.json")
    assert tool_change_of({"asset_events": [{"extra": {"retrain": True}}]}) is None
    assert settings_for({}, trigger).env.target_toolset == str(TOOLS / "registry_v2.json")
    assert settings_for({"target_toolset": "1"}, trigger).env.target_toolset == "1"
    assert settings_for({}, {}).env.target_toolset == "2"
