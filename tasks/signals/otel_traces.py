"""OpenTelemetry GenAI spans (OTLP JSON) -> trace-contract partitions for ingest, one trace per traceId.

    from tasks.signals.trace_sources import export_otel_spans   # or materialize("otel:spans.json", out, window)
    summary = export_otel_spans("spans.json", "runs/x/source", window)

Input: an OTLP JSON document (`{"resourceSpans": [{"resource", "scopeSpans": [{"scope", "spans": [...]}]}]}`)
or JSON lines of them (the collector's file exporter), optionally `.gz`; attribute values are OTLP AnyValues
(stringValue, intValue as a string, arrayValue, kvlistValue, ...), ids hex (base64 accepted). Message content
is only there when the instrumentation captures it (OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true);
without it the trace has no messages and is quarantined. The file is read whole (spans of one trace may be
anywhere in it).

Mapping (GenAI semantic conventions; "chat spans": gen_ai.operation.name chat / text_completion /
generate_content, or spans with gen_ai.input.messages; "tool spans": execute_tool):
  trace_id    the traceId (hex);  timestamp: the earliest span start;  latency_ms: last end - first start
  messages    per chat span in start order: gen_ai.system_instructions + gen_ai.input.messages, then
              gen_ai.output.messages (parts format: text / tool_call / tool_call_response parts; OpenAI-format
              messages accepted too), or the older message events (gen_ai.{system,user,assistant,tool}.message,
              gen_ai.choice); a call whose input repeats the history so far continues it, another one's new
              messages are appended. A tool span's gen_ai.tool.call.result (or its error) becomes the tool message
              answering gen_ai.tool.call.id when no chat span recorded one.
  tools       gen_ai.tool.definitions of the chat spans, else {name, description} of the tool spans
  model       name: gen_ai.request.model (else gen_ai.response.model) of the first chat span; version:
              gen_ai.agent.version, else the resource's service.version, else gen_ai.response.model
  workload    attribute `workload` (workload_key) of the root span, any span or the resource (each attribute
              also as `mlflow.traceTag.<key>`, how MLflow's OTLP export carries trace tags), else
              gen_ai.agent.name, else the root span's name
  outcome     success: attribute `success`, else a gen_ai.evaluation.result event named `success` (label or score),
              else False when the root span's status is ERROR; reward: attribute `reward`, else that event named
              `reward`; tool_errors: tool spans with status ERROR or error.type (no tool spans: tool messages
              starting "error"); tokens: the sum of gen_ai.usage.input_tokens / output_tokens over the chat spans
              (none there: the outermost span that has them).
Not mapped: OpenLLMetry's indexed attributes (gen_ai.prompt.N.*), non-text parts (kept, then quarantined).
Tests: PYTHONPATH=. python -m pytest -q tests/unit/signals/test_trace_sources.py
"""

from __future__ import annotations

import base64
import gzip
import json
from pathlib import Path
from typing import Any

from tasks.signals.trace_partitions import (
    Partitions,
    as_bool,
    as_number,
    drop_none,
    error_tool_messages,
    first,
    iso_ms,
    loads_maybe,
    normalize_messages,
    normalize_tools,
)
from tasks.signals.traces import IngestError, Window

_CHAT_OPS = ("chat", "text_completion", "generate_content")
_EVENT_ROLES = {
    "gen_ai.system.message": "system",
    "gen_ai.user.message": "user",
    "gen_ai.assistant.message": "assistant",
    "gen_ai.tool.message": "tool",
}


def export_otel_spans(
    otlp_json_path: str | Path, out_dir: str | Path, window: Window, workload_key: str = "workload"
) -> dict:
    """Group the file's spans by traceId, map each trace whose start lies in the window, write partitions."""
    traces = read_otlp(otlp_json_path)
    start_ns = window.start.timestamp() * 1e9 if window.start else float("-inf")
    end_ns = window.end.timestamp() * 1e9 if window.end else float("inf")
    parts = Partitions(out_dir, "otel", f"otel:{otlp_json_path}", outside_window=0)
    ok = False
    try:
        for trace_id, spans in sorted(traces.items(), key=lambda kv: min(s["start"] for s in kv[1])):
            parts.summary["traces"] += 1
            t0 = min(s["start"] for s in spans)
            if not start_ns <= t0 < end_ns:
                parts.summary["outside_window"] += 1  # still in the file: another window's export has it
                continue
            parts.mapped(
                otel_trace_to_row, spans, trace_id, iso_ms(t0 / 1e6) if t0 else None, workload_key=workload_key
            )
        ok = True
    finally:
        summary = parts.close(ok)
    return summary


