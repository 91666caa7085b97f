"""The one loader of toolsets: a toolset is a version of the tool registry, `{"version", "tools": [...]}`.

    from tasks.envs.toolset import load_toolset, toolset_of_model
    load_toolset("2")                              # a shipped version ("1", "2", "v2") of an environment
    load_toolset("s3://bucket/registry.yaml")      # or a dict, a bare list of tools, a local JSON/YAML file,
                                                   # an http(s):// URL, an OpenAPI 3 document
    load_toolset("mcp:http://127.0.0.1:8765/mcp")  # what an MCP server lists (tools/list), over HTTP
    load_toolset("mcp:python server.py")           # or over stdio (the command is started and stopped)
    toolset_of_model("models/champion")            # <model_dir>/tool_registry.json: what it was trained on

Every caller reads toolsets through `load_toolset`: task generation (Environment.load_toolset), training,
the stages, the model-version tag (tasks.promotion.step) and the drift monitor, so that the hash tagged
on a model version and the monitor's hash of the same toolset cannot disagree. What is environment-
specific is data the loader consults: where an environment's shipped versions live
(`Environment.toolset_dir`, e.g. include/tools/ for the embedded default).

Validation: the top level is a `{version, tools}` mapping (or an OpenAPI 3.x document, converted by
tasks.envs.openapi), every tool has a function name, names are unique, `parameters` is an object. A
mapping in that form is returned as it is (not copied).

File names on disk are kept from before the rename, because existing data depends on them: shipped
versions are `registry_v{N}.json`, and a model's toolset is saved beside its weights as
`tool_registry.json`.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path, PurePosixPath
from typing import Any

from tasks import storage

TOOLSET_FILENAME = "tool_registry.json"  # beside a model's weights: the toolset it was trained on (name kept)
SHIPPED_FILENAME = "registry_v{version}.json"  # a shipped version in an environment's toolset_dir (name kept)
MCP_PREFIX = "mcp:"  # a toolset listed by an MCP server: mcp:<URL> or mcp:<command line>
TOOLSET_SHAPE = "expected {version, tools:[...]} or an OpenAPI document"


def load_toolset(source: str | Path | dict | list, env: str | None = None) -> dict:
    """A validated toolset `{"version", "tools": [...]}` from a dict, a bare list of tools, a local
    JSON/YAML file, an s3:// object, an http(s):// URL (e.g. the tool service's /openapi.json), an OpenAPI
    3.x document, an MCP server (`mcp:<URL or command>`), or a shipped version ("1", "2", "v2") of the
    environment `env` (None: the default environment, EnvSettings.name's default)."""
    if isinstance(source, list):  # e.g. the `tools` offered in a production trace
        return _as_toolset({"version": None, "tools": source}, "(list of tools)")
    if isinstance(source, dict):
        return _as_toolset(source, "(in-memory document)")
    label = str(source)
    if label.startswith(MCP_PREFIX):
        return _as_toolset(mcp_toolset(label), label)
    if storage.is_s3(label) or storage.is_http(label) or Path(label).is_file():
        return _as_toolset(_parse(storage.read_bytes(label), label), label)
    if Path(label).is_dir():
        raise IsADirectoryError(
            f"registry {label}: is a directory; pass the registry file, or use toolset_of_model() for a model directory"
        )
    if not PurePosixPath(label).suffix and "/" not in label:
        version = shipped_version(label) or label
        path = shipped_toolset_path(version, env)
        if not path.is_file():
            raise FileNotFoundError(
                f"tool registry {path} not found: pass a registry JSON file or a shipped version (1, 2)"
            )
        return _as_toolset(_parse(path.read_bytes(), str(path)), f"shipped registry v{version}")
    raise FileNotFoundError(
        f"registry {label}: no such file; pass a JSON/YAML file, an s3:// URI, "
        f"an OpenAPI document or a shipped version (1, 2)"
    )


def toolset_label(source: str | Path, env: str | None = None) -> str:
    """A toolset's name in file and metric names: `v<N>` for a shipped version ("2", "v2"), else `ts-` and
    12 hex digits of its schema hash. A path, URL or MCP command never goes into a file name; the same
    tools give the same name whatever source they were read from."""
    if version := shipped_version(source):
        return f"v{version}"
    return _hashed_label(str(source), env)


def shipped_version(source: object) -> str | None:
    """ "2" for a shipped version written "2", "v2" or "V2"; None for any other source (a file, URL, server)."""
    text = str(source)
    bare = text[1:] if text[:1] in "vV" else text
    return bare if bare.isdigit() else None


@lru_cache(maxsize=256)
def _hashed_label(source: str, env: str | None) -> str:
    from tasks.signals.toolset_hash import schema_hash  # lazy: the signals import this module

    return "ts-" + schema_hash(source, env).split(":", 1)[1][:12]


def mcp_toolset(source: str) -> dict:
    """`{version, tools}` as an MCP server lists them: `mcp:http://host:port/mcp` (streamable HTTP) or
    `mcp:<command line>` (stdio: the server is started, asked, and stopped)."""
    import shlex

    from tasks.envs.mcp_backend import MCPBackend

    target = source[len(MCP_PREFIX) :].strip()
    if not target:
        raise ValueError(f"{source!r}: give a URL (mcp:http://127.0.0.1:8765/mcp) or a command after 'mcp:'")
    server = target if target.startswith(("http://", "https://")) else shlex.split(target)
    try:
        with MCPBackend(server) as backend:
            return backend.toolset()
    except ConnectionError as e:
        raise ConnectionError(f"MCP server {target}: cannot list its tools ({e})") from None


def shipped_toolset_path(version: str, env: str | None = None) -> Path:
    """Where the environment `env` (None: the default one) ships toolset `version`."""
    from tasks.config_sections import EnvSettings
    from tasks.envs import get_env  # lazy: tasks.envs imports this module

    environment = get_env(env or EnvSettings.model_fields["name"].default)
    if environment.toolset_dir is None:
        raise FileNotFoundError(
            f"environment {environment.name!r} ships no toolset versions: pass a toolset "
            f"file, URL or document instead of {version!r}"
        )
    return environment.toolset_dir / SHIPPED_FILENAME.format(version=version)


def toolset_of_model(model_dir: str | Path) -> dict:
    """The toolset a model was trained on, read from `<model_dir>/tool_registry.json`."""
    base = str(model_dir).rstrip("/")
    uri = f"{base}/{TOOLSET_FILENAME}" if storage.is_s3(base) else str(Path(base) / TOOLSET_FILENAME)
    if not storage.is_s3(uri) and not Path(uri).is_file():
        raise FileNotFoundError(_missing_model_toolset(uri))
    try:
        return load_toolset(uri)
    except FileNotFoundError as e:  # s3: the object is absent
        raise FileNotFoundError(f"{_missing_model_toolset(uri)} ({e})") from None


def _missing_model_toolset(uri: str) -> str:
    return (
        f"{uri} not found: the tool registry a model was trained on must be saved beside its weights "
        f"as {TOOLSET_FILENAME}; copy the training registry there when the model is saved, "
        f"or pass the registry to diff_toolsets() explicitly"
    )


def _parse(data: bytes, label: str) -> Any:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"registry {label}: not UTF-8 text ({e})") from None
    if not text.strip():
        raise ValueError(f"registry {label}: empty document; {TOOLSET_SHAPE}")
    suffix = PurePosixPath(label).suffix.lower()
    if suffix in (".yaml", ".yml"):
        return _parse_yaml(text, label)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        if suffix == ".json":
            raise ValueError(f"registry {label}: invalid JSON: {e}") from None
    return _parse_yaml(text, label)  # no telling suffix: YAML also covers JSON-ish documents


