"""Traces from OpenTelemetry GenAI spans and MLflow Trace objects, mapped onto the trace contract and ingested.

    PYTHONPATH=. python -m pytest -q tests/unit/signals/test_trace_sources.py -p no:cacheprovider

The OTel part runs a small OTLP JSON export (written below: the current parts-format attributes, the older
message events, a trace without captured content, one outside the window) through export_otel_spans and the
real ingest. The MLflow part builds mlflow.entities.Trace objects in-process (Span.from_dict, no server;
the server round trip is tests/integration/test_mlflow_traces.py) and maps them.
"""

from __future__ import annotations

import gzip
import json
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tasks.config import load_settings
from tasks.signals.ingest import ingest
from tasks.signals.rows import RowParser
from tasks.signals.trace_partitions import Partitions, normalize_messages
from tasks.signals.trace_sources import export_otel_spans, materialize, mlflow_trace_to_row
from tasks.signals.traces import IngestError, Window

WINDOW = Window.parse("2026-12-01/2026-12-02")
T0 = int(datetime(2026, 12, 1, 10, tzinfo=UTC).timestamp() * 1e9)
TOOL = {
    "type": "function",
    "name": "calculator",
    "description": "evaluate arithmetic",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
}


def _kv(attrs: dict) -> list[dict]:
    def value(v):
        if isinstance(v, bool):
            return {"boolValue": v}
        if isinstance(v, int):
            return {"intValue": str(v)}  # int64 is a string in OTLP JSON
        if isinstance(v, float):
            return {"doubleValue": v}
        return {"stringValue": v if isinstance(v, str) else json.dumps(v)}

    return [{"key": k, "value": value(v)} for k, v in attrs.items()]


def _span(
    trace: str,
    span: str,
    parent: str,
    name: str,
    start_ms: int,
    end_ms: int,
    attrs: dict,
    events=(),
    error: bool = False,
) -> dict:
    return {
        "traceId": trace,
        "spanId": span,
        "parentSpanId": parent,
        "name": name,
        "kind": 3,
        "startTimeUnixNano": str(T0 + start_ms * 10**6),
        "endTimeUnixNano": str(T0 + end_ms * 10**6),
        "attributes": _kv(attrs),
        "events": [{"timeUnixNano": str(T0), "name": n, "attributes": _kv(a)} for n, a in events],
        "status": {"code": 2, "message": "tool raised"} if error else {},
    }


A, B, C, D = ("a" * 32, "b" * 32, "c" * 32, "d" * 32)
CALL = {"type": "tool_call", "id": "call_1", "name": "calculator", "arguments": {"expression": "6*7"}}
HISTORY = [
    {"role": "user", "parts": [{"type": "text", "content": "what is 6*7?"}]},
    {"role": "assistant", "parts": [CALL]},
    {"role": "tool", "parts": [{"type": "tool_call_response", "id": "call_1", "response": "42"}]},
]
SPANS = [
    # A: current conventions: an agent span, two chat calls (the second sees the whole history), a tool span
    _span(
        A,
        "a1",
        "",
        "invoke_agent calc-agent",
        0,
        900,
        {"gen_ai.operation.name": "invoke_agent", "workload": "calc", "success": True, "gen_ai.agent.version": "7"},
    ),
    _span(
        A,
        "a2",
        "a1",
        "chat evergreen-agent",
        10,
        300,
        {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": "evergreen-agent",
            "gen_ai.tool.definitions": [TOOL],
            "gen_ai.system_instructions": [{"type": "text", "content": "You are a calculator agent."}],
            "gen_ai.input.messages": HISTORY[:1],
            "gen_ai.output.messages": [{**HISTORY[1], "finish_reason": "tool_call"}],
            "gen_ai.usage.input_tokens": 100,
            "gen_ai.usage.output_tokens": 20,
        },
    ),
    _span(
        A,
        "a3",
        "a1",
        "execute_tool calculator",
        310,
        320,
        {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "calculator", "gen_ai.tool.call.id": "call_1"},
    ),
    _span(
        A,
        "a4",
        "a1",
        "chat evergreen-agent",
        330,
        890,
        {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": "evergreen-agent",
            "gen_ai.system_instructions": [{"type": "text", "content": "You are a calculator agent."}],
            "gen_ai.input.messages": HISTORY,
            "gen_ai.usage.input_tokens": 130,
            "gen_ai.usage.output_tokens": 5,
            "gen_ai.output.messages": [{"role": "assistant", "parts": [{"type": "text", "content": "42"}]}],
        },
    ),
    # B: the older per-message events; the tool failed and no chat span recorded its answer; judged by an evaluation
    _span(
        B,
        "b1",
        "",
        "chat evergreen-agent",
        1000,
        1400,
        {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": "evergreen-agent",
            "workload": "lookup",
            "gen_ai.usage.input_tokens": 50,
            "gen_ai.usage.output_tokens": 9,
        },
        events=[
            ("gen_ai.user.message", {"content": "who is on call?"}),
            (
                "gen_ai.choice",
                {
                    "message": {
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "call_9",
                                "type": "function",
                                "function": {"name": "oncall", "arguments": {"team": "infra"}},
                            }
                        ],
                    }
                },
            ),
            (
                "gen_ai.evaluation.result",
                {"gen_ai.evaluation.name": "success", "gen_ai.evaluation.score.label": "fail"},
            ),
        ],
    ),
    _span(
        B,
        "b2",
        "b1",
        "execute_tool oncall",
        1100,
        1200,
        {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "oncall",
            "gen_ai.tool.call.id": "call_9",
            "error.type": "TimeoutError",
        },
        error=True,
    ),
    # C: content capture off: no messages, no success signal -> written, then quarantined by the schema
    _span(
        C,
        "c1",
        "",
        "chat evergreen-agent",
        2000,
        2100,
        {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": "m",
            "gen_ai.usage.input_tokens": 1,
            "gen_ai.usage.output_tokens": 1,
        },
    ),
    # D: the day before the window
    _span(D, "d1", "", "chat evergreen-agent", -86_400_000, -86_399_000, {"gen_ai.operation.name": "chat"}),
]


