"""Agent episodes traced with MLflow Tracing on a real `mlflow server`, exported for a window and ingested.

    PYTHONPATH=. python -m pytest -q tests/integration/test_mlflow_traces.py -p no:cacheprovider

Four episodes are logged as an instrumented agent would (a root AGENT span with chat messages and
set_span_chat_tools, CHAT_MODEL spans with token usage, TOOL spans; trace tags for workload / model /
success, or a `success` feedback assessment), plus one malformed episode (a root span that is not chat,
no outcome) and one episode from three days before the window. `materialize("mlflow:EXPERIMENT", ...)`
exports the window and the real ingest validates the partitions: the good episodes are accepted with their
messages, tools and outcome; the malformed one is quarantined with its reason; the old one is not exported.
A second test pages (page_size=2 below the count), caps max_results and names an unknown experiment.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest

pytestmark = pytest.mark.integration

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "evaluate arithmetic",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]
SYSTEM_USER = [
    {"role": "system", "content": "You are a calculator agent."},
    {"role": "user", "content": "what is 6*7?"},
]


def _call(i: int) -> dict:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"call_{i}",
                "type": "function",
                "function": {"name": "calculator", "arguments": json.dumps({"expression": "6*7"})},
            }
        ],
    }


def _episode(mlflow, exp_id: str, when: datetime, i: int, tags: dict, tool_fails: bool = False) -> str:
    """One traced episode: root AGENT span, chat call -> tool -> chat call; returns the trace id."""
    from mlflow.entities import SpanType
    from mlflow.tracing import set_span_chat_tools

    t = int(when.timestamp() * 1e9)
    ms = 10**6
    result = "error: calculator timed out" if tool_fails else "42"
    answer = "I could not get an answer from the tool." if tool_fails else "42"
    history = SYSTEM_USER + [_call(i), {"role": "tool", "tool_call_id": f"call_{i}", "content": result}]
    root = mlflow.start_span_no_context(
        "agent_episode",
        span_type=SpanType.AGENT,
        inputs={"messages": SYSTEM_USER},
        tags=tags,
        experiment_id=exp_id,
        start_time_ns=t,
    )
    set_span_chat_tools(root, TOOLS)
    for k, (inputs, output, usage, start) in enumerate(
        [(SYSTEM_USER, _call(i), (100, 12), 1), (history, {"role": "assistant", "content": answer}, (130, 5), 40)]
    ):
        chat = mlflow.start_span_no_context(
            "chat",
            span_type=SpanType.CHAT_MODEL,
            parent_span=root,
            start_time_ns=t + start * ms,
            inputs={"messages": inputs, "model": "evergreen-agent"},
        )
        chat.set_attribute(
            "mlflow.chat.tokenUsage", {"input_tokens": usage[0], "output_tokens": usage[1], "total_tokens": sum(usage)}
        )
        chat.end(
            outputs={"choices": [{"index": 0, "message": output, "finish_reason": "stop"}]},
            end_time_ns=t + (start + 20) * ms,
        )
        if k == 0:
            tool = mlflow.start_span_no_context(
                "calculator",
                span_type=SpanType.TOOL,
                parent_span=root,
                inputs={"expression": "6*7"},
                start_time_ns=t + 25 * ms,
            )
            tool.end(outputs=result, status="ERROR" if tool_fails else "OK", end_time_ns=t + 30 * ms)
    root.end(outputs={"messages": history + [{"role": "assistant", "content": answer}]}, end_time_ns=t + 70 * ms)
    return root.trace_id


def test_mlflow_traces_of_a_window_are_exported_and_ingested(mlflow_server, tmp_path):
    import mlflow

    from tasks.config import load_settings
    from tasks.signals.ingest import ingest
    from tasks.signals.trace_sources import materialize
    from tasks.signals.traces import Window

    mlflow.set_tracking_uri(mlflow_server.uri)
    experiment = f"agent-prod-{uuid.uuid4().hex[:8]}"
    exp_id = mlflow.MlflowClient().create_experiment(experiment)
    now = datetime.now(UTC).replace(microsecond=0)
    window = Window(now - timedelta(hours=1), now + timedelta(minutes=1))
    model = {"model_name": "evergreen-agent", "model_version": "5"}
    ids = {
        "ok": _episode(
            mlflow, exp_id, now - timedelta(minutes=30), 1, {"workload": "calc", "success": "true", **model}
        ),
        "tool_failed": _episode(
            mlflow,
            exp_id,
            now - timedelta(minutes=20),
            2,
            {"workload": "calc", "success": "false", **model},
            tool_fails=True,
        ),
        "judged": _episode(mlflow, exp_id, now - timedelta(minutes=10), 3, {"workload": "lookup", **model}),
        "old": _episode(mlflow, exp_id, now - timedelta(days=3), 4, {"workload": "calc", "success": "true", **model}),
    }
    # malformed: a root span that is not a chat, no tools, no outcome tags
    bad = mlflow.start_span_no_context(
        "batch_job",
        inputs={"rows": 3},
        experiment_id=exp_id,
        tags={"workload": "calc"},
        start_time_ns=int((now - timedelta(minutes=5)).timestamp() * 1e9),
    )
    bad.end(outputs={"ok": True})
    ids["malformed"] = bad.trace_id
    mlflow.flush_trace_async_logging()
    mlflow.log_feedback(trace_id=ids["judged"], name="success", value=True)  # an outcome judged after the fact

    source = materialize(f"mlflow:{experiment}", tmp_path / "source", window, tracking_uri=mlflow_server.uri)
    assert source == str(tmp_path / "source")
    settings = load_settings(environ={}).ingest.model_copy(
        update={"max_quarantine_share": 1.0, "required_workloads": ["calc", "lookup"]}
    )
    summary = ingest(source, tmp_path / "ingest", settings, window, docs=False)
    assert (summary["rows_read"], summary["rows_accepted"], summary["rows_quarantined"]) == (4, 3, 1)
    assert summary["workloads"] == {"calc": 2, "lookup": 1}

    rows = {
        r["trace_id"]: r
        for r in map(json.loads, (tmp_path / "ingest" / "accepted" / "part-00000.jsonl").read_text().splitlines())
    }
    assert set(rows) == {ids["ok"], ids["tool_failed"], ids["judged"]}
    ok, failed, judged = rows[ids["ok"]], rows[ids["tool_failed"]], rows[ids["judged"]]
    assert ok["messages"] == SYSTEM_USER + [
        _call(1),
        {"role": "tool", "tool_call_id": "call_1", "content": "42"},
        {"role": "assistant", "content": "42"},
    ]
    assert ok["tools"] == TOOLS and ok["model"] == {"name": "evergreen-agent", "version": "5"}
    assert ok["timestamp"] == (now - timedelta(minutes=30)).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    assert ok["outcome"] == {
        "success": True,
        "tool_errors": 0,
        "latency_ms": 70,
        "prompt_tokens": 230,
        "completion_tokens": 17,
    }
    assert failed["outcome"]["success"] is False and failed["outcome"]["tool_errors"] == 1
    assert failed["messages"][3]["content"] == "error: calculator timed out"
    assert judged["outcome"]["success"] is True and judged["workload"] == "lookup"
    [quarantined] = [
        json.loads(line) for line in (tmp_path / "ingest" / "quarantine" / "part-00000.jsonl").read_text().splitlines()
    ]
    assert json.loads(quarantined["raw"])["trace_id"] == ids["malformed"]
    assert "messages" in quarantined["reason"] and quarantined["reason"].startswith("schema:")


def test_export_pages_and_counts(mlflow_server, tmp_path):
    """Paging (page_size below the count), the summary, and an unknown experiment named in the error."""
    import mlflow

    from tasks.signals.trace_sources import export_mlflow_traces
    from tasks.signals.traces import Window

    mlflow.set_tracking_uri(mlflow_server.uri)
    experiment = f"agent-paging-{uuid.uuid4().hex[:8]}"
    exp_id = mlflow.MlflowClient().create_experiment(experiment)
    now = datetime.now(UTC)
    for i in range(5):
        _episode(mlflow, exp_id, now - timedelta(minutes=10 - i), i, {"workload": "calc", "success": "true"})
    mlflow.flush_trace_async_logging()
    summary = export_mlflow_traces(experiment, tmp_path / "out", Window(now - timedelta(hours=1)), page_size=2)
    assert {k: summary[k] for k in ("traces", "written", "unmappable", "incomplete", "in_progress")} == {
        "traces": 5,
        "written": 5,
        "unmappable": 0,
        "incomplete": 5,
        "in_progress": 0,
    }
    assert summary["missing"] == {"model.version": 5}  # the name comes from the chat spans' model; no version tag
    assert len(summary["files"]) >= 1
    capped = export_mlflow_traces(
        experiment, tmp_path / "capped", Window(now - timedelta(hours=1)), page_size=2, max_results=3
    )
    assert capped["traces"] == 3
    with pytest.raises(ValueError, match="no MLflow experiment named 'nope'"):
        export_mlflow_traces("nope", tmp_path / "x", Window(), tracking_uri=mlflow_server.uri)