def _value(v: Any) -> Any:
    """An OTLP AnyValue as a Python value."""
    if not isinstance(v, dict):
        return v
    for key in ("stringValue", "boolValue", "doubleValue", "bytesValue"):
        if key in v:
            return v[key]
    if "intValue" in v:
        return int(v["intValue"])  # int64 travels as a JSON string
    if "arrayValue" in v:
        return [_value(x) for x in (v["arrayValue"] or {}).get("values", [])]
    if "kvlistValue" in v:
        return _attrs((v["kvlistValue"] or {}).get("values"))
    return None


def _attrs(kvs: Any) -> dict:
    return {kv.get("key"): _value(kv.get("value")) for kv in kvs or () if isinstance(kv, dict)}


def _hex(ident: Any) -> str:
    """Ids are hex in OTLP JSON; the protobuf JSON mapping (base64) is accepted too."""
    text = str(ident or "")
    is_hex = all(c in "0123456789abcdefABCDEF" for c in text)
    if not text or (is_hex and len(text) in (16, 32)):  # 8- and 16-byte ids: 16/32 hex digits, 12/24 base64 chars
        return text.lower()
    try:
        return base64.b64decode(text, validate=True).hex()
    except ValueError:
        return text.lower() if is_hex else text


def read_otlp(path: str | Path) -> dict[str, list[dict]]:
    """traceId -> spans ({id, parent, name, start, end, attrs, resource, events, error, status_message})."""
    path = Path(path)
    with gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb") as f:
        raw = f.read().decode("utf-8")
    try:
        docs = json.loads(raw)
        docs = docs if isinstance(docs, list) else [docs]
    except ValueError:  # JSON lines: one export request per line
        docs = []
        for no, line in enumerate(raw.splitlines(), start=1):
            if line.strip():
                try:
                    docs.append(json.loads(line))
                except ValueError as e:  # its spans cannot be accounted for: stop, as ingest does for a broken file
                    raise IngestError(f"{path}: line {no} is not OTLP JSON ({e}); repair or remove it") from None
    traces: dict[str, list[dict]] = {}
    for doc in docs:
        if not isinstance(doc, dict):
            raise IngestError(f"{path}: not OTLP JSON (a {type(doc).__name__} where an export request belongs)")
        for rs in doc.get("resourceSpans") or ():
            resource = _attrs((rs.get("resource") or {}).get("attributes"))
            for ss in rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans") or ():
                for s in ss.get("spans") or ():
                    status = s.get("status") or {}
                    start = int(s.get("startTimeUnixNano") or 0)
                    trace_id = _hex(s.get("traceId"))
                    traces.setdefault(trace_id, []).append(
                        {
                            "trace_id": trace_id,
                            "id": _hex(s.get("spanId")),
                            "parent": _hex(s.get("parentSpanId")) or None,
                            "name": s.get("name"),
                            "start": start,
                            "end": int(s.get("endTimeUnixNano") or start),
                            "attrs": _attrs(s.get("attributes")),
                            "resource": resource,
                            "events": [
                                {"name": e.get("name"), "attrs": _attrs(e.get("attributes"))}
                                for e in s.get("events") or ()
                            ],
                            "error": status.get("code") in (2, "2", "STATUS_CODE_ERROR", "ERROR"),
                            "status_message": status.get("message"),
                        }
                    )
    return traces


def _content(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v)


def _result(v: Any) -> str:
    """A tool result: a JSON-encoded string (how MLflow's GenAI export writes a str result) is unwrapped."""
    decoded = loads_maybe(v)
    return decoded if isinstance(decoded, str) else _content(v)