def _parse_yaml(text: str, label: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"registry {label}: invalid YAML/JSON: {e}") from None


def _as_toolset(doc: Any, label: str) -> dict:
    if not isinstance(doc, dict):
        raise ValueError(f"registry {label}: top level is a {type(doc).__name__}; {TOOLSET_SHAPE}")
    if "openapi" in doc:
        from tasks.envs.openapi import toolset_from_openapi

        doc = toolset_from_openapi(doc, label)
    elif "swagger" in doc:
        raise ValueError(f"registry {label}: Swagger 2.0 is not supported; convert it to OpenAPI 3 first")
    tools = doc.get("tools")
    if not isinstance(tools, list):
        raise ValueError(f"registry {label}: no 'tools' list; {TOOLSET_SHAPE}")
    seen: dict[str, int] = {}
    for i, tool in enumerate(tools):
        name = check_tool(tool, f"registry {label}: tools[{i}]")
        if name in seen:
            raise ValueError(
                f"registry {label}: tool name {name!r} appears twice (tools[{seen[name]}] and "
                f"tools[{i}]); tool names must be unique"
            )
        seen[name] = i
    return doc


def check_tool(tool: Any, where: str) -> str:
    """The tool's function name; raises ValueError (naming `where`) for a tool without one or whose
    `parameters` is not an object. Accepts OpenAI `{"type": "function", "function": {...}}` or flat tools."""
    fn = tool.get("function", tool) if isinstance(tool, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise ValueError(
            f"{where} has no function name; expected "
            f"{{'type': 'function', 'function': {{'name': ..., 'parameters': {{...}}}}}}"
        )
    if not isinstance(fn.get("parameters", {}), dict):
        raise ValueError(f"{where} ({fn['name']!r}): 'parameters' must be a JSON schema object")
    if fn.get("description") is not None and not isinstance(fn["description"], str):  # found by a hypothesis test
        raise ValueError(
            f"{where} ({fn['name']!r}): 'description' must be text, not {type(fn['description']).__name__}"
        )
    import jsonschema_rs

    try:  # a tool server may list anything: a schema the episode's argument check cannot apply is refused here
        jsonschema_rs.meta.validate(_unique_required(fn.get("parameters", {})))
    except jsonschema_rs.ValidationError as e:
        first = str(e).splitlines()[0]
        raise ValueError(f"{where} ({fn['name']!r}): 'parameters' is not a valid JSON Schema: {first}") from None
    return fn["name"]


def _unique_required(schema: Any) -> Any:
    """The schema with each `required` list deduplicated: a repeated name is sloppy, not ambiguous, and the
    normalised tool (tasks.signals.toolset_hash) drops the repeat anyway."""
    if isinstance(schema, dict):
        return {
            k: list(dict.fromkeys(v))
            if k == "required" and isinstance(v, list) and all(isinstance(x, str) for x in v)
            else _unique_required(v)
            for k, v in schema.items()
        }
    if isinstance(schema, list):
        return [_unique_required(v) for v in schema]
    return schema
