"""Production traces from MLflow Tracing and OpenTelemetry, written as trace-contract partitions for ingest.

    from tasks.signals.trace_sources import materialize
    local = materialize("mlflow:agent-prod", "runs/x/source", window)  # or "otel:spans.json"; other sources: unchanged
    ingest(local, "runs/x/ingest", settings.ingest, window)
    # or: python -m tasks ingest --input mlflow:agent-prod --output DIR --window 2026-12-01  (exports to DIR/source)

Both exporters write `OUT/date=YYYY-MM-DD/traces-<mlflow|otel>-00000.jsonl.gz` in the trace contract
(include/schemas/trace.schema.json), so the rows meet the same schema check, GX suite and quarantine as
any file (tasks.signals.ingest). Nothing is dropped or invented here: a field that cannot be found is
left out, and the schema check quarantines the row naming it; a trace whose mapping raised is written as
{trace_id, timestamp, mapping_error}. The summary counts both (`incomplete` with `missing` per field,
`unmappable`). OUT holds exactly the last export (tasks.signals.trace_partitions.Partitions).

MLflow (mlflow_trace_to_row; a trace tag wins over trace metadata of the same key):
  trace_id   the MLflow trace id;  timestamp: request_time (ms, UTC)
  workload   tag `workload` (workload_tag), else the root span's name
  model      name: tag `model_name`, else span attribute `mlflow.llm.model`, else the root inputs' `model`,
             else the LoggedModel named by metadata `mlflow.modelId`; version: tag `model_version`, else `mlflow.modelId`
  messages   root span attribute `mlflow.chat.messages` (MLflow < 3), else the root span's inputs (`{"messages": [...]}`
             or a message list) followed by its outputs (a chat completion, `{"messages": [...]}`, a message, a string;
             outputs that repeat the inputs are the whole conversation), else the same from the last LLM/CHAT_MODEL span
  tools      `mlflow.chat.tools` (set_span_chat_tools) or inputs' `tools`, of the root span, else of the LLM spans
  outcome    success: tag `success`, else the latest valid feedback named `success`, else False for a trace in state
             ERROR; reward: tag `reward`, else feedback `reward`; tool_errors: tag `tool_errors`, else TOOL spans in
             status ERROR (no TOOL spans: tool messages starting "error", the environments' convention);
             tokens: the trace's token usage (`mlflow.trace.tokenUsage`), else tags `prompt_tokens`/`completion_tokens`;
             latency_ms: execution_duration.  IN_PROGRESS traces are not exported (counted; a later export has them).
OpenTelemetry: tasks/signals/otel_traces.py (export_otel_spans, re-exported here).

Tests: PYTHONPATH=. python -m pytest -q tests/unit/signals/test_trace_sources.py tests/integration/test_mlflow_traces.py
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tasks.signals.otel_traces import export_otel_spans
from tasks.signals.trace_partitions import (
    Partitions,
    as_bool,
    as_number,
    drop_none,
    error_tool_messages,
    first,
    iso_ms,
    normalize_messages,
    normalize_tools,
)
from tasks.signals.traces import Window

__all__ = ["materialize", "export_mlflow_traces", "export_otel_spans", "mlflow_trace_to_row"]
_CHAT_SPAN_TYPES = ("CHAT_MODEL", "LLM")


def materialize(source: str | Path, out_dir: str | Path, window: Window, tracking_uri: str | None = None) -> str:
    """`mlflow:EXPERIMENT` / `otel:FILE.json` -> out_dir (exported there, for ingest); any other source unchanged."""
    text = str(source)
    if text.startswith("mlflow:"):
        export_mlflow_traces(text[len("mlflow:") :], out_dir, window, tracking_uri=tracking_uri)
    elif text.startswith("otel:"):
        export_otel_spans(text[len("otel:") :], out_dir, window)
    else:
        return text
    return str(out_dir)


# ---------------------------------------------------------------- MLflow


def export_mlflow_traces(
    experiment: str,
    out_dir: str | Path,
    window: Window,
    tracking_uri: str | None = None,
    max_results: int | None = None,
    page_size: int = 200,
    workload_tag: str = "workload",
) -> dict:
    """The traces of an MLflow experiment (by name) whose request time lies in the window, paged through
    MlflowClient.search_traces (a page in memory at a time), oldest first; at most `max_results` (None: all)."""
    from tasks.tracking import credentials_to_environment, fail_fast, without_credentials

    fail_fast()
    from mlflow import MlflowClient

    if not experiment:
        raise ValueError("mlflow: source without an experiment name: give mlflow:EXPERIMENT")
    client = MlflowClient(credentials_to_environment(tracking_uri) if tracking_uri else None)
    tracking_uri = without_credentials(tracking_uri)  # named in errors
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise ValueError(f"no MLflow experiment named {experiment!r} at {tracking_uri or 'the default tracking URI'}")
    clauses = [
        f"trace.timestamp_ms {op} {int(t.timestamp() * 1000)}"
        for op, t in ((">=", window.start), ("<", window.end))
        if t is not None
    ]
    names: dict[str, str | None] = {}

    def model_name_of(model_id: str) -> str | None:  # one lookup per LoggedModel, not per trace
        if model_id not in names:
            try:
                names[model_id] = client.get_logged_model(model_id).name
            except Exception:
                names[model_id] = None
        return names[model_id]

    parts = Partitions(out_dir, "mlflow", f"mlflow:{experiment}", in_progress=0)
    token, ok = None, False
    try:
        while max_results is None or parts.summary["traces"] < max_results:
            n = page_size if max_results is None else min(page_size, max_results - parts.summary["traces"])
            # the page's trace infos first: a search with spans leaves out, with only a warning, a trace whose
            # spans cannot be loaded; those are written from what is known (and quarantined), not lost
            page = client.search_traces(
                experiment_ids=[exp.experiment_id],
                filter_string=" AND ".join(clauses) or None,
                max_results=n,
                order_by=["timestamp_ms ASC"],
                page_token=token,
                include_spans=False,
            )
            ids = [t.info.trace_id for t in page]
            full = (
                {
                    t.info.trace_id: t
                    for t in client.search_traces(
                        experiment_ids=[exp.experiment_id],
                        max_results=len(ids),
                        filter_string="trace.request_id IN ({})".format(", ".join(f"'{i}'" for i in ids)),
                    )
                }
                if ids
                else {}
            )
            for info_only in page:
                parts.summary["traces"] += 1
                trace_id, info = info_only.info.trace_id, info_only.info
                if str(getattr(info.state, "value", info.state)) == "IN_PROGRESS":
                    parts.summary["in_progress"] += 1
                    continue
                parts.mapped(
                    mlflow_trace_to_row if trace_id in full else _spans_not_loaded,
                    full.get(trace_id, info_only),
                    trace_id,
                    iso_ms(info.request_time),
                    workload_tag=workload_tag,
                    model_name_of=model_name_of,
                )
            token = page.token
            if not token or not page:
                break
        ok = True
    finally:
        summary = parts.close(ok)
    return summary


def _spans_not_loaded(trace: Any, **_: Any) -> dict:
    raise LookupError(f"the spans of trace {trace.info.trace_id} could not be loaded from the tracking server")


def _message_list(inputs: Any) -> list:
    if isinstance(inputs, dict) and isinstance(inputs.get("messages"), list):
        return inputs["messages"]
    if isinstance(inputs, list) and inputs and all(isinstance(m, dict) and "role" in m for m in inputs):
        return inputs
    return []


def conversation(inputs: Any, outputs: Any) -> list:
    """The chat a span saw (its inputs) and answered (its outputs), in OpenAI format; [] if not chat."""
    before = normalize_messages(_message_list(inputs))
    if not before:
        return []
    if isinstance(outputs, dict) and isinstance(outputs.get("choices"), list) and outputs["choices"]:
        after = [outputs["choices"][0].get("message")]
    elif isinstance(outputs, dict) and "role" in outputs:
        after = [outputs]
    elif isinstance(outputs, str):
        after = [{"role": "assistant", "content": outputs}]
    else:
        after = _message_list(outputs)
    after = normalize_messages([m for m in after if m is not None])
    return after if after[: len(before)] == before else before + after


def _latest_feedback(trace: Any, name: str) -> Any:
    found = [
        a
        for a in trace.search_assessments(name, type="feedback")
        if getattr(a, "feedback", None) is not None and a.feedback.error is None
    ]
    found.sort(key=lambda a: a.create_time_ms or 0)
    return found[-1].feedback.value if found else None


def mlflow_trace_to_row(
    trace: Any, workload_tag: str = "workload", model_name_of: Callable[[str], str | None] | None = None
) -> dict:
    """One mlflow.entities.Trace in the trace contract (rules: the module docstring); unknown fields left out."""
    info, spans = trace.info, list(trace.data.spans)
    tags, meta = dict(info.tags or {}), dict(info.trace_metadata or {})

    def tag(key: str) -> Any:
        return tags.get(key, meta.get(key))

    root = next((s for s in spans if s.parent_id is None), None)
    chats = sorted((s for s in spans if s.span_type in _CHAT_SPAN_TYPES), key=lambda s: s.start_time_ns)
    found = [root, *chats] if root is not None else chats
    messages: list = []
    if root is not None:
        recorded = root.get_attribute("mlflow.chat.messages")
        messages = (
            normalize_messages(recorded) if isinstance(recorded, list) else conversation(root.inputs, root.outputs)
        )
    for span in reversed(chats):  # the last model call saw the whole history
        if messages:
            break
        messages = conversation(span.inputs, span.outputs)
    # no tool definitions recorded anywhere: [] (what the record shows was offered), not a quarantine
    tools = normalize_tools(
        first(
            s.get_attribute("mlflow.chat.tools") or (s.inputs.get("tools") if isinstance(s.inputs, dict) else None)
            for s in found
        )
    )
    root_inputs = root.inputs if root is not None and isinstance(root.inputs, dict) else {}
    model_id = meta.get("mlflow.modelId")
    name = first(
        [tag("model_name"), first(s.get_attribute("mlflow.llm.model") for s in found), root_inputs.get("model")]
    )
    if name is None and model_id:  # a LoggedModel's name costs a request: only when nothing else names the model
        name = (model_name_of(model_id) if model_name_of else None) or model_id
    model = drop_none({"name": name, "version": first([tag("model_version"), model_id])})
    state = str(getattr(info.state, "value", info.state))
    success = tag("success")
    success = as_bool(success if success is not None else _latest_feedback(trace, "success"))
    if success is None and state == "ERROR":
        success = False  # an episode that raised did not succeed
    reward = tag("reward")
    tool_spans = [s for s in spans if s.span_type == "TOOL"]
    tool_errors = tag("tool_errors")
    if tool_errors is None:
        tool_errors = (
            sum(str(getattr(s.status.status_code, "value", s.status.status_code)) == "ERROR" for s in tool_spans)
            if tool_spans
            else error_tool_messages(messages)
        )
    usage = info.token_usage or {}
    outcome = drop_none(
        {
            "success": success,
            "reward": as_number(reward if reward is not None else _latest_feedback(trace, "reward")),
            "tool_errors": as_number(tool_errors, integer=True),
            "latency_ms": info.execution_duration,
            "prompt_tokens": as_number(usage.get("input_tokens", tag("prompt_tokens")), integer=True),
            "completion_tokens": as_number(usage.get("output_tokens", tag("completion_tokens")), integer=True),
        }
    )
    return drop_none(
        {
            "trace_id": info.trace_id,
            "timestamp": iso_ms(info.request_time),
            "workload": first([tag(workload_tag), root.name if root is not None else None]),
            "model": model,
            "tools": tools,
            "messages": messages,
            "outcome": outcome,
            "origin": {"source": "mlflow", "experiment_id": info.experiment_id, "state": state},
        }
    )
