"""Tool-registry hashing and diffing: did the tools the policy was trained on change under it?

    from tasks.signals import tools
    old = tools.registry_of_model("models/champion")        # <model_dir>/tool_registry.json
    new = tools.load_registry("s3://bucket/registry.yaml")  # or a dict, a local JSON/YAML file, an
                                                            # OpenAPI 3 document, or a shipped "1" / "2"
    tools.schema_hash(new)                                  # "sha256:..."; equal hashes = same schemas
    d = tools.diff_registries(old, new)
    if d.breaking: print(d.to_dict()["summary"])            # "5 breaking changes: tool renamed ..."

Only the schema-relevant parts of a tool count (`normalise_tool`): name, description and the
parameters' type / enum / properties / required / items / description, nested. Implementation
bindings (`x-evergreen-handler`, any `x-*` key), the registry's own `version` label and other
JSON-schema keywords (format, minimum, default, anyOf, ...) are ignored by both the hash and the diff.

Breaking means "a call the trained model would make under the old schema may now fail or mean
something else". The model is the *caller*, so:
  * removing a parameter is breaking even when it was optional: the model keeps sending it, and a
    strict server rejects it (or silently drops what the model meant to say);
  * widening a type is not breaking: integer -> number, a type that gains alternatives
    ("string" -> ["string", "null"]) or loses its type constraint all accept every old value.
    Such a change is still reported as `type_changed`, with kind non_breaking.

Renames are matched heuristically, one-to-one, so that a rename reads as one change rather than a
removal plus an addition (both are breaking either way; only the report differs):
  * tools: same parameter signature (names, types, required), else the same description, else a
    similar name or description (difflib ratio >= 0.5, best pairs first);
  * parameters within a tool: same type and required-ness (same description first, then the most
    similar name); parameters still unmatched after that are paired in declaration order when both
    sides have the same number left and each pair agrees on required-ness - a rename plus a retype,
    as in registry v1 -> v2 (`a: integer` -> `x: string`).
Changes name what the *old* registry (the trained model) knows: the old tool and parameter names,
except for additions. Nested parameters are written `opts.limit`; array items `tags[]`.

OpenAPI 3.x documents (a top-level "openapi" key) become one function tool per operation that has an
operationId: path, query and header parameters plus the properties of the application/json request
body (local `$ref`s resolved, `allOf` merged). The body's `required` list is taken as it stands even
when the body itself is optional; cookie parameters and non-JSON bodies are left out.
"""
from __future__ import annotations

import difflib
import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Callable

from tasks import storage

REGISTRY_FILENAME = "tool_registry.json"  # stored beside a model's weights: the registry it was trained on

BREAKING, NON_BREAKING = "breaking", "non_breaking"
# change classes (Change.change)
TOOL_REMOVED, TOOL_RENAMED, TOOL_ADDED = "tool_removed", "tool_renamed", "tool_added"
REQUIRED_PARAMETER_ADDED, OPTIONAL_PARAMETER_ADDED = "required_parameter_added", "optional_parameter_added"
PARAMETER_REMOVED, PARAMETER_RENAMED = "parameter_removed", "parameter_renamed"
TYPE_CHANGED, DESCRIPTION_CHANGED = "type_changed", "description_changed"
ENUM_NARROWED, ENUM_WIDENED = "enum_narrowed", "enum_widened"
PARAMETER_MADE_REQUIRED, PARAMETER_MADE_OPTIONAL = "parameter_made_required", "parameter_made_optional"

FUZZY_RENAME_THRESHOLD = 0.5  # v1 -> v2 true pairs score 0.62-0.84, the wrong pairings at most 0.40
_SUMMARY_ITEMS = 5
_OPENAPI_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
_REGISTRY_SHAPE = "expected {version, tools:[...]} or an OpenAPI document"


# ---------------------------------------------------------------- loading

