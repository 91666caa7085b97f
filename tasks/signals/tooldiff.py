"""Tool diffing: did the tools the policy was trained on change under it?

    from tasks.envs.toolset import load_toolset, toolset_of_model
    from tasks.signals.tooldiff import diff_toolsets
    old = toolset_of_model("models/champion")          # <model_dir>/tool_registry.json
    new = load_toolset("s3://bucket/registry.yaml")    # any source the one loader reads
    d = diff_toolsets(old, new)
    if d.breaking: print(d.to_dict()["summary"])       # "5 breaking changes: tool renamed ..."

The diff compares the normalised tools of tasks.signals.toolset_hash (the schema-relevant parts the hash
counts); its old_hash and new_hash are those schema hashes.

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
    as in toolset v1 -> v2 (`a: integer` -> `x: string`).
Changes name what the *old* toolset (the trained model) knows: the old tool and parameter names,
except for additions. Nested parameters are written `opts.limit`; array items `tags[]`.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tasks.signals.toolset_hash import canonical_json, hash_tools, normalised_tools, schema_types

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


@dataclass
class Change:
    kind: str  # BREAKING or NON_BREAKING
    change: str  # one of the change classes above
    tool: str  # the old name, except for tool_added
    parameter: str | None  # "a", "opts.limit", "tags[]"; None for tool-level changes
    detail: str  # one human-readable line, tool included


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
        return {
            "old_hash": self.old_hash,
            "new_hash": self.new_hash,
            "breaking": self.breaking,
            "summary": self.summary,
            "counts": {
                BREAKING: sum(c.kind == BREAKING for c in self.changes),
                NON_BREAKING: sum(c.kind == NON_BREAKING for c in self.changes),
            },
            "changes": [asdict(c) for c in self.changes],
        }


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def diff_toolsets(old: dict | list | str | Path, new: dict | list | str | Path, env: str | None = None) -> ToolDiff:
    """Every schema change from `old` (what the model was trained on) to `new`; see the module docstring.
    A version string is one of `env`'s shipped toolsets."""
    old_tools, new_tools = normalised_tools(old, env), normalised_tools(new, env)
    removed = [t for n, t in old_tools.items() if n not in new_tools]
    added = [t for n, t in new_tools.items() if n not in old_tools]
    renamed = {o["name"]: (n, why) for o, n, why in _pair(removed, added, _TOOL_TIERS)}
    paired_new = {n["name"] for n, _ in renamed.values()}
    changes: list[Change] = []
    for name, tool in old_tools.items():  # report in the old toolset's order, additions last
        if name in new_tools:
            changes += _diff_tool(tool, new_tools[name])
        elif name in renamed:
            new_tool, why = renamed[name]
            changes.append(
                Change(BREAKING, TOOL_RENAMED, name, None, f"tool renamed {name} -> {new_tool['name']} ({why})")
            )
            changes += _diff_tool(tool, new_tool)
        else:
            changes.append(Change(BREAKING, TOOL_REMOVED, name, None, f"tool removed: {name}"))
    changes += [
        Change(NON_BREAKING, TOOL_ADDED, t["name"], None, f"tool added: {t['name']}")
        for t in added
        if t["name"] not in paired_new
    ]
    return ToolDiff(hash_tools(old_tools.values()), hash_tools(new_tools.values()), changes)


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
    match.update(
        _pair_leftovers([p for p in removed if p.name not in match], [p for p in added if p not in match.values()])
    )
    out = []
    for name, p in olds.items():
        path = prefix + name
        n = match.get(name)
        if n is None:
            out.append(
                Change(BREAKING, PARAMETER_REMOVED, tool, path, f"{tool}: {_req(p.required)} parameter removed: {path}")
            )
            continue
        if n.name != name:
            out.append(
                Change(
                    BREAKING, PARAMETER_RENAMED, tool, path, f"{tool}: parameter renamed {path} -> {prefix + n.name}"
                )
            )
        if p.required != n.required:
            kind, change = (
                (BREAKING, PARAMETER_MADE_REQUIRED) if n.required else (NON_BREAKING, PARAMETER_MADE_OPTIONAL)
            )
            out.append(Change(kind, change, tool, path, f"{tool}.{path}: made {_req(n.required)}"))
        out += _diff_schema(p.schema, n.schema, tool, path)
    for n in added:
        if n not in match.values():
            kind, change = (
                (BREAKING, REQUIRED_PARAMETER_ADDED) if n.required else (NON_BREAKING, OPTIONAL_PARAMETER_ADDED)
            )
            out.append(
                Change(
                    kind,
                    change,
                    tool,
                    prefix + n.name,
                    f"{tool}: {_req(n.required)} parameter added: {prefix + n.name}",
                )
            )
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
        out.append(
            Change(
                kind,
                TYPE_CHANGED,
                tool,
                path,
                f"{tool}.{path}: type changed {_show_types(old_t)} -> {_show_types(new_t)}"
                + (" (widened)" if kind == NON_BREAKING else ""),
            )
        )
    out += _diff_enum(old.get("enum"), new.get("enum"), tool, path)
    if old.get("description", "") != new.get("description", ""):
        out.append(Change(NON_BREAKING, DESCRIPTION_CHANGED, tool, path, f"{tool}.{path}: description changed"))
    if _may_be(old_t, "object") and _may_be(new_t, "object") and ("properties" in old or "properties" in new):
        out += _diff_object(old, new, tool, path + ".")
    if (
        _may_be(old_t, "array")
        and _may_be(new_t, "array")
        and isinstance(old.get("items", {}), dict)
        and isinstance(new.get("items", {}), dict)
        and ("items" in old or "items" in new)
    ):
        out += _diff_schema(old.get("items", {}), new.get("items", {}), tool, path + "[]")
    return out


