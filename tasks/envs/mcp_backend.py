"""A ToolBackend over MCP (the official `mcp` SDK, 2.x): a server run as a command (stdio) or at a URL
(streamable HTTP).

    backend = MCPBackend([sys.executable, "include/tools/desk_mcp_server.py", "--toolset", "registry_v2.json"])
    backend = MCPBackend("http://127.0.0.1:8765/mcp", timeout=10.0)
    backend.list_tools()                              # OpenAI function tools (x-evergreen-handler from _meta)
    with backend.open_session(task) as session:
        session.call("calculate", {"x": "2", "y": "3", "operator": "+"})      # ToolResult("5")
    backend.close()                                   # every connection ends; stdio servers are reaped

The SDK's connections are anyio task groups, which only the task that entered them may leave: each
connection is owned by one task on the backend's LoopThread, and calls from any thread or loop hop there.
Connecting negotiates the era (`Client`, mode="auto"): a 2026-07-28 server is stateless per request;
an older one speaks the initialize handshake, and its connection may carry state.

Sessions: stateless=True shares one connection among all episodes; False gives each episode its own
(opened at its first call: for stdio, a server process per episode); None (default) decides at the first
connection: shared for a 2026-07-28 server, per episode for a handshake-era one (nothing tells a client
that it keeps no per-connection state; pass True when known, e.g. an HTTP server with stateless_http).

Faults (never raised from call): isError -> "refused" ("error: " + the server's text); a JSON-RPC error
-> "refused" ("tool_failed" if internal); no answer within `timeout` -> "timeout"; cannot connect ->
"unreachable" ("timeout" if connecting hangs); the connection dropped under a call -> "session_lost"
("unreachable" if the transport says connections are refused); non-text or malformed content ->
"bad_response". A dead shared connection is reopened at the next call; an episode's stays lost.

Tool changes: `await watch_tools()` subscribes (subscriptions/listen at 2026-07-28, the connection's own
notifications before) and returns the change counter; `await wait_tools_changed(timeout, since)` is True
once `notifications/tools/list_changed` arrived after `since`; both from any event loop (an Airflow
trigger's). A server without tools.listChanged raises ToolsChangedUnsupported: poll list_tools instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Coroutine
from typing import Any, TextIO, TypeVar, cast

import httpx2
import mcp_types as types
from mcp.shared.exceptions import MCPError

from tasks.envs.backends import ClosedOnExit, LoopThread, ToolResult
from tasks.envs.mcp_connection import Connection, describe, leaf

HANDLER_META = "evergreen/handler"  # where desk_mcp_server carries x-evergreen-handler
VERSION_META = "evergreen/toolset_version"  # and the toolset's version, on the tools/list result
RETRY_CONNECT_S = 1.0  # after a failed connect, calls fail fast this long instead of each reconnecting
_T = TypeVar("_T")


class ToolsChangedUnsupported(RuntimeError):
    """The server does not announce tool changes (no tools.listChanged): poll list_tools instead."""


def _error(fault: str, text: str) -> ToolResult:
    return ToolResult(f"error: {text}", is_error=True, fault=fault)


class MCPBackend(ClosedOnExit):
    def __init__(
        self,
        server: str | list[str],
        *,
        timeout: float = 10.0,
        connect_timeout: float = 15.0,
        stateless: bool | None = None,
        mode: str = "auto",
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        errlog: TextIO | None = None,
    ) -> None:
        """`server`: a streamable-HTTP URL, or a command (argv list) to run as a stdio server; `mode`: the
        SDK's era negotiation ("legacy" forces the initialize handshake); `env` is added to the SDK's
        minimal child environment (HOME, PATH, ...); `errlog`: the server's stderr."""
        if isinstance(server, str) and not server.startswith(("http://", "https://")):
            raise ValueError(f"server={server!r}: pass an http(s) URL or a command as a list of arguments")
        self.url = server if isinstance(server, str) else None
        self.command = None if self.url else [str(a) for a in server]
        self.timeout, self.connect_timeout, self.stateless, self.mode = timeout, connect_timeout, stateless, mode
        self.env, self.cwd, self.errlog = env, cwd, errlog if errlog is not None else sys.stderr
        self._lt = LoopThread("mcp-backend")
        self._ctl: Connection | None = None  # list_tools, the watcher and (shared) the episodes' calls
        self._ctl_lock = asyncio.Lock()
        self._ctl_failed: tuple[float, BaseException] | None = None
        self._episodes: set[Connection] = set()
        self._generation, self._changed = 0, asyncio.Event()
        self._watcher: asyncio.Task | None = None
        self._watch_ready: asyncio.Future | None = None
        self._closed = False

    def list_tools(self) -> list[dict]:
        """The server's tools as OpenAI function tools; ConnectionError if the server cannot be reached."""
        return self.toolset()["tools"]

    def toolset(self) -> dict:
        """`{"version", "tools"}`, the version as the server's tools/list result names it (else None)."""
        return self._run(self._toolset())

    def open_session(self, task: dict | None = None) -> MCPSession:
        return MCPSession(self, shared=self._run(self._shared()))

    async def alist_tools(self) -> list[dict]:
        return (await self._hop(self._toolset()))["tools"]

    async def aopen_session(self, task: dict | None = None) -> MCPSession:
        return MCPSession(self, shared=await self._hop(self._shared()))

    @property
    def tools_generation(self) -> int:
        """Tool changes announced since watching began (a re-subscription after a loss counts one)."""
        return self._generation

    async def watch_tools(self) -> int:
        """Subscribe to tool changes (idempotent) and return the current generation."""
        return await self._hop(self._watch_started())

    async def wait_tools_changed(self, timeout: float | None = None, since: int | None = None) -> bool:
        """True once the generation exceeds `since` (default: the generation now), False at `timeout`."""
        return await self._hop(self._wait_changed(timeout, since))

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._lt.run(self._aclose())
            self._lt.stop()
            if not self._lt.loop.is_running():
                self._lt.loop.close()

    # ---------------------------------------------------------------- on the backend's loop

    def _run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        if self._closed:  # the loop is gone: waiting on it would hang
            coro.close()
            raise RuntimeError("MCPBackend is closed")
        return self._lt.run(coro)

    async def _hop(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Await `coro` on the backend's loop, from whichever loop calls."""
        if asyncio.get_running_loop() is self._lt.loop:
            return await coro
        if self._closed:
            coro.close()
            raise RuntimeError("MCPBackend is closed")
        return await asyncio.wrap_future(self._lt.submit(coro))

    async def _control(self) -> Connection:
        async with self._ctl_lock:
            if self._ctl is not None and self._ctl.alive:
                return self._ctl
            if self._closed:
                raise ConnectionError("MCPBackend is closed")
            if self._ctl_failed and time.monotonic() - self._ctl_failed[0] < RETRY_CONNECT_S:
                e = self._ctl_failed[1]  # a fresh exception: re-raising one object grows its traceback
                raise (TimeoutError if isinstance(e, TimeoutError) else ConnectionError)(describe(e))
            if self._ctl is not None:
                await self._ctl.close()
            self._ctl, conn = None, Connection(self, on_notification=self._bump)
            try:
                await conn.open(self.connect_timeout)
            except Exception as e:
                self._ctl_failed = (time.monotonic(), e)
                raise
            self._ctl, self._ctl_failed = conn, None
            return conn

    async def _toolset(self) -> dict:
        tools: list[types.Tool] = []
        version: Any = None
        cursor: str | None = None
        try:
            conn = await self._control()
            assert conn.client is not None  # set once the connection is open
            while True:
                page = await conn.client.list_tools(cursor=cursor)
                version, tools = (page.meta or {}).get(VERSION_META, version), tools + page.tools
                if not (cursor := page.next_cursor):
                    break
        except Exception as e:
            raise ConnectionError(f"MCP server {self.url or self.command}: {describe(e)}") from e
        return {"version": version, "tools": [_openai_tool(t) for t in tools]}

    async def _shared(self) -> bool:
        if self.stateless is None:
            try:
                self.stateless = (await self._control()).modern
            except Exception:
                return True  # unreachable now: its calls say so and reconnect; decided once connected
        return self.stateless

    async def _call(self, conn: Connection, name: str, arguments: dict) -> ToolResult:
        timed_out = _error("timeout", f"the tool server did not answer within {self.timeout:g} s")
        assert conn.client is not None  # set once the connection is open
        try:  # the SDK's own timeout answers first; wait_for only bounds what it does not cover
            result = await asyncio.wait_for(
                conn.client.call_tool(name, arguments, read_timeout_seconds=self.timeout), self.timeout + 2
            )
        except TimeoutError:
            return timed_out
        except MCPError as e:
            if e.error.code == types.REQUEST_TIMEOUT:
                return timed_out
            if e.error.code == types.CONNECTION_CLOSED:
                return await self._lost(conn)
            return _error("tool_failed" if e.error.code == types.INTERNAL_ERROR else "refused", e.error.message)
        except Exception as e:  # a result the SDK could not read (validation, an unexpected result type)
            return await self._lost(conn) if not conn.alive else _error("bad_response", describe(e))
        texts = [c.text for c in result.content if isinstance(c, types.TextContent)]
        if len(texts) != len(result.content):
            kinds = sorted({c.type for c in result.content if not isinstance(c, types.TextContent)})
            return _error("bad_response", f"the tool answered with non-text content ({', '.join(kinds)})")
        text = "\n".join(texts)
        return _error("refused", text) if result.is_error else ToolResult(text)

    async def _lost(self, conn: Connection) -> ToolResult:
        """The connection dropped under a call: reap it, and tell a server that refuses connections."""
        await conn.close(wait=3.0)
        if isinstance(cause := leaf(conn.error), (httpx2.ConnectError, ConnectionRefusedError)):
            return _error("unreachable", f"tool server unreachable ({describe(cause)})")
        return _error("session_lost", "the connection to the tool server was lost")

    def _bump(self) -> None:
        self._generation += 1
        self._changed.set()
        self._changed = asyncio.Event()

    async def _watch_started(self) -> int:
        if self._watcher is None or self._watcher.done():
            self._watch_ready = asyncio.get_running_loop().create_future()
            self._watcher = asyncio.create_task(self._watch(self._watch_ready))
        assert self._watch_ready is not None  # created with the watcher
        await asyncio.wait_for(asyncio.shield(self._watch_ready), self.connect_timeout + self.timeout)
        return self._generation

    async def _watch(self, ready: asyncio.Future) -> None:
        """Keep one subscription open; after a loss re-subscribe and count one change (there is no replay)."""
        subscribed = False
        while not self._closed:
            try:
                conn = await self._control()
                assert conn.client is not None  # set once the connection is open
                caps = conn.client.server_capabilities.tools
                if not (caps and caps.list_changed):
                    raise ToolsChangedUnsupported(
                        f"{self.url or cast(list[str], self.command)[0]} does not announce tool changes; poll list_tools"
                    )
                async with (
                    conn.client.listen(tools_list_changed=True) if conn.modern else contextlib.nullcontext()
                ) as subscription:
                    if subscribed:
                        self._bump()  # changes while unsubscribed are unknown: report one, callers refetch
                    subscribed = True
                    if not ready.done():
                        ready.set_result(None)
                    if subscription is None:  # handshake era: the message handler counts notifications
                        await conn.ended.wait()
                    else:
                        async for _ in subscription:
                            self._bump()
            except Exception as e:
                if not subscribed or isinstance(e, ToolsChangedUnsupported):  # a later watch_tools retries
                    if not ready.done():
                        ready.set_exception(
                            e
                            if isinstance(e, ToolsChangedUnsupported)
                            else ConnectionError(f"cannot watch tools: {describe(e)}")
                        )
                    return
            await asyncio.sleep(RETRY_CONNECT_S)

    async def _wait_changed(self, timeout: float | None, since: int | None) -> bool:
        await self._watch_started()
        since = self._generation if since is None else since
        try:
            async with asyncio.timeout(timeout):
                while self._generation <= since:
                    await self._changed.wait()
        except TimeoutError:
            return False
        return True

    async def _aclose(self) -> None:
        if self._watcher is not None:  # first, or it would reconnect what is being closed
            self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)
        await asyncio.gather(*(conn.close() for conn in [*self._episodes, *([self._ctl] if self._ctl else [])]))


