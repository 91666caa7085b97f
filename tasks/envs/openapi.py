"""OpenAPI 3.x documents as toolsets (read through tasks.envs.toolset.load_toolset).

A document (a top-level "openapi" key) becomes one function tool per operation that has an operationId:
path, query and header parameters plus the properties of the application/json request body (local
`$ref`s resolved, `allOf` merged). The body's `required` list is taken as it stands even when the body
itself is optional; cookie parameters and non-JSON bodies are left out.
"""

from __future__ import annotations

from typing import Any

_OPENAPI_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")


def toolset_from_openapi(doc: dict, label: str) -> dict:
    """`{"version": info.version, "tools": [...]}` of an OpenAPI 3.x document; `label` names it in errors."""
    if not str(doc.get("openapi", "")).startswith("3"):
        raise ValueError(f"registry {label}: openapi version {doc.get('openapi')!r} is not supported; use OpenAPI 3.x")
    tools = []
    for item in (doc.get("paths") or {}).values():
        item = _resolve(item, doc, label)
        for method in _OPENAPI_METHODS:
            op = item.get(method)
            if isinstance(op, dict) and op.get("operationId"):
                tools.append(_operation_tool(op, item.get("parameters", []), doc, label))
    if not tools:
        raise ValueError(
            f"registry {label}: the OpenAPI document has no operations with an operationId; "
            f"each operation to offer as a tool needs one"
        )
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
    body_schema = _json_body_schema(body.get("content") or {})
    if body_schema is not None:
        body_schema = _merge_all_of(body_schema)
        if "properties" in body_schema:
            for key, sub in body_schema["properties"].items():
                if key in properties:
                    raise ValueError(
                        f"registry {label}: operation {name!r}: request body property {key!r} "
                        f"clashes with a parameter of the same name; rename one of them"
                    )
                properties[key] = sub
            required += [r for r in body_schema.get("required", []) if r not in required]
        else:  # a non-object body (array, string): offer it whole
            properties["body"] = body_schema
            if body.get("required"):
                required.append("body")
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": op.get("summary") or op.get("description") or "",
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


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
        out["required"] = out.get("required", []) + [
            r for r in sub.get("required", []) if r not in out.get("required", [])
        ]
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
        raise ValueError(
            f"registry {label}: $ref {ref!r} points outside the document; "
            f"bundle the OpenAPI document into one file first"
        )
    node: Any = doc
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            raise ValueError(f"registry {label}: $ref {ref!r} points nowhere")
        node = node[part]
    return node