def load_registry(source: str | Path | dict | list) -> dict:
    """A validated registry `{"version", "tools": [...]}` from a dict, a bare list of tools, a local
    JSON/YAML file, an s3:// object, an http(s):// URL (e.g. the tool service's /openapi.json), an OpenAPI
    3.x document, or a shipped version ("1", "2", "v2")."""
    if isinstance(source, list):  # e.g. the `tools` offered in a production trace
        return _as_registry({"version": None, "tools": source}, "(list of tools)")
    if isinstance(source, dict):
        return _as_registry(source, "(in-memory document)")
    label = str(source)
    if storage.is_s3(label) or storage.is_http(label) or Path(label).is_file():
        return _as_registry(_parse(storage.read_bytes(label), label), label)
    if Path(label).is_dir():
        raise IsADirectoryError(f"registry {label}: is a directory; pass the registry file, "
                                f"or use registry_of_model() for a model directory")
    if not PurePosixPath(label).suffix and "/" not in label:
        from tasks.envs.desk import load_registry as load_shipped  # lazy: no work at import time

        version = label[1:] if label[:1] in "vV" and label[1:].isdigit() else label
        return _as_registry(load_shipped(version), f"shipped registry v{version}")
    raise FileNotFoundError(f"registry {label}: no such file; pass a JSON/YAML file, an s3:// URI, "
                            f"an OpenAPI document or a shipped version (1, 2)")


def registry_of_model(model_dir: str | Path) -> dict:
    """The registry a model was trained on, read from `<model_dir>/tool_registry.json`."""
    base = str(model_dir).rstrip("/")
    uri = f"{base}/{REGISTRY_FILENAME}" if storage.is_s3(base) else str(Path(base) / REGISTRY_FILENAME)
    if not storage.is_s3(uri) and not Path(uri).is_file():
        raise FileNotFoundError(_missing_model_registry(uri))
    try:
        return load_registry(uri)
    except FileNotFoundError as e:  # s3: the object is absent
        raise FileNotFoundError(f"{_missing_model_registry(uri)} ({e})") from None


def _missing_model_registry(uri: str) -> str:
    return (f"{uri} not found: the tool registry a model was trained on must be saved beside its weights "
            f"as {REGISTRY_FILENAME}; copy the training registry there when the model is saved, "
            f"or pass the registry to diff_registries() explicitly")


def _parse(data: bytes, label: str) -> Any:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"registry {label}: not UTF-8 text ({e})") from None
    if not text.strip():
        raise ValueError(f"registry {label}: empty document; {_REGISTRY_SHAPE}")
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


def _as_registry(doc: Any, label: str) -> dict:
    if not isinstance(doc, dict):
        raise ValueError(f"registry {label}: top level is a {type(doc).__name__}; {_REGISTRY_SHAPE}")
    if "openapi" in doc:
        doc = _from_openapi(doc, label)
    elif "swagger" in doc:
        raise ValueError(f"registry {label}: Swagger 2.0 is not supported; convert it to OpenAPI 3 first")
    tools = doc.get("tools")
    if not isinstance(tools, list):
        raise ValueError(f"registry {label}: no 'tools' list; {_REGISTRY_SHAPE}")
    seen: dict[str, int] = {}
    for i, tool in enumerate(tools):
        name = _check_tool(tool, f"registry {label}: tools[{i}]")
        if name in seen:
            raise ValueError(f"registry {label}: tool name {name!r} appears twice (tools[{seen[name]}] and "
                             f"tools[{i}]); tool names must be unique")
        seen[name] = i
    return doc