class MCPSession(ClosedOnExit):
    """An episode's tool session: the backend's shared connection, or its own (opened at the first call,
    closed with the session; once lost, its calls say so: the server's state for the episode is gone)."""

    def __init__(self, backend: MCPBackend, shared: bool):
        self.backend, self.shared = backend, shared
        self._conn: Connection | None = None
        self._lock = asyncio.Lock()

    async def acall(self, name: str, arguments: dict) -> ToolResult:
        if self.backend._closed:
            return _error("session_lost", "the tool backend is closed")
        return await self.backend._hop(self._acall(name, arguments))

    def call(self, name: str, arguments: dict) -> ToolResult:
        if self.backend._closed:
            return _error("session_lost", "the tool backend is closed")
        return self.backend._lt.run(self._acall(name, arguments))

    async def _acall(self, name: str, arguments: dict) -> ToolResult:
        try:
            if self.shared:
                conn = await self.backend._control()
            else:
                async with self._lock:
                    if self._conn is None:
                        conn = Connection(self.backend)
                        await conn.open(self.backend.connect_timeout)
                        self._conn = conn
                        self.backend._episodes.add(conn)
                    elif not self._conn.alive:
                        return _error("session_lost", "the episode's connection to the tool server was lost")
                    conn = self._conn
        except TimeoutError:
            return _error("timeout", "timed out connecting to the tool server")
        except Exception as e:
            return _error("unreachable", f"tool server unreachable ({describe(e)})")
        return await self.backend._call(conn, name, arguments)

    def close(self) -> None:
        if self._conn is not None and not self.backend._closed:
            self.backend._episodes.discard(self._conn)
            self.backend._lt.run(self._conn.close())
        self._conn = None


def _openai_tool(tool: types.Tool) -> dict:
    out = {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description or "", "parameters": tool.input_schema},
    }
    if (handler := (tool.meta or {}).get(HANDLER_META)) is not None:
        out["x-evergreen-handler"] = handler
    return out
