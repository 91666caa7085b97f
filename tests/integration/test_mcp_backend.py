"""MCPBackend against the real desk MCP server (include/tools/desk_mcp_server.py), over both transports.

stdio: the backend starts the server as a command; http: the server runs as a subprocess on a free
loopback port. Each serves its own temporary copy of registry_v2.json, which the tool-change test
rewrites. The desk's own in-process session is the reference: over MCP, a call must answer exactly
what DeskService answers in process (value, refusal text, fault).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from tasks.envs.backends import InProcessSession
from tasks.envs.base import ToolError
from tasks.envs.desk_service import DeskService, tool_bindings
from tasks.envs.mcp_backend import MCPBackend, ToolsChangedUnsupported
from tasks.envs.toolset import load_toolset
from tasks.net import free_port, port_busy

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "include" / "tools" / "desk_mcp_server.py"
V1, V2 = ROOT / "include" / "tools" / "registry_v1.json", ROOT / "include" / "tools" / "registry_v2.json"
ADD = {"x": "2", "y": "3", "operator": "+"}


def server_pids(toolset: Path) -> list[int]:
    """This process's live stdio servers of `toolset` (the backend starts them as its children).

    A server killed by a test can stay a zombie until its parent's reaper runs; it serves nothing,
    so it is not counted (and reading its command line would raise)."""
    pids = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and str(toolset) in " ".join(proc.cmdline()):
                pids.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return pids


@contextmanager
def stopped(pid: int):
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


class Served:
    def __init__(self, transport: str, target, toolset: Path, log, proc=None):
        self.transport, self.target, self.toolset, self.log, self.proc = transport, target, toolset, log, proc
        self.backend = self.new_backend(timeout=5.0)

    def new_backend(self, **kw) -> MCPBackend:
        return MCPBackend(self.target, errlog=self.log, **kw)

    def pid(self, backend: MCPBackend) -> int:
        """The pid of the server that a fresh `backend` talks to (stdio: the one it starts now)."""
        if self.proc is not None:
            return self.proc.pid
        before = set(server_pids(self.toolset))
        backend.list_tools()
        (pid,) = set(server_pids(self.toolset)) - before
        return pid


@pytest.fixture(scope="module")
def stdio_server(tmp_path_factory):
    work = tmp_path_factory.mktemp("mcp-stdio")
    toolset = shutil.copyfile(V2, work / "toolset.json")
    with open(work / "server.log", "w") as log:
        served = Served("stdio", [sys.executable, str(SERVER), "--toolset", str(toolset)], toolset, log)
        yield served
        served.backend.close()
    assert server_pids(toolset) == [], "a stdio server outlived its backend"


@pytest.fixture(scope="module")
def http_server(tmp_path_factory):
    work = tmp_path_factory.mktemp("mcp-http")
    toolset, port = shutil.copyfile(V2, work / "toolset.json"), free_port()
    with open(work / "server.log", "w") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                str(SERVER),
                "--toolset",
                str(toolset),
                "--transport",
                "http",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 30
            while not port_busy(port):
                assert proc.poll() is None and time.monotonic() < deadline, (work / "server.log").read_text()
                time.sleep(0.2)
            served = Served("http", f"http://127.0.0.1:{port}/mcp", toolset, log, proc)
            yield served
            served.backend.close()
        finally:
            os.killpg(proc.pid, signal.SIGCONT)  # in case a test left it stopped
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture(scope="module", params=["stdio", "http"])
def served(request) -> Served:
    return request.getfixturevalue(f"{request.param}_server")


def test_list_tools_is_the_toolset(served):
    assert served.backend.list_tools() == load_toolset(V2)["tools"]  # names, schemas, x-evergreen-handler
    assert served.backend.toolset()["version"] == "2"


def test_calls_answer_as_the_desk_does_in_process(served):
    tools = load_toolset(V2)["tools"]
    reference = InProcessSession(DeskService(tool_bindings(tools), "symbols"), (ToolError,))
    calls = [
        ("calculate", ADD),
        ("calculate", {"x": "7", "y": "5", "operator": "*"}),
        ("convert_units", {"quantity": 3, "source": "km", "target": "m"}),
        ("city_facts", {"name": "oslo", "attribute": "country"}),
        ("calculate", {"x": "2", "y": "3", "operator": "add"}),  # v2 is strict: symbols only
        ("convert_units", {"quantity": 3, "source": "kilometers", "target": "m"}),
        ("city_facts", {"name": "Oslo", "attribute": "country"}),
    ]
    with served.backend.open_session({"task_id": "t"}) as session:
        assert session.shared  # the desk server speaks 2026-07-28: stateless, one connection for all
        got = [session.call(name, args) for name, args in calls]
    assert got == [reference.call(name, args) for name, args in calls]
    assert got[0].text == "5" and got[4].fault == "refused"
    assert got[4].text == "error: operator 'add' is not supported; use one of + - *"


def test_unknown_tool_and_bad_arguments_are_errors(served):
    with served.backend.open_session() as session:
        unknown = session.call("calculator", ADD)
        bad = session.call("calculate", {"x": "2"})
    assert unknown.is_error and unknown.fault == "refused" and "unknown tool 'calculator'" in unknown.text
    assert bad.is_error and bad.fault == "refused" and "'y' is a required property" in bad.text


def test_concurrent_acalls_from_another_loop(served):
    async def many():
        session = served.backend.open_session()
        return await asyncio.gather(
            *(session.acall("calculate", {"x": str(i), "y": "1", "operator": "+"}) for i in range(20))
        )

    assert [r.text for r in asyncio.run(many())] == [str(i + 1) for i in range(20)]


def test_a_stopped_server_times_out_without_raising(served):
    with served.new_backend(timeout=0.5) as backend:
        pid = served.pid(backend)
        with backend.open_session() as session:
            assert session.call("calculate", ADD).text == "5"
            with stopped(pid):
                t0 = time.monotonic()
                result = session.call("calculate", ADD)
                assert time.monotonic() - t0 < 4
            assert (result.is_error, result.fault) == (True, "timeout")
            assert session.call("calculate", ADD).text == "5"  # resumed: the connection still works


def test_a_server_that_is_down_is_unreachable(served):
    target = f"http://127.0.0.1:{free_port()}/mcp" if served.transport == "http" else [str(ROOT / "no-such-server")]
    with MCPBackend(target, timeout=1.0, connect_timeout=3.0) as backend:
        with backend.open_session() as session:
            result = session.call("calculate", ADD)
        assert (result.is_error, result.fault) == (True, "unreachable")
        with pytest.raises(ConnectionError):
            backend.list_tools()


def test_a_dead_stdio_server_loses_the_episode_and_is_restarted_when_shared(stdio_server):
    with (
        stdio_server.new_backend(timeout=2.0, stateless=False) as backend,  # one server per episode
        backend.open_session() as session,
    ):
        before = set(server_pids(stdio_server.toolset))
        assert session.call("calculate", ADD).text == "5"
        (pid,) = set(server_pids(stdio_server.toolset)) - before  # this episode's server
        os.kill(pid, signal.SIGKILL)
        assert session.call("calculate", ADD).fault == "session_lost"
        assert session.call("calculate", ADD).fault == "session_lost"  # its state is gone for good
    with stdio_server.new_backend(timeout=2.0) as backend:  # shared: a dead server is started again
        pid = stdio_server.pid(backend)
        session = backend.open_session()
        os.kill(pid, signal.SIGKILL)
        results = [session.call("calculate", ADD) for _ in range(2)]
        assert results[0].fault in (None, "session_lost") and results[-1].text == "5"


def test_close_leaves_no_stdio_server(stdio_server):
    others = set(server_pids(stdio_server.toolset))  # the module's backend's server
    with stdio_server.new_backend(stateless=False) as backend:
        sessions = [backend.open_session() for _ in range(2)]  # two episodes, left open: two servers
        assert [s.call("calculate", ADD).text for s in sessions] == ["5", "5"]
        ours = set(server_pids(stdio_server.toolset)) - others
        assert len(ours) == 2
    assert not [p for p in ours if psutil.pid_exists(p)], "stdio servers outlived MCPBackend.close()"


def test_rewriting_the_toolset_changes_tools_and_notifies(served):
    backend = served.backend
    since = asyncio.run(backend.watch_tools())
    try:
        shutil.copyfile(V1, served.toolset)
        assert asyncio.run(backend.wait_tools_changed(timeout=10, since=since)), "no tools/list_changed"
        assert backend.list_tools() == load_toolset(V1)["tools"]
        with backend.open_session() as session:  # v1 is lenient: a word for the operator is accepted
            assert session.call("calculator", {"a": 2, "b": 3, "op": "add"}).text == "5"
    finally:
        since = backend.tools_generation
        shutil.copyfile(V2, served.toolset)
        assert asyncio.run(backend.wait_tools_changed(timeout=10, since=since))
    assert backend.list_tools() == load_toolset(V2)["tools"]


def test_handshake_era_clients(served):
    """A client that forces the initialize handshake (as a 1.x-era host would): its connection may carry
    state, so each episode gets its own; stdio tells it of changes on that connection, stateless HTTP
    cannot (no listChanged in its capabilities) and says so."""
    with served.new_backend(timeout=5.0, mode="legacy") as backend:
        with backend.open_session() as session:
            assert not session.shared and session.call("calculate", ADD).text == "5"
        if served.transport == "http":
            with pytest.raises(ToolsChangedUnsupported):
                asyncio.run(backend.watch_tools())
            return
        since = asyncio.run(backend.watch_tools())
        try:
            shutil.copyfile(V1, served.toolset)
            assert asyncio.run(backend.wait_tools_changed(timeout=10, since=since))
            assert [t["function"]["name"] for t in backend.list_tools()] == ["calculator", "convert", "lookup"]
        finally:
            since = backend.tools_generation
            shutil.copyfile(V2, served.toolset)
            assert asyncio.run(backend.wait_tools_changed(timeout=10, since=since))
