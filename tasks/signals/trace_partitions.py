"""Foreign traces as trace-contract rows: value coercion, OpenAI message / tool normalisation, and the
partition writer the exporters of tasks.signals.trace_sources and tasks.signals.otel_traces share.

    parts = Partitions(out_dir, "mlflow", "mlflow:agent-prod")
    parts.mapped(to_row, trace, trace_id, timestamp)     # a trace whose mapping raises is still written
    summary = parts.close()                              # {"traces", "written", "unmappable", "incomplete", ...}

Values are never invented: what cannot be read is left out (or kept as it came, when it is malformed),
so that the schema check of ingest (tasks.signals.rows) quarantines the row with the field's name.
Tested through tests/unit/signals/test_trace_sources.py.
"""

from __future__ import annotations

import gzip
import json
import math
import os
from collections import Counter
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

_TRUE = {"true", "1", "yes", "y", "pass", "passed", "success", "succeeded"}
_FALSE = {"false", "0", "no", "n", "fail", "failed", "failure"}


def iso_ms(epoch_ms: float) -> str:
    return datetime.fromtimestamp(epoch_ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def as_bool(v: Any) -> Any:
    """True/False from the usual spellings; anything else comes back as it is, for the schema check to name."""
    if isinstance(v, str) and v.strip().lower() in _TRUE | _FALSE:
        return v.strip().lower() in _TRUE
    if isinstance(v, (int, float)) and not isinstance(v, bool) and v in (0, 1):
        return bool(v)
    return v


def as_number(v: Any, integer: bool = False) -> Any:
    """A number from a number or a numeric string; anything else unchanged (the schema check quarantines it)."""
    if isinstance(v, str):
        try:
            v = float(v)
        except ValueError:
            return v
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return int(v) if integer and float(v).is_integer() else v
    return v


def first(values: Iterable[Any]) -> Any:
    return next((v for v in values if v not in (None, "", [], {})), None)


def loads_maybe(v: Any) -> Any:
    """Attributes holding JSON arrive as strings from some exporters and structured from others."""
    if isinstance(v, str):
        try:
            return json.loads(v)
        except ValueError:
            return v
    return v


def _text(parts: list) -> Any:
    if all(isinstance(p, dict) and p.get("type") in ("text", "input_text", "output_text") for p in parts):
        return "\n".join(str(p.get("text", p.get("content", ""))) for p in parts)
    return parts  # images, audio: not in the contract (text only); the schema check says so


def normalize_messages(items: Any) -> list:
    """OpenAI chat messages as the contract has them: no null fields but content, text content, tool call
    arguments as JSON strings, `type: function` on calls. What is not a message is kept for the schema check."""
    out = []
    for m in items if isinstance(items, list) else ():
        if hasattr(m, "model_dump"):
            m = m.model_dump(exclude_none=True)
        if not isinstance(m, dict):
            out.append(m)
            continue
        msg = {k: v for k, v in m.items() if v is not None or k == "content"}
        if isinstance(msg.get("content"), list):
            msg["content"] = _text(msg["content"])
        calls = []
        for call in msg.get("tool_calls") or ():
            if isinstance(call, dict) and isinstance(call.get("function"), dict):
                fn = dict(call["function"])
                if "arguments" in fn and not isinstance(fn["arguments"], str):
                    fn["arguments"] = json.dumps(fn["arguments"])
                call = {"type": "function", **call, "function": fn}
            calls.append(call)
        if calls:
            msg["tool_calls"] = calls
        out.append(msg)
    return out


def normalize_tools(items: Any) -> list:
    """OpenAI function tools; the flat form ({type, name, description, parameters}) is nested. Deduplicated by name."""
    out, seen = [], set()
    for t in items if isinstance(items, list) else ():
        if isinstance(t, dict) and "function" not in t and "name" in t:
            t = {
                "type": t.get("type", "function"),
                "function": {k: t[k] for k in ("name", "description", "parameters") if t.get(k) is not None},
            }
        elif isinstance(t, dict) and "type" not in t:
            t = {"type": "function", **t}
        name = (
            t.get("function", {}).get("name") if isinstance(t, dict) and isinstance(t.get("function"), dict) else None
        )
        if name is not None and name in seen:
            continue
        seen.add(name)
        out.append(t)
    return out


def error_tool_messages(messages: list) -> int:
    """Tool errors when no tool span says: tool messages answering a call that start with "error"."""
    return sum(
        isinstance(m, dict)
        and m.get("role") == "tool"
        and "tool_call_id" in m
        and str(m.get("content") or "").startswith("error")
        for m in messages
    )


def missing_fields(row: dict) -> list[str]:
    miss = [k for k in ("trace_id", "timestamp", "workload", "model", "tools", "messages", "outcome") if k not in row]
    if row.get("messages") == []:
        miss.append("messages")
    miss += [f"model.{k}" for k in ("name", "version") if isinstance(row.get("model"), dict) and k not in row["model"]]
    miss += [
        f"outcome.{k}"
        for k in ("success", "tool_errors", "prompt_tokens", "completion_tokens")
        if isinstance(row.get("outcome"), dict) and k not in row["outcome"]
    ]
    return miss


def drop_none(d: dict) -> dict:
    return {k: v for k, v in d.items() if v is not None}


class Partitions:
    """Rows into OUT/date=YYYY-MM-DD/traces-<name>-00000.jsonl.gz (a row without a usable timestamp into
    OUT/undated/: ingest reads undated files in every window, and quarantines the row). Each file is written
    under a temporary name (not a trace suffix: ingest never reads half a day) and renamed by close(), which
    also removes this exporter's files of an earlier export that this one did not write: OUT then holds
    exactly this export, and ingesting it twice over cannot double a day."""

    def __init__(self, out_dir: str | Path, name: str, source: str, **counters: int) -> None:
        self.out, self.name = Path(out_dir), name
        self._files: dict[str, tuple[Path, Path, gzip.GzipFile]] = {}
        self.summary: dict = {
            "source": source,
            "traces": 0,
            "written": 0,
            "unmappable": 0,
            "incomplete": 0,
            **counters,
            "missing": Counter(),
            "files": [],
        }

    def _write(self, line: bytes, timestamp: Any) -> None:
        ts = timestamp if isinstance(timestamp, str) else ""
        key = f"date={ts[:10]}" if len(ts) >= 10 and ts[4] == "-" and ts[7] == "-" else "undated"
        if key not in self._files:
            final = self.out / key / f"traces-{self.name}-00000.jsonl.gz"
            final.parent.mkdir(parents=True, exist_ok=True)
            tmp = final.with_name(final.name + ".tmp")
            self._files[key] = (tmp, final, gzip.open(tmp, "wb", compresslevel=5))  # noqa: SIM115 (closed when the partition is sealed)
        self._files[key][2].write(line + b"\n")
        self.summary["written"] += 1

    def mapped(self, fn: Callable[..., dict], obj: Any, trace_id: str, timestamp: str | None, **kw: Any) -> None:
        """Map and write one trace; a trace the mapping cannot handle is still written, with the error."""
        try:
            row = fn(obj, **kw)
            line = json.dumps(row).encode()  # ASCII JSON: any text survives the trip
        except Exception as e:
            self.summary["unmappable"] += 1
            row = drop_none(
                {"trace_id": trace_id, "timestamp": timestamp, "mapping_error": f"{type(e).__name__}: {e}"[:1000]}
            )
            self._write(json.dumps(row).encode(), timestamp)
            return
        miss = missing_fields(row)
        if miss:
            self.summary["incomplete"] += 1
            self.summary["missing"].update(miss)
        self._write(line, row.get("timestamp"))

    def close(self, ok: bool = True) -> dict:
        for tmp, final, f in self._files.values():
            f.close()
            if ok:
                os.replace(tmp, final)
                self.summary["files"].append(str(final))
            else:
                tmp.unlink(missing_ok=True)
        if ok and self.out.is_dir():
            for stale in self.out.glob(f"*/traces-{self.name}-*.jsonl.gz"):
                if str(stale) not in self.summary["files"]:
                    stale.unlink()
        self.summary["files"].sort()
        self.summary["missing"] = dict(self.summary["missing"])
        return self.summary