def _otlp(spans) -> dict:
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": _kv({"service.name": "agent-prod", "service.version": "2.1"})},
                "scopeSpans": [{"scope": {"name": "opentelemetry.instrumentation.openai_v2"}, "spans": spans}],
            }
        ]
    }


def _ingest(source, out: Path) -> dict:
    settings = load_settings(environ={}).ingest.model_copy(
        update={"max_quarantine_share": 1.0, "required_workloads": []}
    )
    summary = ingest(source, out, settings, WINDOW, docs=False)
    assert summary["rows_read"] == summary["rows_accepted"] + summary["rows_quarantined"]
    return summary


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_otel_genai_spans_become_contract_traces_and_go_through_ingest(tmp_path):
    (tmp_path / "spans.json").write_text(json.dumps(_otlp(SPANS)))
    out = materialize(f"otel:{tmp_path / 'spans.json'}", tmp_path / "source", WINDOW)
    assert out == str(tmp_path / "source")
    assert sorted(p.relative_to(out).as_posix() for p in Path(out).rglob("*") if p.is_file()) == [
        "date=2026-12-01/traces-otel-00000.jsonl.gz"
    ]
    summary = _ingest(out, tmp_path / "ingest")
    assert (summary["rows_read"], summary["rows_accepted"], summary["rows_quarantined"]) == (3, 2, 1)
    rows = {r["trace_id"]: r for r in _lines(tmp_path / "ingest" / "accepted" / "part-00000.jsonl")}
    a, b = rows[A], rows[B]
    assert a["messages"] == [
        {"role": "system", "content": "You are a calculator agent."},
        {"role": "user", "content": "what is 6*7?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "calculator", "arguments": '{"expression": "6*7"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "42"},
        {"role": "assistant", "content": "42"},
    ]
    assert a["tools"] == [{"type": "function", "function": {k: TOOL[k] for k in ("name", "description", "parameters")}}]
    assert a["workload"] == "calc" and a["model"] == {"name": "evergreen-agent", "version": "7"}
    assert a["timestamp"] == "2026-12-01T10:00:00.000Z"
    assert a["outcome"] == {
        "success": True,
        "tool_errors": 0,
        "latency_ms": 900.0,
        "prompt_tokens": 230,
        "completion_tokens": 25,
    }
    # B: the failed call's answer comes from its tool span; version from the resource
    assert b["messages"][-1] == {"role": "tool", "tool_call_id": "call_9", "content": "error: tool raised"}
    assert b["messages"][1]["tool_calls"][0]["function"]["arguments"] == '{"team": "infra"}'
    assert b["tools"] == [{"type": "function", "function": {"name": "oncall"}}]
    assert b["model"] == {"name": "evergreen-agent", "version": "2.1"} and b["workload"] == "lookup"
    assert b["outcome"]["success"] is False and b["outcome"]["tool_errors"] == 1
    assert (b["outcome"]["prompt_tokens"], b["outcome"]["completion_tokens"]) == (50, 9)
    [bad] = _lines(tmp_path / "ingest" / "quarantine" / "part-00000.jsonl")
    assert json.loads(bad["raw"])["trace_id"] == C and "messages" in bad["reason"]


def test_otel_json_lines_export_gz_and_summary_counts(tmp_path):
    path = tmp_path / "spans.jsonl.gz"  # the collector's file exporter: one request per line
    with gzip.open(path, "wt") as f:
        f.write(json.dumps(_otlp(SPANS[:4])) + "\n\n" + json.dumps(_otlp(SPANS[4:])) + "\n")
    summary = export_otel_spans(path, tmp_path / "out", WINDOW)
    assert {k: summary[k] for k in ("traces", "written", "unmappable", "incomplete", "outside_window")} == {
        "traces": 4,
        "written": 3,
        "unmappable": 0,
        "incomplete": 1,
        "outside_window": 1,
    }
    assert summary["missing"] == {"messages": 1, "outcome.success": 1}
    again = export_otel_spans(path, tmp_path / "out", Window.parse("2026-11-30"))  # the same directory, another day
    assert [Path(f).parent.name for f in again["files"]] == ["date=2026-11-30"]
    assert [p.parent.name for p in (tmp_path / "out").rglob("*.jsonl.gz")] == ["date=2026-11-30"]  # no stale day
    (tmp_path / "broken.json").write_text(json.dumps(_otlp(SPANS[:1])) + "\n{not json\n")
    with pytest.raises(IngestError, match="line 2"):
        export_otel_spans(tmp_path / "broken.json", tmp_path / "out2", WINDOW)
    assert not (tmp_path / "out2").exists() or not any((tmp_path / "out2").rglob("*.jsonl.gz"))


def test_ingest_command_takes_an_otel_source(tmp_path):
    import subprocess
    import sys

    (tmp_path / "spans.json").write_text(json.dumps(_otlp(SPANS)))
    root = Path(__file__).resolve().parents[3]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tasks",
            "ingest",
            "--input",
            f"otel:{tmp_path / 'spans.json'}",
            "--output",
            str(tmp_path / "out"),
            "--window",
            "2026-12-01",
        ],
        cwd=root,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root)},
        timeout=300,
    )
    # 1 of 3 quarantined is over the default ingest.max_quarantine_share: exit 1, the summary still printed
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == 1 and (summary["rows_accepted"], summary["rows_quarantined"]) == (2, 1), proc.stderr
    assert summary["source"] == str(tmp_path / "out" / "source")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tasks",
            "ingest",
            "--input",
            f"otel:{tmp_path / 'nope.json'}",
            "--output",
            str(tmp_path / "o2"),
        ],
        cwd=root,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root)},
        timeout=300,
    )
    assert proc.returncode == 2 and "nope.json" in proc.stderr


