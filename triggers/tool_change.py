"""A live watch on the tools in production: fires when they change in a way that breaks the champion.

    ToolChangeTrigger(source="mcp:http://tools.internal:8765/mcp")   # an MCP server (list_changed, else polled)
    ToolChangeTrigger(source="https://tools.internal/openapi.json")  # an OpenAPI document, polled
    ToolChangeTrigger(source="/srv/tools/registry.json")             # a file, polled

An event trigger (an AssetWatcher's: operators/assets.py wires it to `tool_change`, on which
continuous_post_training is scheduled): it reads the source with the one toolset loader, diffs it against
the champion's toolset (`baseline`, default the settings' env.champion_toolset) with the same differ as
`python -m tasks tooldiff`, and yields {"kind": "tool_change", "summary": ..., "new_hash": ...} when the
change is breaking. One event per new toolset: the hash it fired for is kept in the asset's state store
(Airflow's AIP-103 store, so a triggerer restart does not fire again for the same tools), and cleared
when the tools go back to a non-breaking state. An MCP server that announces `notifications/tools/
list_changed` is re-read when it says so (and every `poll_interval` anyway); other sources every
`poll_interval` seconds. A source that cannot be read is logged and retried, never fatal: the watch must
outlive an outage of the thing it watches.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

log = logging.getLogger(__name__)
STATE_KEY = "fired_hash"


class ToolChangeTrigger(BaseEventTrigger):
    def __init__(self, source: str, baseline: str | None = None, env: str | None = None, poll_interval: float = 30.0):
        super().__init__()
        self.source, self.baseline, self.env, self.poll_interval = source, baseline, env, poll_interval
        self._fired: str | None = None  # without a state store (a test running the trigger directly)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "triggers.tool_change.ToolChangeTrigger",
            {"source": self.source, "baseline": self.baseline, "env": self.env, "poll_interval": self.poll_interval},
        )

    def _diff(self):
        from tasks.config import load_settings
        from tasks.envs.toolset import load_toolset
        from tasks.signals.tooldiff import diff_toolsets

        env, baseline = self.env, self.baseline
        if env is None or baseline is None:
            settings = load_settings()
            env, baseline = env or settings.env.name, baseline or settings.env.champion_toolset
        return diff_toolsets(load_toolset(baseline, env), load_toolset(self.source, env), env)

    async def _state(self, value: str | None = None, write: bool = False) -> str | None:
        store = getattr(self, "asset_state_store", None)
        if write:
            self._fired = value
            if store is not None:
                await (store.aset(STATE_KEY, value) if value is not None else store.adelete(STATE_KEY))
            return value
        if store is not None:
            return await store.aget(STATE_KEY)
        return self._fired

    async def run(self) -> AsyncIterator[TriggerEvent]:
        changes = _Notifications(self.source)
        try:
            while True:
                try:
                    diff = await asyncio.to_thread(self._diff)
                except Exception as e:
                    log.warning(
                        "tool source %s: cannot read or diff it (%s: %s); retrying in %.0fs",
                        self.source,
                        type(e).__name__,
                        e,
                        self.poll_interval,
                    )
                else:
                    fired = await self._state()
                    if diff.breaking and diff.new_hash != fired:
                        log.info("tool change at %s: %s", self.source, diff.summary)
                        await self._state(diff.new_hash, write=True)
                        yield TriggerEvent(
                            {
                                "kind": "tool_change",
                                "summary": f"tool change: {diff.summary}",
                                "source": self.source,
                                "old_hash": diff.old_hash,
                                "new_hash": diff.new_hash,
                                "changes": len(diff.changes),
                            }
                        )
                    elif not diff.breaking and fired is not None:
                        await self._state(None, write=True)  # back to compatible tools: the next break fires
                await changes.wait(self.poll_interval)
        finally:
            await changes.close()


class _Notifications:
    """`notifications/tools/list_changed` of an MCP source, where it offers them; a plain wait otherwise."""

    def __init__(self, source: str):
        self.source, self.backend, self.seen = source, None, 0
        self.unsupported = not source.startswith("mcp:")

    async def wait(self, timeout: float) -> None:
        if not self.unsupported and self.backend is None:
            try:
                await self._subscribe()
            except Exception as e:
                log.info("tool source %s: no tools/list_changed notifications (%s); polling", self.source, e)
                await self.close()
                self.unsupported = True
        if self.backend is None:
            await asyncio.sleep(timeout)
            return
        if await self.backend.wait_tools_changed(timeout=timeout, since=self.seen):
            self.seen = self.backend.tools_generation

    async def _subscribe(self) -> None:
        import shlex

        from tasks.envs.mcp_backend import MCPBackend

        target = self.source[len("mcp:") :].strip()
        server = target if target.startswith(("http://", "https://")) else shlex.split(target)
        self.backend = await asyncio.to_thread(MCPBackend, server)
        self.seen = await self.backend.watch_tools()

    async def close(self) -> None:
        if self.backend is not None:
            backend, self.backend = self.backend, None
            await asyncio.to_thread(backend.close)
