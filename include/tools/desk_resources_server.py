"""Desk's tools as a NeMo Gym-shaped resources server: one HTTP endpoint per tool, one session per episode.

    python include/tools/desk_resources_server.py --toolset include/tools/registry_v2.json \
        --host 127.0.0.1 --port 8765 [--latency-ms 50] [--max-sessions 100000] [--session-ttl-s 900]

    curl -s 127.0.0.1:8765/tools                                   # {"version", "tools": [...]}
    curl -s -c jar -XPOST 127.0.0.1:8765/seed_session -d '{"task": <Task.to_dict()>}'   # or -d '{}'
    curl -s -b jar -XPOST 127.0.0.1:8765/calculate -d '{"x": "2", "y": "3", "operator": "+"}'
    curl -s -b jar -XPOST 127.0.0.1:8765/verify -d '{"answer": "5"}'

Wire protocol (tasks/envs/http_backend.py is its client):
- GET /tools: the toolset as loaded (OpenAI function tools with "x-evergreen-handler"), so that
  tasks.envs.toolset.load_toolset("http://host:port/tools") reads it like a registry file.
- POST /seed_session {"task": {...}} | {}: a new session; the id comes back in the `evergreen_session`
  cookie and in the body ({"session_id"}). The session keeps the task's tools, solution, expected
  answer and a call log. Without a task the tools are the toolset's and nothing can be grounded.
- POST /<tool> (JSON body = the arguments), cookie `evergreen_session`:
    200 {"output": "42"}                                        the tool's answer
    200 {"output": "error: ...", "is_error": true, "fault": F}  the tool refused ("refused": unknown
        tool, arguments off the schema, a value the strict v2 service rejects) or failed ("tool_failed")
    410 {"detail": ..., "fault": "session_lost"}                 unknown or expired session (e.g. restart)
  A refusal is a *tool answer* the policy must see, as in NeMo Gym, so it is a 200; a status other than
  200 always means the call never reached a tool. Without a cookie a call is served statelessly on the
  toolset (handy for curl; nothing is logged).
- POST /verify {"answer": str, "format"?: float, "call_validity"?: float}: {"reward", "components",
  "reason", "success", "tool_calls", "tool_errors", "calls"}, scored like tasks.envs.base.GroundedVerifier:
  correct = answer matches expected AND some successful call of this session returned it and solves the
  task. The server only sees the calls that reached it, so `format` defaults to 1.0 for a non-empty
  answer (0.0 otherwise) and `call_validity` to valid/all calls of its log; the episode, which also saw
  unparseable or unknown calls, may pass both in.

Sessions live in one LRU ordered by last use, bounded by --max-sessions and an idle TTL, so memory
stays flat however many episodes pass; a session's tools and bindings are interned (every task of a
toolset shares them), leaving a few hundred bytes of per-episode state.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import secrets
import sys
import time
from collections import OrderedDict
from pathlib import Path

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tasks.envs.base import ToolError, check_arguments, grounded_score, normalise_answer  # noqa: E402
from tasks.envs.desk_service import DeskService, convention_of, task_convention, tool_bindings  # noqa: E402
from tasks.envs.toolset import load_toolset  # noqa: E402

COOKIE = "evergreen_session"
RESERVED = ("seed_session", "verify", "tools")  # routes a tool name would shadow
MAX_LOG = 32  # call-log entries kept per session (the counters keep counting past it)


def _json(body, status: int = 200, **headers) -> Response:
    # orjson and a bare Response: FastAPI's validation/serialisation path costs more than the tool itself
    return Response(orjson.dumps(body), status_code=status, media_type="application/json", headers=headers or None)


class Session:
    """One episode's state: its service, expected answer and call log."""

    __slots__ = ("service", "tools", "expected", "n_calls", "n_valid", "grounded", "log", "last_used")

    def __init__(self, service: DeskService, tools: dict, expected: str | None):
        self.service, self.tools, self.expected = service, tools, expected
        self.n_calls = self.n_valid = 0
        self.grounded = False  # a successful call returned the expected value and solves the task
        self.log: list = []
        self.last_used = time.monotonic()

    def call(self, name: str, args) -> dict:
        self.n_calls += 1
        tool = self.tools.get(name)
        if tool is None:
            return self._refuse(name, f"unknown tool '{name}'; offered: {', '.join(self.tools)}")
        problem = check_arguments(tool, args) if isinstance(args, dict) else "arguments must be a JSON object"
        if problem:
            return self._refuse(name, problem)
        try:
            out = str(self.service(name, args))
        except ToolError as e:
            return self._refuse(name, str(e))
        except Exception as e:  # a tool bug is an answer too; the server must keep serving the batch
            self._note(name, False)
            return {"output": f"error: tool failed ({type(e).__name__})", "is_error": True, "fault": "tool_failed"}
        self.n_valid += 1
        if (
            not self.grounded
            and self.expected is not None
            and normalise_answer(out) == normalise_answer(self.expected)
            and self.service.solves(name, args)
        ):
            self.grounded = True
        self._note(name, True)
        return {"output": out}

    def _refuse(self, name: str, why: str) -> dict:
        self._note(name, False)
        return {"output": f"error: {why}", "is_error": True, "fault": "refused"}

    def _note(self, name: str, ok: bool) -> None:
        if len(self.log) < MAX_LOG:
            self.log.append([name, ok])

    def verify(self, body: dict) -> dict:
        """GroundedVerifier's reward from what the server saw (see the module docstring)."""
        answer = body.get("answer")
        answer = answer if isinstance(answer, str) else None
        verdict = grounded_score(
            answer,
            self.expected,
            self.grounded,
            fmt=float(body.get("format", 1.0 if answer and answer.strip() else 0.0)),
            validity=float(body.get("call_validity", self.n_valid / self.n_calls if self.n_calls else 0.0)),
            unanswered="no final answer",
        )
        if self.expected is None:
            verdict["reason"] = "the session was seeded without a task: there is no expected answer"
        return {**verdict, "tool_calls": self.n_calls, "tool_errors": self.n_calls - self.n_valid, "calls": self.log}