def test_materialize_leaves_other_sources_alone(tmp_path):
    assert materialize("s3://bucket/traces/", tmp_path, WINDOW) == "s3://bucket/traces/"
    assert materialize(str(tmp_path / "t.jsonl"), tmp_path / "x", WINDOW) == str(tmp_path / "t.jsonl")
    assert not (tmp_path / "x").exists()


# ---- MLflow Trace objects, built in-process ---------------------------------------------------------------


def _mlflow_trace(
    tid: str,
    spans: list[tuple],
    tags: dict,
    metadata: dict | None = None,
    state: str = "OK",
    feedback: dict | None = None,
):
    from mlflow.entities import Feedback, Span, Trace, TraceData, TraceInfo, TraceLocation, TraceState

    def span(name, sid, parent, kind, attrs, code="STATUS_CODE_OK", raw=None):
        dumped = {"mlflow.traceRequestId": json.dumps(tid), "mlflow.spanType": json.dumps(kind)}
        dumped.update({k: json.dumps(v) for k, v in attrs.items()})  # MLflow stores attribute values JSON-encoded
        dumped.update(raw or {})
        return Span.from_dict(
            {
                "trace_id": tid,
                "span_id": sid,
                "parent_span_id": parent,
                "name": name,
                "start_time_unix_nano": T0 + int(sid, 16),
                "end_time_unix_nano": T0 + 10**9,
                "events": [],
                "status": {"code": code, "message": ""},
                "attributes": dumped,
            }
        )

    info = TraceInfo(
        trace_id=tid,
        trace_location=TraceLocation.from_experiment_id("1"),
        request_time=T0 // 10**6,
        state=TraceState(state),
        execution_duration=1000,
        trace_metadata=metadata or {},
        tags=tags,
        assessments=[Feedback(name=k, value=v, trace_id=tid) for k, v in (feedback or {}).items()],
    )
    return Trace(info, TraceData([span(*s) for s in spans]))