def _check_tool(tool: Any, where: str) -> str:
    fn = tool.get("function", tool) if isinstance(tool, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise ValueError(f"{where} has no function name; expected "
                         f"{{'type': 'function', 'function': {{'name': ..., 'parameters': {{...}}}}}}")
    if not isinstance(fn.get("parameters", {}), dict):
        raise ValueError(f"{where} ({fn['name']!r}): 'parameters' must be a JSON schema object")
    return fn["name"]


# ---------------------------------------------------------------- OpenAPI 3.x

def _from_openapi(doc: dict, label: str) -> dict:
    if not str(doc.get("openapi", "")).startswith("3"):
        raise ValueError(f"registry {label}: openapi version {doc.get('openapi')!r} is not supported; use OpenAPI 3.x")
    tools = []
    for path, item in (doc.get("paths") or {}).items():
        item = _resolve(item, doc, label)
        for method in _OPENAPI_METHODS:
            op = item.get(method)
            if isinstance(op, dict) and op.get("operationId"):
                tools.append(_operation_tool(op, item.get("parameters", []), doc, label))
    if not tools:
        raise ValueError(f"registry {label}: the OpenAPI document has no operations with an operationId; "
                         f"each operation to offer as a tool needs one")
    return {"version": (doc.get("info") or {}).get("version"), "tools": tools}


def _operation_tool(op: dict, path_params: list, doc: dict, label: str) -> dict:
    name = op["operationId"]
    # operation-level parameters override path-level ones with the same (name, in)
    params = {(p.get("name"), p.get("in")): p for p in _resolve(path_params + op.get("parameters", []), doc, label)}
    properties, required = {}, []
    for (pname, where), p in params.items():
        if where == "cookie":
            continue
        schema = dict(p.get("schema") or _first_media_schema(p.get("content")) or {})
        if p.get("description") and "description" not in schema:
            schema["description"] = p["description"]
        properties[pname] = schema
        if p.get("required") or where == "path":  # path parameters are always required
            required.append(pname)
    body = _resolve(op.get("requestBody") or {}, doc, label)
    schema = _json_body_schema(body.get("content") or {})
    if schema is not None:
        schema = _merge_all_of(schema)
        if "properties" in schema:
            for key, sub in schema["properties"].items():
                if key in properties:
                    raise ValueError(f"registry {label}: operation {name!r}: request body property {key!r} "
                                     f"clashes with a parameter of the same name; rename one of them")
                properties[key] = sub
            required += [r for r in schema.get("required", []) if r not in required]
        else:  # a non-object body (array, string): offer it whole
            properties["body"] = schema
            if body.get("required"):
                required.append("body")
    return {"type": "function", "function": {
        "name": name, "description": op.get("summary") or op.get("description") or "",
        "parameters": {"type": "object", "properties": properties, "required": required}}}


def _json_body_schema(content: dict) -> dict | None:
    for media, spec in content.items():
        if media.split(";")[0].strip() == "application/json" or media.endswith("+json"):
            return (spec or {}).get("schema") or {}
    return None


def _first_media_schema(content: dict | None) -> dict | None:
    return next((spec.get("schema") for spec in (content or {}).values() if isinstance(spec, dict)), None)


def _merge_all_of(schema: dict) -> dict:
    """`allOf: [Base, {extra}]` -> one object schema (the common way to extend a body schema)."""
    if "allOf" not in schema:
        return schema
    out = {k: v for k, v in schema.items() if k != "allOf"}
    for sub in schema["allOf"]:
        sub = _merge_all_of(sub)
        if "type" not in out and sub.get("type"):
            out["type"] = sub["type"]
        out.setdefault("properties", {}).update(sub.get("properties", {}))
        out["required"] = out.get("required", []) + [r for r in sub.get("required", []) if r not in out.get("required", [])]
    return out


def _resolve(node: Any, doc: dict, label: str, stack: tuple[str, ...] = ()) -> Any:
    """A copy of `node` with local `$ref`s replaced by their targets, recursively."""
    if isinstance(node, list):
        return [_resolve(v, doc, label, stack) for v in node]
    if not isinstance(node, dict):
        return node
    if isinstance(node.get("$ref"), str):
        ref = node["$ref"]
        target = _pointer(doc, ref, label)
        siblings = {k: v for k, v in node.items() if k != "$ref"}  # OpenAPI 3.1 allows e.g. a description
        if ref in stack:  # a recursive schema (tree, linked list): stop with a stub of the right type
            return {"type": target.get("type", "object"), **siblings} if isinstance(target, dict) else siblings
        resolved = _resolve(target, doc, label, stack + (ref,))
        return {**resolved, **_resolve(siblings, doc, label, stack)} if isinstance(resolved, dict) else resolved
    return {k: _resolve(v, doc, label, stack) for k, v in node.items()}


def _pointer(doc: dict, ref: str, label: str) -> Any:
    if not ref.startswith("#/"):
        raise ValueError(f"registry {label}: $ref {ref!r} points outside the document; "
                         f"bundle the OpenAPI document into one file first")
    node: Any = doc
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            raise ValueError(f"registry {label}: $ref {ref!r} points nowhere")
        node = node[part]
    return node


# ---------------------------------------------------------------- canonical form and hash

def normalise_tool(tool: dict) -> dict:
    """`{"name", "description", "parameters"}` with only the schema-relevant keys, sorted and deduplicated
    where order carries no meaning. Accepts OpenAI `{"type": "function", "function": {...}}` or flat tools."""
    name = _check_tool(tool, "tool")
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
        types = _types(schema)
        out["type"] = types[0] if len(types) == 1 else list(types)
    if schema.get("description"):
        out["description"] = str(schema["description"])
    if isinstance(schema.get("enum"), list):
        out["enum"] = sorted({_canon(v): v for v in schema["enum"]}.values(), key=_canon)
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


def schema_hash(registry: dict | list | str | Path) -> str:
    """"sha256:<hex>" of the canonical JSON of the normalised tools, sorted by name. The registry's
    `version` label is not part of it: two registries with the same schemas hash the same."""
    return _hash_tools(_normalised_tools(registry).values())


def _hash_tools(tools) -> str:
    ordered = sorted(tools, key=lambda t: t["name"])
    return "sha256:" + hashlib.sha256(_canon(ordered).encode()).hexdigest()


def _canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _normalised_tools(registry: Any) -> dict[str, dict]:
    """name -> normalised tool, in registry order (validated: names present and unique)."""
    reg = load_registry(registry)
    return {t["name"]: t for t in map(normalise_tool, reg["tools"])}


# ---------------------------------------------------------------- diff

@dataclass
class Change:
    kind: str                # BREAKING or NON_BREAKING
    change: str              # one of the change classes above
    tool: str                # the old name, except for tool_added
    parameter: str | None    # "a", "opts.limit", "tags[]"; None for tool-level changes
    detail: str              # one human-readable line, tool included


@dataclass
class ToolDiff:
    old_hash: str
    new_hash: str
    changes: list[Change] = field(default_factory=list)

    @property
    def breaking(self) -> bool:
        return any(c.kind == BREAKING for c in self.changes)

    @property
    def summary(self) -> str:
        brk = [c.detail for c in self.changes if c.kind == BREAKING]
        rest = [c.detail for c in self.changes if c.kind == NON_BREAKING]
        if not self.changes:
            return "no changes"
        lead, details = (brk, "breaking") if brk else (rest, "non-breaking")
        text = f"{_plural(len(lead), details + ' change')}: " + "; ".join(lead[:_SUMMARY_ITEMS])
        if len(lead) > _SUMMARY_ITEMS:
            text += f"; and {len(lead) - _SUMMARY_ITEMS} more"
        return text + (f" (+{len(rest)} non-breaking)" if brk and rest else "")

    def to_dict(self) -> dict:
        return {"old_hash": self.old_hash, "new_hash": self.new_hash, "breaking": self.breaking,
                "summary": self.summary,
                "counts": {BREAKING: sum(c.kind == BREAKING for c in self.changes),
                           NON_BREAKING: sum(c.kind == NON_BREAKING for c in self.changes)},
                "changes": [asdict(c) for c in self.changes]}


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def diff_registries(old: dict | list | str | Path, new: dict | list | str | Path) -> ToolDiff:
    """Every schema change from `old` (what the model was trained on) to `new`; see the module docstring."""
    old_tools, new_tools = _normalised_tools(old), _normalised_tools(new)
    removed = [t for n, t in old_tools.items() if n not in new_tools]
    added = [t for n, t in new_tools.items() if n not in old_tools]
    renamed = {o["name"]: (n, why) for o, n, why in _pair(removed, added, _TOOL_TIERS)}
    paired_new = {n["name"] for n, _ in renamed.values()}
    changes: list[Change] = []
    for name, tool in old_tools.items():  # report in the old registry's order, additions last
        if name in new_tools:
            changes += _diff_tool(tool, new_tools[name])
        elif name in renamed:
            new_tool, why = renamed[name]
            changes.append(Change(BREAKING, TOOL_RENAMED, name, None,
                                  f"tool renamed {name} -> {new_tool['name']} ({why})"))
            changes += _diff_tool(tool, new_tool)
        else:
            changes.append(Change(BREAKING, TOOL_REMOVED, name, None, f"tool removed: {name}"))
    changes += [Change(NON_BREAKING, TOOL_ADDED, t["name"], None, f"tool added: {t['name']}")
                for t in added if t["name"] not in paired_new]
    return ToolDiff(_hash_tools(old_tools.values()), _hash_tools(new_tools.values()), changes)


def _diff_tool(old: dict, new: dict) -> list[Change]:
    tool = old["name"]
    out = []
    if old["description"] != new["description"]:
        out.append(Change(NON_BREAKING, DESCRIPTION_CHANGED, tool, None, f"{tool}: description changed"))
    return out + _diff_object(old["parameters"], new["parameters"], tool, "")


def _diff_object(old: dict, new: dict, tool: str, prefix: str) -> list[Change]:
    """Property-level changes of an object schema (the tool's parameters, or a nested object)."""
    olds, news = _params(old), _params(new)
    removed = [p for name, p in olds.items() if name not in news]
    added = [p for name, p in news.items() if name not in olds]
    match = {name: news[name] for name in olds if name in news}  # old name -> surviving new parameter
    match.update({o.name: n for o, n, _ in _pair(removed, added, _PARAM_TIERS)})
    match.update(_pair_leftovers([p for p in removed if p.name not in match],
                                 [p for p in added if p not in match.values()]))
    out = []
    for name, p in olds.items():
        path = prefix + name
        n = match.get(name)
        if n is None:
            out.append(Change(BREAKING, PARAMETER_REMOVED, tool, path,
                              f"{tool}: {_req(p.required)} parameter removed: {path}"))
            continue
        if n.name != name:
            out.append(Change(BREAKING, PARAMETER_RENAMED, tool, path,
                              f"{tool}: parameter renamed {path} -> {prefix + n.name}"))
        if p.required != n.required:
            kind, change = (BREAKING, PARAMETER_MADE_REQUIRED) if n.required else (NON_BREAKING, PARAMETER_MADE_OPTIONAL)
            out.append(Change(kind, change, tool, path, f"{tool}.{path}: made {_req(n.required)}"))
        out += _diff_schema(p.schema, n.schema, tool, path)
    for n in added:
        if n not in match.values():
            kind, change = (BREAKING, REQUIRED_PARAMETER_ADDED) if n.required else (NON_BREAKING, OPTIONAL_PARAMETER_ADDED)
            out.append(Change(kind, change, tool, prefix + n.name,
                              f"{tool}: {_req(n.required)} parameter added: {prefix + n.name}"))
    return out


def _params(schema: dict) -> dict[str, _Param]:
    required = set(schema.get("required", []))
    return {k: _Param(k, s, k in required, i) for i, (k, s) in enumerate(schema.get("properties", {}).items())}


def _req(required: bool) -> str:
    return "required" if required else "optional"


def _diff_schema(old: dict, new: dict, tool: str, path: str) -> list[Change]:
    """Changes of one parameter's schema: type, enum, description, then nested properties and items."""
    out = []
    old_t, new_t = _types_or_any(old), _types_or_any(new)
    if old_t != new_t:
        kind = NON_BREAKING if _widens(old_t, new_t) else BREAKING
        out.append(Change(kind, TYPE_CHANGED, tool, path,
                          f"{tool}.{path}: type changed {_show_types(old_t)} -> {_show_types(new_t)}"
                          + (" (widened)" if kind == NON_BREAKING else "")))
    out += _diff_enum(old.get("enum"), new.get("enum"), tool, path)
    if old.get("description", "") != new.get("description", ""):
        out.append(Change(NON_BREAKING, DESCRIPTION_CHANGED, tool, path, f"{tool}.{path}: description changed"))
    if _may_be(old_t, "object") and _may_be(new_t, "object") and ("properties" in old or "properties" in new):
        out += _diff_object(old, new, tool, path + ".")
    if _may_be(old_t, "array") and _may_be(new_t, "array") and isinstance(old.get("items", {}), dict) \
            and isinstance(new.get("items", {}), dict) and ("items" in old or "items" in new):
        out += _diff_schema(old.get("items", {}), new.get("items", {}), tool, path + "[]")
    return out


def _diff_enum(old: list | None, new: list | None, tool: str, path: str) -> list[Change]:
    if old == new:
        return []
    if old is None:  # a free parameter now constrained to a list of values
        return [Change(BREAKING, ENUM_NARROWED, tool, path, f"{tool}.{path}: enum added {new}")]
    if new is None:
        return [Change(NON_BREAKING, ENUM_WIDENED, tool, path, f"{tool}.{path}: enum removed")]
    old_keys, new_keys = {_canon(v) for v in old}, {_canon(v) for v in new}
    out = []
    if gone := [v for v in old if _canon(v) not in new_keys]:
        out.append(Change(BREAKING, ENUM_NARROWED, tool, path, f"{tool}.{path}: enum values removed {gone}"))
    if extra := [v for v in new if _canon(v) not in old_keys]:
        out.append(Change(NON_BREAKING, ENUM_WIDENED, tool, path, f"{tool}.{path}: enum values added {extra}"))
    return out


def _types(schema: dict) -> tuple[str, ...]:
    t = schema.get("type")
    return tuple(sorted(set(t))) if isinstance(t, list) else (t,)


def _types_or_any(schema: dict) -> tuple[str, ...] | None:
    return _types(schema) if schema.get("type") is not None else None  # None: any type


def _widens(old: tuple[str, ...] | None, new: tuple[str, ...] | None) -> bool:
    """True when every value valid under `old` types is valid under `new` (integer is a number)."""
    if new is None:
        return True
    if old is None:
        return False
    return all(t in new or (t == "integer" and "number" in new) for t in old)


def _may_be(types: tuple[str, ...] | None, name: str) -> bool:
    return types is None or name in types


def _show_types(types: tuple[str, ...] | None) -> str:
    return "any" if types is None else "|".join(types)


# ---------------------------------------------------------------- rename pairing

@dataclass(eq=False)
class _Param:
    name: str
    schema: dict
    required: bool
    position: int


def _similar(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a, b).ratio() if a and b else 0.0


def _signature(tool: dict) -> dict:
    params = tool["parameters"]
    return {k: (_types_or_any(s), k in params["required"]) for k, s in params["properties"].items()}


def _tier_same_signature(o: dict, n: dict) -> float | None:
    # an empty signature is no evidence: any two parameterless tools would match
    return _similar(o["name"], n["name"]) if _signature(o) and _signature(o) == _signature(n) else None


def _tier_same_description(o: dict, n: dict) -> float | None:
    return _similar(o["name"], n["name"]) if o["description"] and o["description"] == n["description"] else None


def _tier_similar_tool(o: dict, n: dict) -> float | None:
    score = max(_similar(o["name"], n["name"]), _similar(o["description"], n["description"]))
    return score if score >= FUZZY_RENAME_THRESHOLD else None


def _tier_same_param_and_description(o: _Param, n: _Param) -> tuple | None:
    desc = o.schema.get("description")
    return _tier_same_param(o, n) if desc and desc == n.schema.get("description") else None


def _tier_same_param(o: _Param, n: _Param) -> tuple | None:
    if o.required != n.required or _types_or_any(o.schema) != _types_or_any(n.schema):
        return None
    # among equals: a clearly similar name first (filter -> filters), then the nearest position, since
    # wholesale renames (from_unit, to_unit -> source, target) usually keep the order
    similar = _similar(o.name, n.name)
    return similar >= 0.6, -abs(o.position - n.position), similar


_TOOL_TIERS: list[tuple[str, Callable]] = [
    ("same parameters", _tier_same_signature), ("same description", _tier_same_description),
    ("similar name or description", _tier_similar_tool)]
_PARAM_TIERS: list[tuple[str, Callable]] = [
    ("same type and description", _tier_same_param_and_description), ("same type", _tier_same_param)]


def _pair(removed: list, added: list, tiers: list[tuple[str, Callable]]) -> list[tuple[Any, Any, str]]:
    """One-to-one (old, new, reason) pairs: tier by tier, best score first within a tier (ties: old order)."""
    pairs: list[tuple[Any, Any, str]] = []
    used_old: set[int] = set()
    used_new: set[int] = set()
    for reason, score in tiers:
        candidates = [(s, i, j) for i, o in enumerate(removed) if i not in used_old
                      for j, n in enumerate(added) if j not in used_new and (s := score(o, n)) is not None]
        for _, i, j in sorted(candidates, key=lambda c: (c[0], -c[1], -c[2]), reverse=True):
            if i not in used_old and j not in used_new:
                used_old.add(i)
                used_new.add(j)
                pairs.append((removed[i], added[j], reason))
    return pairs


def _pair_leftovers(removed: list[_Param], added: list[_Param]) -> dict[str, _Param]:
    """Renamed-and-retyped parameters: pair in declaration order, but only when the leftovers line up
    one-to-one with matching required-ness; anything less clean stays a removal plus an addition."""
    if not removed or len(removed) != len(added) or any(o.required != n.required for o, n in zip(removed, added)):
        return {}
    return {o.name: n for o, n in zip(removed, added)}
