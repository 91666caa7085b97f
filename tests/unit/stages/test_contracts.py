"""The stage contracts (tasks/stages/contracts.py): what one stage writes, the next reads back unchanged,
with its schema version; a wrong field fails where it is written; extra fields travel on."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from tasks.config import load_settings
from tasks.evals.harness import EvalResult, compare
from tasks.rundir import RunDir
from tasks.stages.contracts import (
    SCHEMA_VERSION,
    ClusterInfo,
    Comparisons,
    DataVerdict,
    RunSummary,
    SignalsDigest,
    TrainingChoice,
)


def _rd(tmp_path):
    settings = load_settings(environ={}, overrides={"run_dir": str(tmp_path)})
    return RunDir.for_run(settings, "continuous_post_training", "manual__1")


def _comparison(challenger: int, champion: int, n: int = 20, key: str = "greedy_success") -> dict:
    def table(k):
        return EvalResult([{"task_id": f"t{i}", key: float(i < k)} for i in range(n)])

    return compare(table(challenger), table(champion), key=key, resamples=200)


def test_schema_version_is_written_and_read_back():
    assert SCHEMA_VERSION == 1
    for model in (
        DataVerdict(retrain=True, summary="s", window="a/b", data_validation="passed"),
        TrainingChoice(train=False, reason="quiet"),
        ClusterInfo(backend="local", address="127.0.0.1:6390"),
    ):
        dumped = json.loads(model.model_dump_json())
        assert dumped["schema_version"] == SCHEMA_VERSION
        assert type(model).model_validate(dumped) == model


def test_a_verdict_round_trips_through_the_run_dir_with_its_extra_fields(tmp_path):
    rd = _rd(tmp_path)
    verdict = DataVerdict(
        retrain=True,
        reasons=["tool change"],
        summary="breaking change",
        window="2026-12-01/2026-12-02",
        rows={"current": 500},
        data_validation="passed",
        drift_tests=[{"workload": "calc", "p_adjusted": 0.001}],
    )  # the monitor's richer report
    rd.write(verdict, "signals.json")
    raw = rd.read("signals.json")
    assert raw["drift_tests"] == [{"workload": "calc", "p_adjusted": 0.001}] and raw["schema_version"] == 1
    back = DataVerdict.model_validate(raw)
    assert back == verdict and back.model_extra == {"drift_tests": [{"workload": "calc", "p_adjusted": 0.001}]}


def test_a_missing_or_mistyped_field_fails_where_it_is_written():
    with pytest.raises(ValidationError, match="retrain"):
        DataVerdict(summary="s", window="w", data_validation="passed")
    with pytest.raises(ValidationError, match="backend"):
        ClusterInfo(backend="slurm", address="x")
    with pytest.raises(ValidationError, match="status"):
        RunSummary(dag_id="d", run_id="r", run_dir="/x", status="maybe", finished_at="now", target_toolset="2")
    with pytest.raises(ValidationError, match="evals_valid"):
        Comparisons(sampled={}, greedy={})


def test_a_file_without_schema_version_reads_as_the_current_one():
    assert TrainingChoice.model_validate({"train": True, "reason": "forced"}).schema_version == SCHEMA_VERSION


def test_defaults_are_not_shared_between_instances():
    a, b = (
        DataVerdict(retrain=False, summary="s", window="w", data_validation="passed"),
        DataVerdict(retrain=False, summary="s", window="w", data_validation="passed"),
    )
    a.reasons.append("mine")
    a.rows["current"] = 1
    assert b.reasons == [] and b.rows == {}
    assert SignalsDigest().drift == [] and RunSummary.model_fields["links"].default == {}


def test_comparisons_take_compare_dicts_and_keep_their_extra_figures():
    greedy = {"2": _comparison(16, 6), "1": _comparison(10, 10)}
    sampled = {"2": _comparison(15, 7, key="sampled_success"), "1": _comparison(9, 10, key="sampled_success")}
    c = Comparisons(greedy=greedy, sampled=sampled, evals_valid=True)
    assert c.greedy["2"].difference.mean == pytest.approx(0.5)
    assert c.greedy["2"].champion.mean == pytest.approx(0.3) and c.greedy["2"].challenger.mean == pytest.approx(0.8)
    # n, confidence and excludes_zero are not declared fields, and must survive the round trip (the gate reads n)
    back = Comparisons.model_validate_json(c.model_dump_json())
    assert back == c
    assert back.greedy["2"].difference.model_dump()["n"] == 20
    assert back.greedy["2"].difference.model_dump()["excludes_zero"] is True
    assert back.sampled["1"].metric == "sampled_success"


def test_run_summary_round_trips_as_summary_json(tmp_path):
    rd = _rd(tmp_path)
    summary = RunSummary(
        dag_id=rd.dag_id,
        run_id=rd.run_id,
        run_dir=str(rd.path),
        status="not_promoted",
        finished_at="2026-12-03T05:00:00+00:00",
        target_toolset="2",
        guard_toolsets=["1"],
        greedy={"2": _comparison(12, 10)},
        sampled=None,
        signals=SignalsDigest(retrain=True, reasons=["r"], drift=[{"workload": "calc"}]),
        timings={"grpo": 12.5},
        links={"mlflow_run": None, "run_dir": str(rd.path)},
    )
    rd.write(summary, "summary.json")
    back = RunSummary.model_validate_json((rd.path / "summary.json").read_text())
    assert back == summary and back.schema_version == SCHEMA_VERSION
    assert back.greedy["2"].difference.mean == pytest.approx(0.1) and back.links["mlflow_run"] is None