def _diff_enum(old: list | None, new: list | None, tool: str, path: str) -> list[Change]:
    if old == new:
        return []
    if old is None:  # a free parameter now constrained to a list of values
        return [Change(BREAKING, ENUM_NARROWED, tool, path, f"{tool}.{path}: enum added {new}")]
    if new is None:
        return [Change(NON_BREAKING, ENUM_WIDENED, tool, path, f"{tool}.{path}: enum removed")]
    old_keys, new_keys = {canonical_json(v) for v in old}, {canonical_json(v) for v in new}
    out = []
    if gone := [v for v in old if canonical_json(v) not in new_keys]:
        out.append(Change(BREAKING, ENUM_NARROWED, tool, path, f"{tool}.{path}: enum values removed {gone}"))
    if extra := [v for v in new if canonical_json(v) not in old_keys]:
        out.append(Change(NON_BREAKING, ENUM_WIDENED, tool, path, f"{tool}.{path}: enum values added {extra}"))
    return out


def _types_or_any(schema: dict) -> tuple[str, ...] | None:
    return schema_types(schema) if schema.get("type") is not None else None  # None: any type


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
    ("same parameters", _tier_same_signature),
    ("same description", _tier_same_description),
    ("similar name or description", _tier_similar_tool),
]
_PARAM_TIERS: list[tuple[str, Callable]] = [
    ("same type and description", _tier_same_param_and_description),
    ("same type", _tier_same_param),
]


def _pair(removed: list, added: list, tiers: list[tuple[str, Callable]]) -> list[tuple[Any, Any, str]]:
    """One-to-one (old, new, reason) pairs: tier by tier, best score first within a tier (ties: old order)."""
    pairs: list[tuple[Any, Any, str]] = []
    used_old: set[int] = set()
    used_new: set[int] = set()
    for reason, score in tiers:
        candidates = [
            (s, i, j)
            for i, o in enumerate(removed)
            if i not in used_old
            for j, n in enumerate(added)
            if j not in used_new and (s := score(o, n)) is not None
        ]
        for _, i, j in sorted(candidates, key=lambda c: (c[0], -c[1], -c[2]), reverse=True):
            if i not in used_old and j not in used_new:
                used_old.add(i)
                used_new.add(j)
                pairs.append((removed[i], added[j], reason))
    return pairs


def _pair_leftovers(removed: list[_Param], added: list[_Param]) -> dict[str, _Param]:
    """Renamed-and-retyped parameters: pair in declaration order, but only when the leftovers line up
    one-to-one with matching required-ness; anything less clean stays a removal plus an addition."""
    if (
        not removed
        or len(removed) != len(added)
        or any(o.required != n.required for o, n in zip(removed, added, strict=True))
    ):
        return {}
    return {o.name: n for o, n in zip(removed, added, strict=True)}
