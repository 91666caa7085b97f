"""The resources-server backend: an episode's tool calls go over HTTP to a NeMo Gym-shaped resources server
(include/tools/desk_resources_server.py is desk's), through one pooled aiohttp client per event loop.

    backend = ResourcesServerBackend("http://127.0.0.1:8765", timeout=10.0, max_connections=1024)
    tools = backend.list_tools()                       # GET /tools
    with backend.open_session(task) as session:        # POST /seed_session on first use; keeps the cookie
        result = session.call("calculate", {"x": "2", "y": "3", "operator": "+"})   # POST /calculate
        score = session.verify("5")                    # POST /verify
    # async, thousands in flight: s = await backend.aopen_session(task); await s.acall(...); await s.averify(...)

Every failure of a call is a ToolResult(is_error=True, fault=...) and never an exception:
    200 {"output", "is_error", "fault"}       the tool's answer or its own refusal ("refused"/"tool_failed")
    400 / 404 / 422                           "refused"   (the call reached the server, which rejected it:
                                                          a NeMo Gym server's validation error, an unknown tool)
    410                                       "session_lost" (the server no longer knows the session: it
                                                          restarted, or the session expired); later calls of
                                                          the session answer so without a request
    500 / 502, 503 / 504                      "tool_failed" / "unreachable" / "timeout" (a proxy's words)
    connection refused, reset or dropped      "unreachable"
    connecting, or the server silent, for     "timeout"   (waiting for a free pooled connection does
    longer than `timeout`                                 not count: thousands of episodes queue there)
    anything else (other status, not JSON,    "bad_response"
    not HTTP at all)

Cookies: the pool is shared by every session, so it has no cookie jar (aiohttp.DummyCookieJar); each
session reads `evergreen_session` from its own seed response and sends it as an explicit Cookie header,
so no session can ever send another's cookie.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson

from tasks.envs.backends import FAULTS, ClosedOnExit, LoopThread, ToolResult

if TYPE_CHECKING:
    from tasks.envs.base import Task

COOKIE = "evergreen_session"
_STATUS_FAULTS = {
    400: "refused",
    404: "refused",
    422: "refused",
    410: "session_lost",
    500: "tool_failed",
    502: "unreachable",
    503: "unreachable",
    504: "timeout",
}


def _error(fault: str, text: str) -> ToolResult:
    return ToolResult(f"error: {text}", is_error=True, fault=fault)


class ResourcesServerBackend(ClosedOnExit):
    """ToolBackend over a resources server at `base_url`: one connection pool per event loop (in practice
    one: the backend's own LoopThread for synchronous callers, or the caller's loop for async ones)."""

    def __init__(self, base_url: str, timeout: float = 10.0, max_connections: int = 1024):
        self.base_url = base_url.rstrip("/")
        self.timeout, self.max_connections = timeout, max_connections
        self._clients: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}
        self._thread: LoopThread | None = None
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- plumbing

    def _client(self) -> aiohttp.ClientSession:
        # created on the loop that uses it (an aiohttp session is bound to its loop)
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None or client.closed:
            connector = aiohttp.TCPConnector(
                limit=self.max_connections, limit_per_host=0, keepalive_timeout=15, ttl_dns_cache=300
            )
            # `timeout` bounds connecting and the server's silence, not the wait for a free pooled
            # connection: with thousands of episodes in flight, queueing there is normal, not a fault
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.timeout, sock_read=self.timeout)
            client = aiohttp.ClientSession(
                connector=connector,
                timeout=timeout,
                cookie_jar=aiohttp.DummyCookieJar(),
                skip_auto_headers=("User-Agent",),
            )
            self._clients[loop] = client
        return client

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run `coro` on the backend's own loop thread (for synchronous callers); not from that thread."""
        with self._lock:
            if self._thread is None:
                self._thread = LoopThread("resources-server-backend")
        return self._thread.run(coro)  # bounded by aiohttp's own timeouts (connect, read)

    async def request(
        self, method: str, path: str, payload: Any = None, session_id: str | None = None
    ) -> tuple[int, Any, str | None] | ToolResult:
        """(status, parsed JSON body, the session cookie it set), or the error result for a transport
        failure or a body that is not JSON."""
        headers = {"Content-Type": "application/json"}
        if session_id is not None:
            headers["Cookie"] = f"{COOKIE}={session_id}"
        url = self.base_url + path
        try:
            data = None if payload is None else orjson.dumps(payload)
            async with self._client().request(method, url, data=data, headers=headers) as resp:
                raw = await resp.read()
                status = resp.status
                morsel = resp.cookies.get(COOKIE)
        except TimeoutError:  # before ClientConnectionError: aiohttp's ServerTimeoutError is both
            return _error("timeout", f"{path} did not answer within {self.timeout:g} s")
        except aiohttp.ClientConnectionError as e:  # refused, reset, dropped mid-answer
            return _error("unreachable", f"{url} unreachable ({type(e).__name__}: {str(e)[:200]})")
        except (aiohttp.ClientResponseError, aiohttp.ClientPayloadError) as e:  # not HTTP, broken framing
            return _error("bad_response", f"{path} answered with a broken response ({type(e).__name__})")
        except (aiohttp.ClientError, orjson.JSONEncodeError, ValueError) as e:
            return _error("bad_response", f"{path}: {type(e).__name__}: {str(e)[:200]}")
        try:
            body = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            return _error("bad_response", f"{path} answered HTTP {status} with non-JSON {raw[:60]!r}")
        return status, body, (morsel.value if morsel is not None else None)

    # ---------------------------------------------------------------- ToolBackend

    async def alist_tools(self) -> list[dict]:
        got = await self.request("GET", "/tools")
        if isinstance(got, ToolResult) or got[0] != 200:
            raise RuntimeError(f"GET {self.base_url}/tools failed: {got.text if isinstance(got, ToolResult) else got}")
        body = got[1]
        tools = body.get("tools") if isinstance(body, dict) else body  # {version, tools} or a bare list
        if not isinstance(tools, list):
            raise RuntimeError(f"GET {self.base_url}/tools: expected a list of tools, got {str(body)[:200]}")
        return tools

    def list_tools(self) -> list[dict]:
        return self.run(self.alist_tools())

    def open_session(self, task: Task | dict | None = None) -> ResourcesServerSession:
        """A session for `task` (a Task or its dict). No I/O here, so it is safe inside an event loop: the
        session is seeded on its first call (or `await session.aseed()`)."""
        return ResourcesServerSession(self, task.to_dict() if task is not None and hasattr(task, "to_dict") else task)

    async def aopen_session(self, task: Task | dict | None = None) -> ResourcesServerSession:
        session = self.open_session(task)
        await session.aseed()
        return session

    async def aclose(self) -> None:
        loop = asyncio.get_running_loop()
        client = self._clients.pop(loop, None)
        if client is not None:
            await client.close()

    def close(self) -> None:
        for loop, client in list(self._clients.items()):
            if self._thread is not None and loop is self._thread.loop:
                self._thread.run(client.close(), timeout=10)
            elif loop.is_running():  # another thread's loop, or a sync close() from inside an async caller
                try:
                    running = asyncio.get_running_loop()
                except RuntimeError:
                    running = None
                if running is loop:
                    loop.create_task(client.close())
                else:
                    asyncio.run_coroutine_threadsafe(client.close(), loop).result(10)
            self._clients.pop(loop, None)  # a stopped loop's client goes with it
        if self._thread is not None:
            self._thread.stop()
            self._thread = None