def semconv_messages(items: Any) -> list:
    """gen_ai.*.messages (role + parts) as OpenAI messages; messages without parts are taken as OpenAI ones."""
    out, items = [], loads_maybe(items)
    for m in items if isinstance(items, list) else ():
        if not isinstance(m, dict) or "parts" not in m:
            out += normalize_messages([m])
            continue
        texts, calls, other = [], [], []
        for p in m.get("parts") or ():
            kind = p.get("type") if isinstance(p, dict) else None
            if kind == "text":
                texts.append(str(p.get("content", "")))
            elif kind == "tool_call":
                calls.append(
                    {
                        "id": str(p.get("id") or ""),
                        "type": "function",
                        "function": {"name": p.get("name"), "arguments": _content(p.get("arguments"))},
                    }
                )
            elif kind == "tool_call_response":
                out.append(
                    drop_none({"role": "tool", "tool_call_id": p.get("id"), "content": _content(p.get("response"))})
                )
            elif kind != "reasoning":  # reasoning is the model's scratchpad, not the conversation
                other.append(p)
        if texts or calls or other:  # non-text parts (images, files) stay as parts: the schema check names them
            msg = {"role": m.get("role"), "content": m["parts"] if other else ("\n".join(texts) if texts else None)}
            out.append({**msg, "tool_calls": calls} if calls else msg)
    return out


def _system(instructions: Any) -> list:
    value = loads_maybe(instructions)
    if isinstance(value, list):
        value = "\n".join(str(p.get("content", "")) for p in value if isinstance(p, dict) and p.get("type") == "text")
    return [{"role": "system", "content": value}] if value else []


def _event_messages(events: list[dict]) -> tuple[list, list]:
    """The older GenAI conventions: one event per message (input) and gen_ai.choice (output)."""
    before, after = [], []
    for e in events:
        a = e["attrs"]
        if e["name"] in _EVENT_ROLES:
            role = _EVENT_ROLES[e["name"]]
            before.append(
                drop_none(
                    {
                        "role": role,
                        "content": a.get("content"),
                        "tool_calls": loads_maybe(a.get("tool_calls")),
                        "tool_call_id": a.get("id") if role == "tool" else None,
                    }
                )
            )
        elif e["name"] == "gen_ai.choice":
            msg = loads_maybe(a.get("message"))
            msg = (
                msg
                if isinstance(msg, dict)
                else {"content": a.get("content"), "tool_calls": loads_maybe(a.get("tool_calls"))}
            )
            after.append({"role": "assistant", **drop_none(msg)})
    return normalize_messages(before), normalize_messages(after)


def otel_messages(chats: list[dict], tool_spans: list[dict]) -> list:
    conv: list = []
    for s in chats:
        a = s["attrs"]
        before = _system(a.get("gen_ai.system_instructions")) + semconv_messages(a.get("gen_ai.input.messages"))
        after = semconv_messages(a.get("gen_ai.output.messages"))
        if not before and not after:
            before, after = _event_messages(s["events"])
        if before[: len(conv)] != conv:  # this call did not see the whole history: keep it, add what is new
            before = conv + [m for m in before if m not in conv]
        conv = before + after
    answered = {m.get("tool_call_id") for m in conv if isinstance(m, dict) and m.get("role") == "tool"}
    for s in tool_spans:
        a = s["attrs"]
        call_id, result = a.get("gen_ai.tool.call.id"), a.get("gen_ai.tool.call.result")
        if not call_id or call_id in answered or (result is None and not s["error"]):
            continue
        at = next(
            (
                i
                for i, m in enumerate(conv)
                if isinstance(m, dict)
                and any(isinstance(c, dict) and c.get("id") == call_id for c in m.get("tool_calls") or ())
            ),
            None,
        )
        if at is None:
            continue  # a call no chat span recorded: it cannot be placed (its error still counts)
        content = (
            _result(result)
            if result is not None
            else f"error: {s['status_message'] or a.get('error.type') or 'failed'}"
        )
        i = at + 1
        while i < len(conv) and isinstance(conv[i], dict) and conv[i].get("role") == "tool":
            i += 1
        conv.insert(i, {"role": "tool", "tool_call_id": call_id, "content": content})
        answered.add(call_id)
    return conv