SYSTEM_USER = [{"role": "system", "content": "You are a calculator agent."}, {"role": "user", "content": "6*7?"}]
CALLING = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": {"expression": "6*7"}}}
    ],
}


def test_mlflow_trace_with_chat_root_span_maps_to_a_valid_contract_row():
    full = SYSTEM_USER + [
        CALLING,
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
        {"role": "assistant", "content": "42"},
    ]
    tools = [{"type": "function", "function": {k: TOOL[k] for k in ("name", "description", "parameters")}}]
    trace = _mlflow_trace(
        "tr-" + "1" * 32,
        [
            (
                "agent",
                "0000000000000001",
                None,
                "AGENT",
                {
                    "mlflow.spanInputs": {"messages": SYSTEM_USER},
                    "mlflow.spanOutputs": {"messages": full},
                    "mlflow.chat.tools": tools,
                },
            ),
            ("calculator", "0000000000000002", "0000000000000001", "TOOL", {}),
        ],
        tags={"workload": "calc", "model_name": "evergreen-agent", "model_version": "3"},
        feedback={"success": True, "reward": 0.9},
        metadata={
            "mlflow.trace.tokenUsage": json.dumps({"input_tokens": 120, "output_tokens": 14, "total_tokens": 134})
        },
    )
    row = mlflow_trace_to_row(trace)
    assert (
        row["messages"][:2] == SYSTEM_USER
        and row["messages"][2]["tool_calls"][0]["function"]["arguments"] == '{"expression": "6*7"}'
    )
    assert row["messages"][3:] == full[3:] and row["tools"] == tools
    assert (row["workload"], row["model"], row["timestamp"]) == (
        "calc",
        {"name": "evergreen-agent", "version": "3"},
        "2026-12-01T10:00:00.000Z",
    )
    assert row["outcome"] == {
        "success": True,
        "reward": 0.9,
        "tool_errors": 0,
        "latency_ms": 1000,
        "prompt_tokens": 120,
        "completion_tokens": 14,
    }
    assert RowParser(1 << 20).parse(json.dumps(row).encode())[2] is None


