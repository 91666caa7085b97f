"""One trace line -> a validated row: length, UTF-8, JSON, the trace schema, a usable timestamp.

    from tasks.signals.rows import RowParser
    trace, row, reason = RowParser(max_line_bytes).parse(line)   # reason is None for a valid row

`row` is `(flat, tool_names, turns, success)`: `flat` the values in FLAT_COLUMNS order (what the GX
suites validate), the rest the drift features. The schema is include/schemas/trace.schema.json
(structure, types, RFC 3339 timestamps).
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any

from tasks.config import PROJECT_ROOT

SCHEMA_PATH = PROJECT_ROOT / "include" / "schemas" / "trace.schema.json"
FLAT_COLUMNS = (
    "trace_id",
    "workload",
    "ts",
    "prompt_tokens",
    "completion_tokens",
    "tool_errors",
    "tool_calls",
    "latency_ms",
    "reward",
    "n_user_messages",
)


class RowParser:
    """bytes -> (trace, flat row) or a reason. The schema is compiled once (jsonschema-rs, a Rust
    validator: the structural check is most of the per-row cost, and this one is ~10x the Python ones)."""

    def __init__(self, max_line_bytes: int) -> None:
        import jsonschema_rs
        import orjson

        self.max_line_bytes = max_line_bytes
        self._loads = orjson.loads
        self._json_error = orjson.JSONDecodeError
        self._schema = jsonschema_rs.validator_for(json.loads(SCHEMA_PATH.read_text()), validate_formats=True)

    def parse(self, line: bytes) -> tuple[dict | None, tuple | None, str | None]:
        if len(line) > self.max_line_bytes:
            return None, None, f"line of {len(line)} bytes exceeds ingest.max_line_bytes={self.max_line_bytes}"
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as e:
            return None, None, f"not valid UTF-8 (byte {e.start})"
        try:
            trace = self._loads(line)
        except self._json_error as e:
            return None, None, f"invalid JSON: {e}"
        if not isinstance(trace, dict):
            return None, None, f"not a JSON object (a {type(trace).__name__})"
        if not self._schema.is_valid(trace):  # the fast path; the message only for the rows that fail
            return None, None, "schema: " + "; ".join(_schema_errors(self._schema, trace))
        try:
            return trace, flatten(trace), None
        except (ValueError, TypeError, KeyError) as e:  # valid by the schema, yet unusable (e.g. an odd time)
            return None, None, f"unusable trace: {type(e).__name__}: {e}"


def _schema_errors(schema: Any, trace: dict, limit: int = 3) -> list[str]:
    out = []
    for e in schema.iter_errors(trace):
        where = "/".join(str(p) for p in e.instance_path) or "(root)"
        out.append(f"{where}: {e.message[:200]}")
        if len(out) == limit:
            break
    return out


_LEAP = re.compile(r"(T\d\d:\d\d:)60")


def rfc3339_seconds(text: str) -> float:
    """Epoch seconds of an RFC 3339 time: any case of T/Z; a leap second (:60) is the next second."""
    upper = text.upper()
    try:
        when = datetime.fromisoformat(upper)
        leap = 0
    except ValueError:
        if not _LEAP.search(upper):
            raise
        when, leap = datetime.fromisoformat(_LEAP.sub(r"\g<1>59", upper, count=1)), 1
    if when.tzinfo is None:
        raise ValueError(f"timestamp {text!r} has no time zone")
    return when.timestamp() + leap


def flatten(trace: dict) -> tuple:
    """The row GX validates (FLAT_COLUMNS order) plus drift features: (flat, tool_names, turns, success)."""
    outcome = trace["outcome"]
    turns = tool_calls = users = 0
    names: list[str] = []
    for m in trace["messages"]:
        role = m["role"]
        if role == "assistant":
            turns += 1
            for call in m.get("tool_calls") or ():
                tool_calls += 1
                names.append(call["function"]["name"])
        elif role == "user":
            users += 1
    ts = rfc3339_seconds(trace["timestamp"])
    flat = (
        trace["trace_id"],
        trace["workload"],
        ts,
        outcome["prompt_tokens"],
        outcome["completion_tokens"],
        outcome["tool_errors"],
        tool_calls,
        outcome.get("latency_ms"),
        outcome.get("reward"),
        users,
    )
    return flat, names, turns, bool(outcome["success"])