def _evaluation(spans: list[dict], name: str) -> Any:
    for s in spans:
        for e in s["events"]:
            if e["name"] == "gen_ai.evaluation.result" and e["attrs"].get("gen_ai.evaluation.name") == name:
                a = e["attrs"]
                return (
                    first([a.get("gen_ai.evaluation.score.label"), a.get("gen_ai.evaluation.score.value")])
                    if name == "success"
                    else a.get("gen_ai.evaluation.score.value")
                )
    return None


def otel_trace_to_row(spans: list[dict], workload_key: str = "workload") -> dict:
    """The spans of one traceId (read_otlp) in the trace contract (rules: the module docstring)."""
    spans = sorted(spans, key=lambda s: s["start"])
    ids = {s["id"] for s in spans}
    root = next((s for s in spans if not s["parent"] or s["parent"] not in ids), spans[0])
    ordered = [root] + [s for s in spans if s is not root]

    def attr(
        key: str,
    ) -> Any:  # the root span's, any span's, the resource's; MLflow's OTLP export: mlflow.traceTag.<key>
        return first(
            [*(s["attrs"].get(k) for k in (key, f"mlflow.traceTag.{key}") for s in ordered), root["resource"].get(key)]
        )

    op = [s["attrs"].get("gen_ai.operation.name") for s in spans]
    chats = [
        s
        for s, o in zip(spans, op, strict=True)
        if o in _CHAT_OPS or (o is None and "gen_ai.input.messages" in s["attrs"])
    ]
    tool_spans = [s for s, o in zip(spans, op, strict=True) if o == "execute_tool"]
    messages = otel_messages(chats, tool_spans)
    tools = normalize_tools(
        [t for s in chats for t in loads_maybe(s["attrs"].get("gen_ai.tool.definitions")) or ()]
    ) or normalize_tools(
        [
            drop_none(
                {"name": s["attrs"].get("gen_ai.tool.name"), "description": s["attrs"].get("gen_ai.tool.description")}
            )
            for s in tool_spans
            if s["attrs"].get("gen_ai.tool.name")
        ]
    )
    chat_attr = lambda key: first(s["attrs"].get(key) for s in chats)  # noqa: E731
    success = attr("success")
    success = as_bool(success if success is not None else _evaluation(spans, "success"))
    if success is None and root["error"]:
        success = False  # an episode that failed as a whole did not succeed
    reward = attr("reward")
    usage = [s for s in chats if "gen_ai.usage.input_tokens" in s["attrs"]] or [
        s for s in ordered if "gen_ai.usage.input_tokens" in s["attrs"]
    ][:1]
    tokens = {
        key: sum(as_number(s["attrs"].get(f"gen_ai.usage.{key}"), integer=True) or 0 for s in usage) if usage else None
        for key in ("input_tokens", "output_tokens")
    }
    outcome = drop_none(
        {
            "success": success,
            "reward": as_number(reward if reward is not None else _evaluation(spans, "reward")),
            "tool_errors": sum(s["error"] or "error.type" in s["attrs"] for s in tool_spans)
            if tool_spans
            else error_tool_messages(messages),
            "latency_ms": round((max(s["end"] for s in spans) - spans[0]["start"]) / 1e6, 3),
            "prompt_tokens": tokens["input_tokens"],
            "completion_tokens": tokens["output_tokens"],
        }
    )
    return drop_none(
        {
            "trace_id": root["trace_id"],
            "timestamp": iso_ms(spans[0]["start"] / 1e6),
            "workload": first([attr(workload_key), attr("gen_ai.agent.name"), root["name"]]),
            "model": drop_none(
                {
                    "name": first([chat_attr("gen_ai.request.model"), chat_attr("gen_ai.response.model")]),
                    "version": first(
                        [
                            attr("gen_ai.agent.version"),
                            root["resource"].get("service.version"),
                            chat_attr("gen_ai.response.model"),
                        ]
                    ),
                }
            ),
            "tools": tools,
            "messages": messages,
            "outcome": outcome,
            "origin": drop_none({"source": "otel", "service": root["resource"].get("service.name")}),
        }
    )
