"""The schema hash of a toolset (a version of the tool registry): equal hashes = same schemas.

    from tasks.signals.toolset_hash import schema_hash
    schema_hash("2")                  # "sha256:..."; any source tasks.envs.toolset.load_toolset reads

Only the schema-relevant parts of a tool count (`normalise_tool`): name, description and the
parameters' type / enum / properties / required / items / description, nested. Implementation
bindings (`x-evergreen-handler`, any `x-*` key), the toolset's own `version` label and other
JSON-schema keywords (format, minimum, default, anyOf, ...) are ignored by the hash and by the diff
(tasks.signals.tooldiff), which compares the same normalised tools.

The hash tagged on a model version (tasks.promotion.step) and the drift monitor's (tasks.signals.monitor)
both come from here, over toolsets read by the one loader.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tasks.envs.toolset import check_tool, load_toolset


def normalise_tool(tool: dict) -> dict:
    """`{"name", "description", "parameters"}` with only the schema-relevant keys, sorted and deduplicated
    where order carries no meaning. Accepts OpenAI `{"type": "function", "function": {...}}` or flat tools."""
    name = check_tool(tool, "tool")
    fn = tool.get("function", tool)
    params = _normalise_schema(fn.get("parameters") or {})
    params.setdefault("type", "object")
    params.setdefault("properties", {})
    params.setdefault("required", [])  # absent and [] mean the same at the top level
    return {"name": name, "description": fn.get("description") or "", "parameters": params}


def _normalise_schema(schema: Any) -> dict:
    if not isinstance(schema, dict):  # boolean JSON schemas: treat as unconstrained
        return {}
    out: dict[str, Any] = {}
    if schema.get("type") is not None:
        types = schema_types(schema)
        out["type"] = types[0] if len(types) == 1 else list(types)
    if schema.get("description"):
        out["description"] = str(schema["description"])
    if isinstance(schema.get("enum"), list):
        out["enum"] = sorted({canonical_json(v): v for v in schema["enum"]}.values(), key=canonical_json)
    if isinstance(schema.get("properties"), dict):
        # declaration order is kept (rename pairing uses it); the canonical JSON sorts keys anyway
        out["properties"] = {k: _normalise_schema(v) for k, v in schema["properties"].items()}
    if schema.get("required"):
        out["required"] = sorted(set(schema["required"]))
    if isinstance(schema.get("items"), dict):
        out["items"] = _normalise_schema(schema["items"])
    elif isinstance(schema.get("items"), list):  # tuple validation: position matters, keep the order
        out["items"] = [_normalise_schema(s) for s in schema["items"]]
    return out


def schema_types(schema: dict) -> tuple[str, ...]:
    """The schema's `type` as a sorted tuple (a single type is a 1-tuple)."""
    t: Any = schema.get("type")
    return tuple(sorted(set(t))) if isinstance(t, list) else (t,)


def schema_hash(toolset: dict | list | str | Path, env: str | None = None) -> str:
    """ "sha256:<hex>" of the canonical JSON of the normalised tools, sorted by name. The toolset's
    `version` label is not part of it: two toolsets with the same schemas hash the same. A version string
    is one of `env`'s shipped toolsets."""
    return hash_tools(normalised_tools(toolset, env).values())


def hash_tools(tools: Iterable[dict]) -> str:
    """The schema hash of normalised tools (any order)."""
    ordered = sorted(tools, key=lambda t: t["name"])
    return "sha256:" + hashlib.sha256(canonical_json(ordered).encode()).hexdigest()


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def normalised_tools(toolset: Any, env: str | None = None) -> dict[str, dict]:
    """name -> normalised tool, in toolset order (validated: names present and unique)."""
    loaded = load_toolset(toolset, env)
    return {t["name"]: t for t in map(normalise_tool, loaded["tools"])}