def test_mlflow_trace_from_llm_spans_error_state_and_unmappable_trace(tmp_path):
    completion = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "I could not get an answer."}}]}
    history = SYSTEM_USER + [CALLING, {"role": "tool", "tool_call_id": "c1", "content": "error: timeout"}]
    failed = _mlflow_trace(
        "tr-" + "2" * 32,
        [
            ("run_episode", "0000000000000001", None, "CHAIN", {"mlflow.spanInputs": {"task_id": "t-7"}}),
            ("calculator", "0000000000000002", "0000000000000001", "TOOL", {}, "STATUS_CODE_ERROR"),
            (
                "chat",
                "0000000000000003",
                "0000000000000001",
                "CHAT_MODEL",
                {
                    "mlflow.spanInputs": {"messages": history, "model": "evergreen-agent"},
                    "mlflow.spanOutputs": completion,
                    "mlflow.llm.model": "evergreen-agent",
                    "mlflow.chat.tools": [{"type": "function", "function": {"name": "calculator"}}],
                },
            ),
        ],
        tags={"prompt_tokens": "80", "completion_tokens": "11"},
        metadata={"mlflow.modelId": "m-abc"},
        state="ERROR",
    )
    row = mlflow_trace_to_row(failed, model_name_of=lambda mid: None)
    assert row["messages"] == normalize_messages(history) + [completion["choices"][0]["message"]]
    assert row["workload"] == "run_episode" and row["model"] == {"name": "evergreen-agent", "version": "m-abc"}
    assert row["outcome"] == {
        "success": False,
        "tool_errors": 1,
        "latency_ms": 1000,
        "prompt_tokens": 80,
        "completion_tokens": 11,
    }
    assert row["tools"] == [{"type": "function", "function": {"name": "calculator"}}]

    broken = _mlflow_trace(
        "tr-" + "3" * 32,
        [("agent", "0000000000000001", None, "AGENT", {})],
        tags={"workload": "calc"},
        metadata={"mlflow.trace.tokenUsage": "{not json"},
    )
    unlabelled = _mlflow_trace(
        "tr-" + "4" * 32,
        [("agent", "0000000000000001", None, "AGENT", {"mlflow.spanInputs": {"messages": SYSTEM_USER}})],
        tags={"model_name": "m", "model_version": "1"},
    )
    parts = Partitions(tmp_path / "src", "mlflow", "mlflow:test")
    for trace in (failed, broken, unlabelled):
        parts.mapped(mlflow_trace_to_row, trace, trace.info.trace_id, "2026-12-01T10:00:00.000Z")
    summary = parts.close()
    assert (summary["written"], summary["unmappable"], summary["incomplete"]) == (3, 1, 1)
    ing = _ingest(tmp_path / "src", tmp_path / "ingest")
    assert (ing["rows_accepted"], ing["rows_quarantined"]) == (1, 2)
    reasons = {
        json.loads(q["raw"])["trace_id"]: q["reason"]
        for q in _lines(tmp_path / "ingest" / "quarantine" / "part-00000.jsonl")
    }
    assert "is a required property" in reasons["tr-" + "3" * 32]
    assert "success" in reasons["tr-" + "4" * 32] and "prompt_tokens" in reasons["tr-" + "4" * 32]


def test_mlflow_genai_semconv_export_maps_like_the_mlflow_trace(tmp_path):
    """The same episode both ways: mapped from the MLflow Trace, and exported by MLflow's own GenAI semconv
    translator through the OTLP protobuf encoder (its JSON mapping: base64 ids, enum names, int64 strings)."""
    from google.protobuf.json_format import MessageToDict
    from mlflow.tracing.export.genai_semconv.translator import translate_span_to_genai
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    tools = [{"type": "function", "function": {k: TOOL[k] for k in ("name", "description", "parameters")}}]
    history = SYSTEM_USER + [CALLING, {"role": "tool", "tool_call_id": "c1", "content": "42"}]
    answer = {"role": "assistant", "content": "42"}
    tags = {"workload": "calc", "success": "true"}

    def chat(sid, inputs, output, usage):
        return (
            "chat",
            sid,
            "0000000000000001",
            "CHAT_MODEL",
            {
                "mlflow.spanInputs": {"messages": inputs, "tools": tools, "model": "evergreen-agent"},
                "mlflow.spanOutputs": {"choices": [{"index": 0, "message": output, "finish_reason": "stop"}]},
                "mlflow.llm.model": "evergreen-agent",
                "mlflow.chat.tokenUsage": dict(zip(("input_tokens", "output_tokens"), usage, strict=True)),
            },
        )

    trace = _mlflow_trace(
        "tr-" + "5" * 32,
        [
            (
                "agent",
                "0000000000000001",
                None,
                "AGENT",
                {
                    "mlflow.spanInputs": {"messages": SYSTEM_USER},
                    "mlflow.spanOutputs": {"messages": history + [answer]},
                    "mlflow.chat.tools": tools,
                },
                "STATUS_CODE_OK",
                {f"mlflow.traceTag.{k}": v for k, v in tags.items()},
            ),  # how MLflow's OTLP export carries trace tags
            chat("0000000000000002", SYSTEM_USER, CALLING, (100, 12)),
            (
                "calculator",
                "0000000000000003",
                "0000000000000001",
                "TOOL",
                {"mlflow.spanInputs": {"expression": "6*7"}, "mlflow.spanOutputs": "42"},
            ),
            chat("0000000000000004", history, answer, (130, 5)),
        ],
        tags=tags,
        metadata={"mlflow.trace.tokenUsage": json.dumps({"input_tokens": 230, "output_tokens": 17})},
    )
    otlp = MessageToDict(encode_spans([translate_span_to_genai(s._span) for s in trace.data.spans]))
    assert otlp["resourceSpans"][0]["scopeSpans"][0]["spans"][1]["attributes"]  # the translator's gen_ai.* attributes
    (tmp_path / "spans.json").write_text(json.dumps(otlp))
    summary = export_otel_spans(tmp_path / "spans.json", tmp_path / "out", WINDOW)
    assert (summary["written"], summary["incomplete"], summary["unmappable"]) == (1, 1, 0)  # no model version in OTel
    [otel_row] = _gz_lines(summary["files"][0])
    mlflow_row = mlflow_trace_to_row(trace)
    assert mlflow_row["trace_id"] == "tr-" + otel_row["trace_id"] and otel_row["timestamp"] == mlflow_row["timestamp"]
    for key in ("messages", "tools", "workload"):
        assert otel_row[key] == mlflow_row[key], key
    for key in ("success", "tool_errors", "prompt_tokens", "completion_tokens"):
        assert otel_row["outcome"][key] == mlflow_row["outcome"][key], key
    assert otel_row["model"] == {"name": "evergreen-agent"}


