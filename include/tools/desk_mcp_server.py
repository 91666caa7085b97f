"""The desk tools as an MCP server (official `mcp` SDK, 2.x), over stdio or streamable HTTP.

    python include/tools/desk_mcp_server.py --toolset include/tools/registry_v2.json        # stdio
    python include/tools/desk_mcp_server.py --toolset include/tools/registry_v2.json \\
        --transport http --host 127.0.0.1 --port 8765                # at http://127.0.0.1:8765/mcp

tools/list serves the toolset's tools (inputSchema = the function's parameters; the desk handler in the
tool's `_meta` as {"evergreen/handler": ...} and the toolset version in the result's `_meta`, so a client
rebuilds the toolset exactly); tools/call runs DeskService, strict from toolset version 2; a refusal is a
CallToolResult with isError and the desk's message. The toolset file is polled (mtime, 0.5 s): when its
tools change the new ones are served and `notifications/tools/list_changed` goes out, on
`subscriptions/listen` streams (2026-07-28 clients, stdio or HTTP) and, on stdio, to a handshake-era
client's connection. The server keeps no per-episode state: HTTP runs the SDK's stateless mode
(`stateless_http=True`: no Mcp-Session-Id, a handshake-era client cannot get notifications there).

The lowlevel `Server` is used rather than MCPServer: MCPServer derives a tool's schema from a Python
signature, and here the schemas are data (the toolset file) that must reach the client unchanged.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

import anyio
import mcp_types as types
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.server.stdio import stdio_server
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: run as a plain script
from tasks.envs.base import ToolError
from tasks.envs.desk_service import DeskService, convention_of, tool_bindings
from tasks.envs.toolset import load_toolset

HANDLER_META = "evergreen/handler"  # a tool's x-evergreen-handler, carried in its _meta
VERSION_META = "evergreen/toolset_version"  # the toolset's version, in the tools/list result's _meta
POLL_S = 0.5
log = logging.getLogger("desk_mcp")


@dataclass(frozen=True)
class Served:
    """One toolset as served; replaced whole on reload, so a request sees one version throughout."""

    version: object
    tools: list[types.Tool]
    service: DeskService
    validators: dict[str, Draft202012Validator]
    digest: str


def load(path: Path) -> Served:
    toolset = load_toolset(path)
    tools = toolset["tools"]
    convention = convention_of(toolset, unnumbered="any")  # as desk's generate_tasks decides
    served = [
        types.Tool(
            name=t["function"]["name"],
            description=t["function"].get("description"),
            input_schema=t["function"].get("parameters") or {"type": "object", "properties": {}},
            _meta={HANDLER_META: t["x-evergreen-handler"]},
        )
        for t in tools
    ]
    validators = {t.name: Draft202012Validator(t.input_schema) for t in served}
    digest = hashlib.sha256(json.dumps([toolset["version"], tools], sort_keys=True).encode()).hexdigest()
    return Served(toolset["version"], served, DeskService(tool_bindings(tools), convention), validators, digest)


def refusal(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


class DeskMCP:
    def __init__(self, path: Path):
        self.path, self.served = path, load(path)
        self.stamp = self.bad_stamp = self._stamp()
        self.bus = InMemorySubscriptionBus()  # fan-out to subscriptions/listen streams (2026-07-28 clients)
        self.legacy_sessions: list = []  # handshake-era connections (stdio only), told directly
        self.server = Server(
            "evergreen-desk",
            version="1",
            on_list_tools=self.list_tools,
            on_call_tool=self.call_tool,
            on_subscriptions_listen=ListenHandler(self.bus),
        )

    async def list_tools(self, ctx, params) -> types.ListToolsResult:
        served = self.served
        return types.ListToolsResult(tools=served.tools, _meta={VERSION_META: served.version})

    async def call_tool(self, ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        served, name, args = self.served, params.name, params.arguments or {}
        if name not in served.validators:
            return refusal(f"unknown tool '{name}'; tools: {', '.join(t.name for t in served.tools)}")
        if (problem := best_match(served.validators[name].iter_errors(args))) is not None:
            return refusal(f"invalid arguments for {name}: {problem.message}")
        try:
            text = served.service(name, args)
        except ToolError as e:
            return refusal(str(e))
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)])

    async def track_legacy(self, ctx, params) -> None:
        self.legacy_sessions.append(ctx.session)

    def _stamp(self):
        try:
            st = self.path.stat()
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size, st.st_ino

    async def watch(self) -> None:
        """Poll the toolset file; serve a changed toolset and announce it. A file caught mid-write (or
        broken) keeps the old toolset until the file changes again."""
        while True:
            await anyio.sleep(POLL_S)
            stamp = self._stamp()
            if stamp is None or stamp in (self.stamp, self.bad_stamp):
                continue
            try:
                served = load(self.path)
            except Exception as e:  # said once per version of the file
                log.warning("toolset %s unreadable, keeping version %s: %s", self.path, self.served.version, e)
                self.bad_stamp = stamp
                continue
            self.stamp = stamp
            if served.digest == self.served.digest:
                continue
            self.served = served
            log.info("toolset %s: now version %s (%d tools)", self.path, served.version, len(served.tools))
            await self.bus.publish(ToolsListChanged())
            for session in list(self.legacy_sessions):
                try:
                    await session.send_tool_list_changed()
                except Exception:  # that client is gone
                    self.legacy_sessions.remove(session)

    async def run_stdio(self) -> None:
        # Handshake-era clients learn of changes on their connection, hence tools_changed in the
        # initialize result; the session is taken when the client confirms the handshake.
        self.server.add_notification_handler("notifications/initialized", types.NotificationParams, self.track_legacy)
        options = self.server.create_initialization_options(NotificationOptions(tools_changed=True))
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.watch)
            async with stdio_server() as (read, write):
                await self.server.run(read, write, options)
            tg.cancel_scope.cancel()  # stdin closed: the client is gone

    async def run_http(self, host: str, port: int) -> None:
        import uvicorn

        app = self.server.streamable_http_app(stateless_http=True, host=host)
        server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.watch)
            await server.serve()
            tg.cancel_scope.cancel()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--toolset", required=True, type=Path, help="a toolset file, e.g. include/tools/registry_v2.json")
    p.add_argument("--transport", choices=("stdio", "http"), default="stdio")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8765)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="desk_mcp: %(message)s")  # stdout is MCP's
    desk = DeskMCP(args.toolset)
    anyio.run(desk.run_stdio if args.transport == "stdio" else lambda: desk.run_http(args.host, args.port))


if __name__ == "__main__":
    main()
