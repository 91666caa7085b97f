"""One MCP connection (tasks/envs/mcp_backend.py's transport): a `Client` over stdio or streamable HTTP, entered
and left by its own owner task on the backend's event loop, and how its failures read in one line.

    conn = Connection(backend, on_notification=...)   # backend: url or command, mode, timeout, errlog
    await conn.open(timeout)                          # raises the transport's error if the handshake fails
    conn.client.call_tool(...)
    await conn.close()
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, overload

import mcp_types as types
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

if TYPE_CHECKING:
    from tasks.envs.mcp_backend import MCPBackend


@overload
def leaf(exc: BaseException) -> BaseException: ...
@overload
def leaf(exc: None) -> None: ...
def leaf(exc: BaseException | None) -> BaseException | None:
    while isinstance(exc, BaseExceptionGroup):  # anyio task groups wrap the transport's error
        exc = exc.exceptions[0]
    return exc


def describe(exc: BaseException) -> str:
    exc = leaf(exc)
    if type(exc) in (ConnectionError, TimeoutError) and str(exc):  # raised here: already described
        return str(exc)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class Connection:
    """One MCP connection: a `Client` entered and left by its own owner task on the backend's loop."""

    def __init__(self, backend: MCPBackend, on_notification: Callable[[], None] | None = None):
        self.backend, self.on_notification = backend, on_notification
        self.client: Client | None = None
        self.error: BaseException | None = None
        self.ready, self.closing, self.ended = asyncio.Event(), asyncio.Event(), asyncio.Event()
        self.task: asyncio.Task | None = None

    @property
    def modern(self) -> bool:
        return self.client is not None and self.client.protocol_version in MODERN_PROTOCOL_VERSIONS

    @property
    def alive(self) -> bool:
        # 2.3.0 has no public liveness signal; the dispatcher marks itself closed at EOF (a stdio server
        # that exited), which lets a shared connection be reopened before a call rather than fail it.
        return (
            self.client is not None
            and not self.ended.is_set()
            and not getattr(self.client.session._dispatcher, "_closed", False)
        )

    async def open(self, timeout: float) -> None:
        self.task = asyncio.create_task(self._own())
        try:
            await asyncio.wait_for(self.ready.wait(), timeout)
        except TimeoutError:  # stuck in the handshake: cancel it (the SDK unwinds a cancelled connect)
            self.task.cancel()
            await asyncio.wait([self.task], timeout=8.0)
            raise
        if self.client is None:
            raise self.error or ConnectionError("the connection ended while opening")

    async def _own(self) -> None:
        b = self.backend
        if b.url:
            transport = streamable_http_client(b.url)
        else:
            assert b.command is not None  # MCPBackend: a command when there is no URL
            transport = stdio_client(
                StdioServerParameters(command=b.command[0], args=b.command[1:], env=b.env, cwd=b.cwd), errlog=b.errlog
            )
        try:
            async with Client(
                transport, mode=b.mode, cache=None, read_timeout_seconds=b.timeout, message_handler=self._on_message
            ) as client:
                self.client = client
                self.ready.set()
                await self.closing.wait()
        except Exception as e:  # the transport's failure, kept to classify faults
            self.error = e
        finally:
            self.ended.set()
            self.ready.set()

    async def _on_message(self, message: Any) -> None:
        # handshake era only: a 2026-07-28 connection counts the events of its listen stream instead
        if isinstance(message, types.ToolListChangedNotification) and self.on_notification and not self.modern:
            self.on_notification()

    async def close(self, wait: float = 8.0) -> None:
        """Leave the Client (stdio: close stdin, then terminate the server's process group)."""
        self.closing.set()
        if self.task is not None and not self.task.done():
            try:
                await asyncio.wait_for(asyncio.shield(self.task), wait)
            except TimeoutError:
                self.task.cancel()