class ResourcesServerSession(ClosedOnExit):
    """One episode's session on the server: the cookie from POST /seed_session, sent with every call."""

    def __init__(self, backend: ResourcesServerBackend, task: dict | None):
        self.backend, self.task = backend, task
        self.session_id: str | None = None
        self.lost: ToolResult | None = None  # set for good once the server has forgotten the session
        self._seeding: asyncio.Task | None = None

    async def aseed(self) -> ToolResult | None:
        """Seed once (concurrent first calls share one request); None when seeded, else the error. A
        failed seed is retried by the next call: no episode state existed yet, so nothing is lost."""
        if self.session_id is not None:
            return None
        if self._seeding is None:
            self._seeding = asyncio.ensure_future(self._seed())
        try:
            error = await asyncio.shield(self._seeding)
        finally:
            if self._seeding is not None and self._seeding.done():
                self._seeding = None
        return error

    async def _seed(self) -> ToolResult | None:
        got = await self.backend.request("POST", "/seed_session", {"task": self.task} if self.task else {})
        if isinstance(got, ToolResult):
            return got
        status, body, cookie = got
        sid = cookie or (body.get("session_id") if isinstance(body, dict) else None)
        if status != 200 or not isinstance(sid, str):
            detail = body.get("detail") if isinstance(body, dict) else body
            return _error("bad_response", f"seed_session answered HTTP {status}: {str(detail)[:200]}")
        self.session_id = sid
        return None

    async def acall(self, name: str, arguments: dict) -> ToolResult:
        if self.lost is not None:
            return self.lost
        error = await self.aseed()
        if error is not None:
            return error
        got = await self.backend.request("POST", "/" + name, arguments, self.session_id)
        if isinstance(got, ToolResult):
            return got
        status, body, _ = got
        if status == 200 and isinstance(body, dict) and isinstance(body.get("output"), str):
            if not body.get("is_error"):
                return ToolResult(body["output"])
            fault = body.get("fault") or "refused"
            if fault in FAULTS:
                return ToolResult(body["output"], is_error=True, fault=fault)
        fault = _STATUS_FAULTS.get(status, "bad_response") if status != 200 else "bad_response"
        detail = body.get("detail", body) if isinstance(body, dict) else body
        result = _error(fault, f"{name}: HTTP {status}: {str(detail)[:300]}")
        if fault == "session_lost":
            self.lost = result
        return result

    def call(self, name: str, arguments: dict) -> ToolResult:
        return self.backend.run(self.acall(name, arguments))

    async def averify(self, answer: str | None, **parts: float) -> dict:
        """The server's score of this session for `answer`; `parts` may pass format / call_validity.
        A failure scores 0 with the fault named, so that a batch is never ended by one verify."""
        error = self.lost or await self.aseed()
        got = error or await self.backend.request("POST", "/verify", {"answer": answer, **parts}, self.session_id)
        if not isinstance(got, ToolResult):
            status, body, _ = got
            if status == 200 and isinstance(body, dict) and "reward" in body:
                return body
            got = _error(
                _STATUS_FAULTS.get(status, "bad_response") if status != 200 else "bad_response",
                f"verify: HTTP {status}: {str(body)[:300]}",
            )
        return {"reward": 0.0, "components": {}, "reason": got.text, "success": False, "fault": got.fault}

    def verify(self, answer: str | None, **parts: float) -> dict:
        return self.backend.run(self.averify(answer, **parts))

    def close(self) -> None:
        # nothing to send and nothing to forget: the server's LRU/TTL drops idle sessions (a request per
        # episode saved), and an episode closes its session when it ends, before its score is asked for
        pass