class SessionStore:
    """Sessions by id in last-use order: the oldest go first, past `max_sessions` or idle past `ttl_s`."""

    def __init__(self, max_sessions: int, ttl_s: float):
        self.max_sessions, self.ttl_s = max_sessions, ttl_s
        self._sessions: OrderedDict[str, Session] = OrderedDict()

    def add(self, session: Session) -> str:
        self._evict()
        sid = secrets.token_urlsafe(16)
        self._sessions[sid] = session
        return sid

    def get(self, sid: str) -> Session | None:
        session = self._sessions.get(sid)
        if session is None:
            return None
        now = time.monotonic()
        if now - session.last_used > self.ttl_s:
            del self._sessions[sid]
            return None
        session.last_used = now
        self._sessions.move_to_end(sid)
        return session

    def _evict(self) -> None:
        # amortised O(1): the front of the order is the longest idle, so stop at the first live one
        deadline = time.monotonic() - self.ttl_s
        while self._sessions:
            sid, oldest = next(iter(self._sessions.items()))
            if len(self._sessions) < self.max_sessions and oldest.last_used >= deadline:
                break
            del self._sessions[sid]

    def __len__(self) -> int:
        return len(self._sessions)


def create_app(
    toolset: dict, latency_ms: float = 0.0, max_sessions: int = 100_000, session_ttl_s: float = 900.0
) -> FastAPI:
    tools = toolset["tools"]
    clash = [t["function"]["name"] for t in tools if t["function"]["name"] in RESERVED]
    if clash:
        raise ValueError(f"tool names {clash} clash with the server's own routes {RESERVED}")
    convention = convention_of(toolset, unnumbered="any")
    interned: dict[bytes, tuple[dict, dict]] = {}  # (tools, bindings) JSON -> shared parsed copies

    def shared(task_tools: list, bindings: dict | None) -> tuple[dict, dict]:
        key = orjson.dumps([task_tools, bindings])
        if key not in interned:
            if len(interned) > 1024:  # random-tool tasks (bootstrap) would grow it without bound
                interned.clear()
            interned[key] = ({t["function"]["name"]: t for t in task_tools}, bindings or tool_bindings(task_tools))
        return interned[key]

    default_tools, default_bindings = shared(tools, None)
    stateless = Session(DeskService(default_bindings, convention), default_tools, None)
    store = SessionStore(max_sessions, session_ttl_s)
    latency = latency_ms / 1000.0
    app = FastAPI(title="desk resources server", version=str(toolset.get("version")))
    app.state.store = store

    async def body_of(request: Request):
        raw = await request.body()
        return orjson.loads(raw) if raw else {}

    @app.get("/tools")
    async def list_tools():
        return _json({"version": toolset.get("version"), "tools": tools})

    @app.post("/seed_session")
    async def seed_session(request: Request):
        try:
            task = (await body_of(request) or {}).get("task")
            if task:
                data = task.get("data") or task.get("service") or {}  # Task.service was renamed to Task.data
                by_name, bindings = shared(task["tools"], data.get("bindings"))
                service = DeskService(
                    bindings,
                    task_convention(data, default=convention),  # the task's, else the server's
                    family=task.get("family"),
                    solution=data.get("solution"),
                )
                session = Session(service, by_name, task.get("expected"))
            else:
                session = Session(stateless.service, default_tools, None)
        except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError) as e:
            return _json({"detail": f"bad task: {type(e).__name__}: {e}"}, 400)
        sid = store.add(session)
        return _json({"session_id": sid}, 200, **{"set-cookie": f"{COOKIE}={sid}; Path=/; HttpOnly; SameSite=Lax"})

    def lost(sid: str) -> Response:
        return _json(
            {
                "detail": f"session {sid[:8]}... is unknown or expired (server restarted, or idle past "
                f"{session_ttl_s:.0f} s); seed a new one",
                "fault": "session_lost",
            },
            410,
        )

    @app.post("/verify")
    async def verify(request: Request):
        sid = request.cookies.get(COOKIE)
        if sid is None:
            return _json({"detail": f"no {COOKIE} cookie: POST /seed_session first"}, 400)
        session = store.get(sid)
        if session is None:
            return lost(sid)
        try:
            body = await body_of(request)
            return _json(session.verify(body if isinstance(body, dict) else {}))
        except (orjson.JSONDecodeError, TypeError, ValueError) as e:
            return _json({"detail": f"bad verify body: {e}"}, 400)

    @app.post("/{tool}")
    async def tool_call(tool: str, request: Request):
        sid = request.cookies.get(COOKIE)
        session = stateless if sid is None else store.get(sid)
        if session is None:
            return lost(sid)
        try:
            args = await body_of(request)
        except orjson.JSONDecodeError:
            args = None  # refused below, as a call whose arguments are not an object
        if latency:
            await asyncio.sleep(latency)  # a stand-in for a real tool's work (bench/envs.py)
        return _json(session.call(tool, args))

    return app


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--toolset",
        default=str(ROOT / "include/tools/registry_v2.json"),
        help="a registry file, or a shipped version of desk's toolset (1, 2)",
    )
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--latency-ms", type=float, default=0.0, help="asyncio.sleep added to every tool call")
    ap.add_argument("--max-sessions", type=int, default=100_000)
    ap.add_argument("--session-ttl-s", type=float, default=900.0)
    args = ap.parse_args(argv)
    import uvicorn

    app = create_app(load_toolset(args.toolset, "desk"), args.latency_ms, args.max_sessions, args.session_ttl_s)
    has = importlib.util.find_spec
    print(
        f"desk resources server on http://{args.host}:{args.port} (toolset {args.toolset}, "
        f"latency {args.latency_ms} ms)",
        file=sys.stderr,
        flush=True,
    )
    # one process, one event loop: sessions live in this process's memory. The keep-alive outlasts the
    # client's (http_backend keeps idle connections 15 s), so it is always the client that closes an idle
    # connection and never reuses one the server has just dropped (a POST is not retried).
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        loop="uvloop" if has("uvloop") else "asyncio",
        http="httptools" if has("httptools") else "h11",
        timeout_keep_alive=75,
        backlog=4096,
    )


if __name__ == "__main__":
    main()
