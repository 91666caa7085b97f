"""The resources-server backend against the real desk resources server (a subprocess on 127.0.0.1).

    PYTHONPATH=. .venv/bin/python -m pytest -q tests/integration/test_http_backend.py    # about 20 s

Covers the wire protocol end to end: the tool list, a v2 call and a strict v2 refusal, the grounded
verify, separate sessions over one pool, and every transport fault a batch must survive as a ToolResult
(a server killed and restarted mid-episode, a response that is not JSON or not HTTP, a slow tool).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tasks.envs.desk import OPS, generate_tasks
from tasks.envs.http_backend import ResourcesServerBackend
from tasks.envs.toolset import load_toolset
from tasks.net import free_port
from tests.services import wait_for_http

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "include/tools/desk_resources_server.py"
REGISTRY = ROOT / "include/tools/registry_v2.json"


@contextlib.contextmanager
def resources_server(tmp_path: Path, port: int | None = None, *extra: str):
    """The desk resources server on `port`; yields (base URL, process) and ends the process on exit."""
    port = port or free_port()
    log_path = tmp_path / f"server-{port}-{time.monotonic_ns()}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                str(SERVER),
                "--toolset",
                str(REGISTRY),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                *extra,
            ],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=os.environ | {"PYTHONPATH": str(ROOT)},
        )
    try:
        wait_for_http(f"http://127.0.0.1:{port}/tools", proc, log_path, timeout=60, interval=0.1)
        yield f"http://127.0.0.1:{port}", proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with resources_server(tmp_path_factory.mktemp("rs")) as (url, _):
        yield url


@pytest.fixture
def backend(server):
    b = ResourcesServerBackend(server, timeout=10.0, max_connections=64)
    yield b
    b.close()


def v2_task(family: str):
    return next(t for t in generate_tasks(12, seed=5, toolset=load_toolset("2")) if t.family == family)


def solving_args(task) -> tuple[str, dict]:
    """The v2 call that solves a calc task, in the canonical (strict) formats."""
    a, b, op = task.to_dict().get("data", task.to_dict().get("service"))["solution"]
    return "calculate", {"x": str(a), "y": str(b), "operator": OPS[op][0]}


def test_list_tools_is_the_registry(backend):
    assert backend.list_tools() == json.loads(REGISTRY.read_text())["tools"]


def test_v2_call_answers_and_strict_v2_refuses(backend):
    task = v2_task("calc")
    with backend.open_session(task) as session:
        name, args = solving_args(task)
        result = session.call(name, args)
        assert (result.text, result.is_error, result.fault) == (task.expected, False, None)
        refused = session.call(name, dict(args, operator="add"))  # v1 accepted the word; v2 wants "+"
        assert refused.is_error and refused.fault == "refused" and "not supported" in refused.text
        unknown = session.call("calc", args)
        assert unknown.fault == "refused" and "unknown tool" in unknown.text


def test_verify_needs_the_grounding_call(backend):
    task = v2_task("calc")
    name, args = solving_args(task)
    grounded = backend.open_session(task)
    assert grounded.call(name, args).text == task.expected
    score = grounded.verify(task.expected)
    assert score["success"] and score["reward"] == 1.0 and score["reason"] == "correct"
    assert not grounded.verify("-1")["success"]

    from_memory = backend.open_session(task)  # right answer, no call at all
    score = from_memory.verify(task.expected)
    assert not score["success"] and "right value" in score["reason"]

    echoed = backend.open_session(task)  # the right value echoed through x + 0: returned, but solves nothing
    assert echoed.call(name, {"x": task.expected, "y": "0", "operator": "+"}).text == task.expected
    score = echoed.verify(task.expected)
    assert not score["success"] and score["components"]["call_validity"] == 1.0


def test_parallel_sessions_keep_their_own_logs(backend):
    task = v2_task("calc")
    name, args = solving_args(task)

    async def episode(right: bool):
        session = await backend.aopen_session(task)
        results = await asyncio.gather(
            *(session.acall(name, args if right else dict(args, operator="add")) for _ in range(3))
        )
        return session, results, await session.averify(task.expected)

    async def both():
        return await asyncio.gather(episode(True), episode(False))

    (a, a_results, a_score), (b, b_results, b_score) = backend.run(both())
    assert a.session_id != b.session_id
    assert all(not r.is_error for r in a_results) and all(r.fault == "refused" for r in b_results)
    assert a_score["success"] and a_score["calls"] == [[name, True]] * 3
    assert not b_score["success"] and b_score["calls"] == [[name, False]] * 3 and b_score["tool_errors"] == 3


def test_server_killed_then_restarted_mid_episode(tmp_path):
    port = free_port()
    task = v2_task("calc")
    name, args = solving_args(task)
    with ResourcesServerBackend(f"http://127.0.0.1:{port}", timeout=5.0) as backend:
        session = backend.open_session(task)
        with resources_server(tmp_path, port) as (_, proc):
            assert session.call(name, args).text == task.expected
            proc.kill()
            proc.wait()
            down = session.call(name, args)
            assert down.is_error and down.fault == "unreachable"
            assert session.verify(task.expected)["fault"] == "unreachable"
        with resources_server(tmp_path, port):  # same address, fresh process: the session is gone
            lost = session.call(name, args)
            assert lost.is_error and lost.fault == "session_lost" and "unknown or expired" in lost.text
            assert session.call(name, args).fault == "session_lost"  # for good, without asking again
            assert session.verify(task.expected)["fault"] == "session_lost"
            fresh = backend.open_session(task)  # a new episode works on the restarted server
            assert fresh.call(name, args).text == task.expected and fresh.verify(task.expected)["success"]


class _BrokenHandler(BaseHTTPRequestHandler):
    """A server that seeds sessions properly and then answers tool calls with junk."""

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/seed_session":
            self._send(200, b'{"session_id": "s1"}', "application/json", ("Set-Cookie", "evergreen_session=s1"))
        elif self.path == "/html":
            self._send(200, b"<html>proxy error</html>", "text/html")
        elif self.path == "/teapot":
            self._send(418, b'{"detail": "short and stout"}', "application/json")
        elif self.path == "/wrong_shape":
            self._send(200, b'["not", "an", "object"]', "application/json")
        else:  # not HTTP at all
            self.wfile.write(b"\x00\xffSSH-2.0-OpenSSH_9.6\r\n\r\n")
            self.close_connection = True

    def _send(self, status, body, ctype, *headers):
        self.send_response(status)
        for h in (("Content-Type", ctype), ("Content-Length", str(len(body))), *headers):
            self.send_header(*h)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_junk_responses_are_bad_response():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _BrokenHandler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        with ResourcesServerBackend(f"http://127.0.0.1:{httpd.server_address[1]}", timeout=5.0) as backend:
            session = backend.open_session(None)
            for path in ("html", "teapot", "wrong_shape", "garbage"):
                result = session.call(path, {"x": "1"})
                assert result.is_error and result.fault == "bad_response", (path, result)
            assert session.session_id == "s1"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_slow_call_times_out_and_nothing_answers_unreachable(tmp_path):
    with (
        resources_server(tmp_path, None, "--latency-ms", "3000") as (url, _),
        ResourcesServerBackend(url, timeout=0.5) as backend,
    ):
        session = backend.open_session(v2_task("calc"))
        assert backend.run(session.aseed()) is None  # seeding is not slowed, only tool calls
        start = time.monotonic()
        result = session.call(*solving_args(v2_task("calc")))
        assert result.is_error and result.fault == "timeout" and time.monotonic() - start < 2.5
    with ResourcesServerBackend(f"http://127.0.0.1:{free_port()}", timeout=2.0) as backend:
        result = backend.open_session(None).call("calculate", {})
        assert result.fault == "unreachable"  # never seeded: nothing listens there