def _gz_lines(path) -> list[dict]:
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f]


def test_mlflow_export_pages_and_writes_a_trace_whose_spans_did_not_load(tmp_path, monkeypatch):
    """A fake client: search_traces with spans silently leaves out a trace whose spans cannot be loaded
    (as MLflow's does, with a warning); the export still writes it, from the page of trace infos."""
    import re

    import mlflow
    from mlflow.entities import Trace, TraceData
    from mlflow.store.entities.paged_list import PagedList

    from tasks.signals.trace_sources import export_mlflow_traces

    chat = {"mlflow.spanInputs": {"messages": SYSTEM_USER}, "mlflow.spanOutputs": "42"}
    tags = {
        "workload": "calc",
        "success": "1",
        "model_name": "m",
        "model_version": "1",
        "prompt_tokens": "9",
        "completion_tokens": "2",
    }
    traces = [
        _mlflow_trace(
            f"tr-{i:032x}",
            [("agent", "0000000000000001", None, "AGENT", chat)],
            tags,
            state="IN_PROGRESS" if i == 3 else "OK",
        )
        for i in range(1, 5)
    ]
    lost, searches = traces[1].info.trace_id, []

    class FakeClient:
        def __init__(self, tracking_uri=None):
            pass

        def get_experiment_by_name(self, name):
            return type("Experiment", (), {"experiment_id": "1"})() if name == "prod" else None

        def search_traces(
            self,
            experiment_ids,
            filter_string=None,
            max_results=100,
            order_by=None,
            page_token=None,
            include_spans=True,
        ):
            searches.append(filter_string)
            if not include_spans:  # pages of trace infos
                at = int(page_token or 0)
                more = at + max_results < len(traces)
                return PagedList(
                    [Trace(t.info, TraceData([])) for t in traces[at : at + max_results]],
                    str(at + max_results) if more else None,
                )
            ids = re.findall(r"'([^']+)'", filter_string)
            return PagedList([t for t in traces if t.info.trace_id in ids and t.info.trace_id != lost], None)

    monkeypatch.setattr(mlflow, "MlflowClient", FakeClient)
    summary = export_mlflow_traces("prod", tmp_path / "out", WINDOW, page_size=3)
    assert {k: summary[k] for k in ("traces", "written", "unmappable", "incomplete", "in_progress")} == {
        "traces": 4,
        "written": 3,
        "unmappable": 1,
        "incomplete": 0,
        "in_progress": 1,
    }
    assert searches[0] == "trace.timestamp_ms >= 1796083200000 AND trace.timestamp_ms < 1796169600000"
    rows = {r["trace_id"]: r for r in _gz_lines(summary["files"][0])}
    assert "could not be loaded" in rows[lost]["mapping_error"] and set(rows[lost]) == {
        "trace_id",
        "timestamp",
        "mapping_error",
    }
    assert rows[traces[0].info.trace_id]["outcome"] == {
        "success": True,
        "tool_errors": 0,
        "latency_ms": 1000,
        "prompt_tokens": 9,
        "completion_tokens": 2,
    }
    assert rows[traces[0].info.trace_id]["messages"] == SYSTEM_USER + [{"role": "assistant", "content": "42"}]
    with pytest.raises(ValueError, match="no MLflow experiment named 'other'"):
        export_mlflow_traces("other", tmp_path / "x", WINDOW)
