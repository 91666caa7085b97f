"""An environment declared in a YAML file, no Python: `env.name: include/envs/desk_mcp.yaml`.

    name: desk_mcp
    base: desk                      # tasks, verifier and demonstrations of this environment (optional)
    tasks: data/tasks.jsonl         # or: a JSONL file of tasks (tasks.envs.base.Task as JSON), instead of base
    verifier: acme.verify:score     # optional with a base: module:function(episode) -> {"reward", ...}
    tools:
      kind: mcp                     # mcp (a command: stdio; a URL: streamable HTTP) | resources (NeMo Gym-style
                                    # HTTP server) | in_process (the base's own tools)
      server: ["{python}", "{root}/include/tools/desk_mcp_server.py", "--toolset", "{root}/include/tools/registry_v2.json"]
      servers: {"1": ..., "2": ...} # or one server per toolset version (a task's toolset picks it)
      timeout: 10                   # seconds per call

The episodes' calls go to the declared server; the verifier scores them as the base's would (desk's
grounding judges a call by its arguments, whoever answered it). Tasks generated without a toolset (the
base's own choice: desk's random schemas for the bootstrap) keep the base's own tools. A backend is
opened once per process at the first episode and closed at exit. Tasks from a file are split by a hash
of their task_id (tasks.envs.base.hash_split, the shares of base.SPLITS), so no eval task is trained on.
"""

from __future__ import annotations

import atexit
import importlib
import json
import random
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tasks.envs.base import hash_split

if TYPE_CHECKING:
    from typing import Self

    from tasks.envs import Environment
    from tasks.envs.backends import ToolBackend, ToolSession
    from tasks.envs.base import Task, Verifier

ROOT = Path(__file__).resolve().parents[2]
_backends: dict[str, ToolBackend] = {}


class ToolsSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["mcp", "resources", "in_process"] = Field(description="what serves the tools")
    server: str | list[str] | None = Field(None, description="URL, or command (argv) of a stdio MCP server")
    servers: dict[str, str | list[str]] | None = Field(None, description="one server per toolset version")
    timeout: float = Field(10.0, gt=0, description="seconds a call may take before it is a timeout fault")

    @model_validator(mode="after")
    def _one_server(self) -> Self:
        if self.kind != "in_process" and (self.server is None) == (self.servers is None):
            raise ValueError(f"tools.kind={self.kind} needs exactly one of tools.server or tools.servers")
        return self


class EnvSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="what the environment is called in logs and docs (env.name is the file)")
    base: str | None = Field(None, description="environment whose tasks, verifier and demonstrations are reused")
    tasks: str | None = Field(None, description="JSONL file of tasks (relative to the spec), instead of base")
    verifier: str | None = Field(None, description="module:function(episode) -> verdict; default: the base's")
    tools: ToolsSpec

    @model_validator(mode="after")
    def _complete(self) -> Self:
        if (self.base is None) == (self.tasks is None):
            raise ValueError("give exactly one of base (an environment) or tasks (a JSONL file of tasks)")
        if self.base is None and self.verifier is None:
            raise ValueError("a spec without base needs verifier: module:function")
        if self.base is None and self.tools.kind == "in_process":
            raise ValueError("tools.kind=in_process uses the base's own tools: give base, or an mcp/resources server")
        return self


