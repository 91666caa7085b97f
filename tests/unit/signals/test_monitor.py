"""check_production: ingest + drift + tool diff, the one call behind the drift monitor."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from tasks.config import load_settings
from tasks.envs.toolset import load_toolset
from tasks.signals.monitor import check_production
from tasks.signals.simulate import simulate_traces
from tasks.signals.traces import Window

START = datetime(2026, 11, 20, tzinfo=UTC)


@pytest.fixture(scope="module")
def production(tmp_path_factory):
    """Four days of traffic; the toolset changes to v2 at the start of day 3."""
    out = tmp_path_factory.mktemp("prod")
    simulate_traces(
        out, START, START + timedelta(days=4), 3200, [(START, "1"), (START + timedelta(days=2), "2")], seed=11
    )
    champion = tmp_path_factory.mktemp("champion")
    (champion / "tool_registry.json").write_text(json.dumps(load_toolset("1")))
    return out, champion


@pytest.fixture
def settings():
    return load_settings(environ={}, overrides={"drift": {"reference_days": 1}})


def test_tool_change_day_requests_retraining_with_reasons(production, settings, tmp_path):
    traces, champion = production
    verdict = check_production(settings, traces, tmp_path, Window.parse("2026-11-22"), champion=champion, toolset="2")
    assert verdict["retrain"] and verdict["drifted"] and verdict["tool_change_breaking"]
    assert verdict["reasons"][0].startswith("tool change:") and verdict["data_validation"] == "passed"
    assert any("success rate" in r for r in verdict["reasons"])
    assert json.loads((tmp_path / "signals.json").read_text()) == verdict
    for name in (
        "drift_report.json",
        "tooldiff.json",
        "current/summary.json",
        "reference/summary.json",
        "current/gx_docs/index.html",
    ):
        assert (tmp_path / name).exists(), name


def test_stable_day_requests_nothing(production, settings, tmp_path):
    traces, champion = production
    verdict = check_production(settings, traces, tmp_path, Window.parse("2026-11-21"), champion=champion, toolset="1")
    assert not verdict["retrain"], verdict["reasons"]
    assert verdict["summary"] == "no drift, no breaking tool change"


def test_a_breaking_toolset_alone_requests_retraining(production, settings, tmp_path):
    traces, champion = production
    verdict = check_production(settings, traces, tmp_path, Window.parse("2026-11-21"), champion=champion, toolset="2")
    assert verdict["retrain"] and not verdict["drifted"] and verdict["tool_change_breaking"]


def test_open_window_without_reference_is_refused(production, settings, tmp_path):
    with pytest.raises(ValueError, match="needs a start"):
        check_production(settings, production[0], tmp_path, Window())
