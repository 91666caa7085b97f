"""Tool backends: what answers an episode's tool calls, in process, over MCP or over HTTP.

A backend lists its toolset (`list_tools`: OpenAI function tools, as an episode offers them) and opens
one session per episode (`open_session`); a session answers calls with a ToolResult, never raises for a
tool's own failure (a refusal, a timeout, a dropped connection, a result that is not text: each becomes
an error result the policy sees, with `fault` naming what happened so that a batch can count them), and
is closed when the episode ends. Sessions are async first (`acall`): thousands of episodes are in flight
at once over one pooled client; `call` is the same from synchronous code (the episode loop), run on the
backend's own event loop thread.

    session = InProcessSession(service, (ToolError,))        # Python callables (the embedded default's tools)
    session = MCPBackend(...).open_session(task)             # or a backend's session (an MCP server, ...)
    result = session.call("calculate", {"x": "2", "y": "3", "operator": "+"})

The MCP backend (tasks/envs/mcp_backend.py) and the resources-server backend (tasks/envs/http_backend.py)
implement the same protocol.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from typing import Self

FAULTS = ("refused", "timeout", "unreachable", "bad_response", "session_lost", "tool_failed")


@dataclass(frozen=True)
class ToolResult:
    """A call's answer as the policy sees it. `fault` is None for an answer (also for a tool's refusal
    that the service phrased itself: fault "refused"), else which failure produced the error text."""

    text: str
    is_error: bool = False
    fault: str | None = None

    def __post_init__(self) -> None:
        if self.fault is not None and self.fault not in FAULTS:
            raise ValueError(f"fault={self.fault!r}; use one of {FAULTS}")


class ToolSession(Protocol):
    async def acall(self, name: str, arguments: dict) -> ToolResult: ...

    def call(self, name: str, arguments: dict) -> ToolResult: ...

    def close(self) -> None: ...

    def __enter__(self) -> ToolSession: ...

    def __exit__(self, *exc: object) -> None: ...


class ToolBackend(Protocol):
    def list_tools(self) -> list[dict]: ...

    def open_session(self, task: dict | None = None) -> ToolSession: ...

    def close(self) -> None: ...


class LoopThread:
    """One asyncio loop on a daemon thread: synchronous code submits coroutines to it and waits."""

    def __init__(self, name: str = "tool-backend"):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, Any]) -> Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float | None = None) -> Any:
        return self.submit(coro).result(timeout)

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=5)


class ClosedOnExit:
    """`with x:` closes x at the end: the sessions and backends of this package."""

    if TYPE_CHECKING:

        def close(self) -> None: ...  # each subclass's own

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class InProcessSession(ClosedOnExit):
    """A session over a Python callable `service(name, arguments) -> str` that raises `refusal` types
    for calls it refuses (e.g. tasks.envs.base.ToolError)."""

    def __init__(self, service: Callable[[str, dict], str], refusal: tuple[type[BaseException], ...]):
        self.service, self.refusal = service, refusal

    async def acall(self, name: str, arguments: dict) -> ToolResult:
        return self.call(name, arguments)

    def call(self, name: str, arguments: dict) -> ToolResult:
        try:
            return ToolResult(str(self.service(name, arguments)))
        except self.refusal as e:
            return ToolResult(f"error: {e}", is_error=True, fault="refused")
        except Exception as e:  # a tool bug must not end the rollout batch
            return ToolResult(f"error: tool failed ({type(e).__name__})", is_error=True, fault="tool_failed")

    def close(self) -> None:
        pass