def load_spec(path: str | Path) -> Environment:
    """The Environment a spec file declares; errors name the file and the field to fix."""
    from tasks.envs import Environment, get_env

    path = Path(path)
    try:
        spec = EnvSpec.model_validate(yaml.safe_load(path.read_text()) or {})
    except FileNotFoundError:
        raise FileNotFoundError(f"environment spec {path} does not exist: fix env.name") from None
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or '(top)'}: {err['msg']}" for err in e.errors())
        raise ValueError(f"environment spec {path}: {problems}") from None
    base = get_env(spec.base) if spec.base else None
    if spec.verifier:
        verify = _function(spec.verifier, path)
    else:
        assert base is not None  # EnvSpec._complete: a spec without base names a verifier
        verify = base.verify
    reference = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)  # what tasks carry as env

    def generate_tasks(
        n: int, seed: int, toolset: dict | None = None, split: str | None = None, **kw: Any
    ) -> list[Task]:
        if base is None:
            assert spec.tasks is not None  # EnvSpec._complete: base or tasks
            return _file_tasks(path.parent / spec.tasks, n, seed, split, reference)
        tasks = base.generate_tasks(n, seed, toolset, split=split, **kw)
        version = None if toolset is None else toolset.get("version")
        return [replace(t, env=reference, data={**t.data, "toolset": version}) for t in tasks]

    def open_session(task: Task) -> ToolSession:
        # tasks without a toolset are the base's own (desk's random schemas, for the bootstrap): no server has them
        if spec.tools.kind == "in_process" or (base is not None and task.data.get("toolset") is None):
            assert base is not None  # EnvSpec._complete: in_process has a base
            return base.open_session(task)
        return _backend(spec.tools, task.data.get("toolset")).open_session(task.to_dict())

    def task_from_trace(trace: dict, toolset: dict) -> Task | None:
        assert base is not None and base.task_from_trace is not None  # offered only then
        task = base.task_from_trace(trace, toolset)
        return (
            None
            if task is None
            else replace(task, env=reference, data={**task.data, "toolset": toolset.get("version")})
        )

    return Environment(
        reference,
        generate_tasks,
        open_session,
        verify,
        base.demonstration if base else None,
        base.toolset_dir if base else None,
        task_from_trace if base is not None and base.task_from_trace else None,
    )


def _function(ref: str, path: Path) -> Verifier:
    module, _, attr = ref.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise ImportError(f"environment spec {path}: verifier {ref!r} cannot load ({e})") from None


def _backend(tools: ToolsSpec, version: object) -> ToolBackend:
    """The process's one backend for this server (opened at the first episode, closed at exit)."""
    server = tools.server
    if tools.servers is not None:
        if str(version) not in tools.servers:
            raise KeyError(f"tools.servers has no server for toolset {version!r}: add one ({sorted(tools.servers)})")
        server = tools.servers[str(version)]
    assert server is not None  # ToolsSpec._one_server: server or servers
    if isinstance(server, list):
        server = [a.replace("{python}", sys.executable).replace("{root}", str(ROOT)) for a in server]
    key = json.dumps([tools.kind, server])
    if key not in _backends:
        if tools.kind == "mcp":
            from tasks.envs.mcp_backend import MCPBackend

            _backends[key] = MCPBackend(server, timeout=tools.timeout, connect_timeout=max(15.0, tools.timeout))
        else:
            from tasks.envs.http_backend import ResourcesServerBackend

            if not isinstance(server, str):
                raise ValueError(f"tools.kind={tools.kind} needs a URL as its server, not a command: {server!r}")
            _backends[key] = ResourcesServerBackend(server, timeout=tools.timeout)
        if len(_backends) == 1:
            atexit.register(close_backends)
    return _backends[key]


def close_backends() -> None:
    while _backends:
        _backends.popitem()[1].close()


def _file_tasks(path: Path, n: int, seed: int, split: str | None, reference: str) -> list[Task]:
    """`n` tasks of the file (drawn with replacement, deterministic in seed), from `split` only."""
    from tasks.envs.base import Task

    tasks = [Task.from_dict(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
    if split is not None:
        tasks = [t for t in tasks if split_of(t.task_id) == split]
    if not tasks:
        raise ValueError(f"task file {path} has no {split or ''} tasks")
    rng = random.Random(seed)
    return [replace(t, env=reference) for t in (rng.choice(tasks) for _ in range(n))]


def split_of(task_id: str) -> str:
    return hash_split(task_id)
