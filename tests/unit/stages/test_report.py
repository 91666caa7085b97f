"""tasks/stages/report.py's summary of a run directory with hand-written stage files: every field comes
from its file, and a promoted, a not-promoted, a skipped and a failed run each collect and format."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from tasks.config import load_settings
from tasks.evals.harness import EvalResult, compare, format_interval
from tasks.rundir import RunDir
from tasks.stages.contracts import Comparisons, RunSummary
from tasks.stages.report import collect_summary, format_summary, summarize

STARTED = (datetime.now(UTC) - timedelta(minutes=30)).isoformat()
DRIFT = {
    "workload": "calc",
    "statistic": "success_rate",
    "effect": -0.41,
    "p_adjusted": 0.0004,
    "significant": True,
    "verdict": "drifted",
}


def _settings(tmp_path):
    return load_settings(environ={}, overrides={"run_dir": str(tmp_path)})


def _rd(settings, run_id="manual__2026-12-03T04:00:00+00:00"):
    return RunDir.for_run(settings, "continuous_post_training", run_id)


def _comparison(champion: int, challenger: int, key: str, n: int = 20) -> dict:
    def table(k):
        return EvalResult([{"task_id": f"t{i}", key: float(i < k)} for i in range(n)])

    return compare(table(challenger), table(champion), key=key, resamples=200)


def _promotion(promote: bool) -> dict:
    if promote:
        move, aliases = (
            {"kind": "promote", "from": "3", "to": "4", "state": "done", "moved": True},
            {"champion": "4", "previous": "3"},
        )
    else:
        move, aliases = {"moved": False, "kind": "not_promoted"}, {"champion": "3", "previous": "2", "challenger": "4"}
    return {
        "decision": {
            "promote": promote,
            "checks": [],
            "reasons": ["r"],
            "summary": f"{'PROMOTE' if promote else 'HOLD'} evergreen-agent: greedy_success +50 pts",
        },
        "cost": {"run_usd": 0.0123, "total_usd": 0.0456},
        "version": "4",
        "move": move,
        "aliases": aliases,
        "model_name": "evergreen-agent",
    }


def full_run(tmp_path, promote=True, trigger=None):
    """Every file the stages of a finished run leave."""
    settings = _settings(tmp_path)
    rd = _rd(settings)
    rd.write(
        {
            "dag_id": rd.dag_id,
            "run_id": rd.run_id,
            "run_dir": str(rd.path),
            "mlflow_run_id": "abc123",
            "mlflow_url": "http://127.0.0.1:5000/#/experiments/1/runs/abc123",
            "started_at": STARTED,
            "trigger": trigger or {"kind": "rest", "by": "ops"},
        },
        "run.json",
    )
    rd.write(
        {
            "retrain": True,
            "reasons": ["calc: success 0.91 -> 0.45"],
            "summary": "breaking tool change",
            "window": "2026-12-02/2026-12-03",
            "rows": {"current": 750},
            "data_validation": "passed",
            "schema_version": 1,
        },
        "signals.json",
    )
    rd.write({"tests": [{**DRIFT, "detail": "not carried"}]}, "signals", "monitor", "drift_report.json")
    rd.write(
        {
            "counts": {"breaking": 2},
            "summary": "2 breaking changes",
            "changes": [
                {"kind": "renamed", "detail": "calculate -> calc"},
                {"kind": "type_changed", "description": "convert.value: number -> string"},
                "a change as plain text",
            ],
        },
        "signals",
        "monitor",
        "tooldiff.json",
    )
    rd.write(
        Comparisons(
            evals_valid=True,
            greedy={"2": _comparison(6, 16, "greedy_success"), "1": _comparison(18, 18, "greedy_success")},
            sampled={"2": _comparison(5, 14, "sampled_success"), "1": _comparison(17, 16, "sampled_success")},
        ),
        "comparisons.json",
    )
    for shard in (0, 1):
        rd.write(
            {"shard": shard, "episodes": 32, "success_rate": 0.25, "mean_reward": 0.4, "tokens": 900},
            "probe",
            f"shard-{shard}.json",
        )
    rd.write_lines(
        [
            {"step": 1, "reward_mean": 0.3, "success_rate": 0.2, "trained_tokens": 100},
            {"step": 2, "reward_mean": 0.6, "success_rate": 0.5, "trained_tokens": 120},
        ],
        "grpo",
        "metrics.jsonl",
    )
    rd.write(
        {"backend": "local", "address": "127.0.0.1:6390", "dashboard_url": "http://127.0.0.1:8265"}, "cluster.json"
    )
    rd.write({"started": 1.0, "finished": 2.0, "job_id": "raysubmit_xyz"}, "grpo_job.json")
    rd.record_timing("grpo", 1800.0, cpus=3)
    rd.record_timing("evaluate", 200.0, cpus=1)
    rd.write(_promotion(promote), "promotion.json")
    return settings, rd


def test_every_field_of_a_promoted_run_comes_from_its_file(tmp_path):
    settings, rd = full_run(tmp_path)
    s = collect_summary(settings, rd)
    assert (s.dag_id, s.run_id, s.run_dir) == (rd.dag_id, rd.run_id, str(rd.path))
    assert s.status == "promoted" and s.skip_reason is None
    assert s.started_at == STARTED and datetime.fromisoformat(s.finished_at) > datetime.fromisoformat(STARTED)
    # the run's wall time is from run.json's start to the summary's finish (STARTED is half an hour before collection)
    finished = datetime.fromisoformat(s.finished_at)
    assert s.wall_s == pytest.approx((finished - datetime.fromisoformat(STARTED)).total_seconds(), abs=1e-3)
    assert s.wall_s > 1790
    assert s.trigger == {"kind": "rest", "by": "ops"}
    sig = s.signals
    assert (sig.retrain, sig.summary, sig.window, sig.rows, sig.data_validation) == (
        True,
        "breaking tool change",
        "2026-12-02/2026-12-03",
        {"current": 750},
        "passed",
    )
    assert sig.reasons == ["calc: success 0.91 -> 0.45"]
    assert sig.drift == [DRIFT], "the digest keeps the six figures the page shows"
    assert sig.tooldiff == {
        "breaking": 2,
        "summary": "2 breaking changes",
        "changes": [
            "renamed: calculate -> calc",
            "type_changed: convert.value: number -> string",
            "a change as plain text",
        ],
    }
    assert s.target_toolset == "2" and s.guard_toolsets == ["1"]
    assert s.greedy["2"].difference.mean == pytest.approx(0.5) and s.sampled["1"].difference.mean == pytest.approx(
        -0.05
    )
    assert [p["shard"] for p in s.probe] == [0, 1] and s.probe[0]["episodes"] == 32
    assert s.training["steps"] == 2 and s.training["first_reward"] == 0.3 and s.training["final_reward"] == 0.6
    assert s.training["trained_tokens"] == 220
    assert s.promotion == rd.read("promotion.json")
    assert (s.champion_version, s.challenger_version) == ("3", "4")
    assert s.links == {
        "mlflow_run": "http://127.0.0.1:5000/#/experiments/1/runs/abc123",
        "ray_dashboard": "http://127.0.0.1:8265",
        "ray_job_id": "raysubmit_xyz",
        "airflow_run": f"/dags/continuous_post_training/runs/{rd.run_id}",
        "run_dir": str(rd.path),
    }
    assert s.timings == {"evaluate": 200.0, "grpo": 1800.0}
    # and it is what summary.json holds: the page reads it back unchanged
    assert RunSummary.model_validate_json(s.model_dump_json()) == s


def test_the_text_summary_shows_every_part_of_a_promoted_run(tmp_path):
    settings, rd = full_run(tmp_path)
    s = collect_summary(settings, rd)
    text = format_summary(s)
    lines = text.splitlines()
    assert lines[0] == lines[-1] == "=" * 78
    assert lines[1] == f"continuous_post_training {rd.run_id}: PROMOTED"
    assert "  trigger: rest" in lines
    assert "  signals 2026-12-02/2026-12-03: retrain=True; breaking tool change" in lines
    for kind in ("greedy", "sampled"):
        for reg in ("2", "1"):
            c = getattr(s, kind)[reg]
            assert (
                f"  [{kind:7s}] toolset v{reg}: champion {format_interval(c.champion.model_dump())} -> "
                f"challenger {format_interval(c.challenger.model_dump())}  "
                f"diff {format_interval(c.difference.model_dump(), points=True)}"
            ) in lines
    assert "  decision: PROMOTED evergreen-agent version 4; aliases {'champion': '4', 'previous': '3'}" in lines
    assert "  cost $0.0456 (run $0.0123); PROMOTE evergreen-agent: greedy_success +50 pts" in lines
    wall = next(line for line in lines if line.startswith("  wall "))
    assert wall.endswith("; evaluate 200s, grpo 1800s")
    for name, url in s.links.items():
        assert f"  {name}: {url}" in lines
    assert "skipped" not in text


def test_a_not_promoted_run_formats_its_decision(tmp_path):
    settings, rd = full_run(tmp_path, promote=False, trigger={"kind": "cli"})
    s = collect_summary(settings, rd)
    assert s.status == "not_promoted" and s.challenger_version == "4"
    assert s.links["airflow_run"] is None, "a run from the command line has no Airflow run"
    text = format_summary(s)
    assert ": NOT_PROMOTED" in text.splitlines()[1]
    assert "  decision: not promoted evergreen-agent version 4;" in text and "HOLD evergreen-agent" in text
    assert "airflow_run" not in text


def test_a_not_promoted_run_names_the_champion_it_was_measured_against(tmp_path):
    settings, rd = full_run(tmp_path, promote=False)
    assert collect_summary(settings, rd).champion_version == "3"


def test_a_skipped_run_collects_and_formats(tmp_path):
    settings = _settings(tmp_path)
    rd = _rd(settings, "scheduled__2026-12-03T04:00:00+00:00")
    rd.write(
        {
            "retrain": False,
            "summary": "no drift",
            "window": "2026-12-02/2026-12-03",
            "rows": {"current": 500},
            "data_validation": "passed",
        },
        "signals.json",
    )
    rd.write({"train": False, "reason": "no drift and no breaking tool change"}, "should_train.json")
    rd.write({"skipped": True, "reason": "no drift and no breaking tool change"}, "skip.json")
    out = summarize(settings, rd)  # no MLflow run was opened: nothing to close
    assert out == {"status": "skipped", "summary": str(rd.path / "summary.json")}
    s = RunSummary.model_validate_json((rd.path / "summary.json").read_text())
    assert s.status == "skipped" and s.skip_reason == "no drift and no breaking tool change"
    assert s.greedy is s.sampled is s.promotion is s.champion_version is s.wall_s is None
    assert s.training == {"steps": 0} and s.probe == [] and s.timings == {}
    text = format_summary(s)
    assert ": SKIPPED" in text.splitlines()[1]
    assert "  skipped: no drift and no breaking tool change" in text
    assert "  signals 2026-12-02/2026-12-03: retrain=False; no drift" in text
    assert "decision:" not in text and "[greedy" not in text and "wall" not in text


def test_a_run_that_failed_midway_collects_and_formats(tmp_path):
    settings = _settings(tmp_path)
    rd = _rd(settings)
    rd.write({"mlflow_url": None, "started_at": STARTED, "trigger": {"kind": "rest"}}, "run.json")
    rd.write(
        {"shard": 0, "episodes": 32, "success_rate": 0.25, "mean_reward": 0.4, "tokens": 900}, "probe", "shard-0.json"
    )
    rd.record_timing("probe_rollouts_0", 40.0, cpus=0.5)
    rd.write({"started": 1.0}, "grpo_job.json")  # the GRPO job started and never finished
    s = collect_summary(settings, rd)
    assert s.status == "failed" and s.promotion is None and s.challenger_version is None
    assert len(s.probe) == 1 and s.timings == {"probe_rollouts_0": 40.0} and s.links["ray_job_id"] is None
    text = format_summary(s)
    assert ": FAILED" in text.splitlines()[1] and "probe_rollouts_0 40s" in text
    assert "decision:" not in text and "mlflow_run" not in text


def test_a_run_that_failed_before_its_first_file_still_formats(tmp_path):
    settings = _settings(tmp_path)
    rd = _rd(settings)
    s = collect_summary(settings, rd)
    assert s.status == "failed" and s.started_at is None and s.wall_s is None and s.trigger == {}
    assert s.signals.retrain is None and s.signals.tooldiff == {"breaking": 0, "summary": None, "changes": []}
    text = format_summary(s)
    assert ": FAILED" in text and "  trigger: unknown" in text
    assert json.loads(s.model_dump_json())["status"] == "failed"


def test_preflight_names_what_to_fix_before_the_run_spends_anything(tmp_path):
    import pytest

    from tasks.config import load_settings
    from tasks.promotion.cost import PriceKeyError, PriceTableError
    from tasks.stages.report import preflight

    def settings(**over):
        return load_settings(environ={}, overrides={"run_dir": str(tmp_path), **over})

    preflight(settings())  # the shipped configuration passes
    with pytest.raises(PriceKeyError, match="cost.cpu_price"):
        preflight(settings(cost={"cpu_price": "no-such-instance"}))
    with pytest.raises(PriceTableError, match="does not exist"):
        preflight(settings(cost={"prices_file": str(tmp_path / "prices.yaml")}))
    with pytest.raises(PriceKeyError, match="gpu"):  # a GPU run needs its GPU price
        preflight(settings(cost={"gpu_price": "nope"}, rollout={"gpus_per_worker": 0.5}))
    with pytest.raises(ValueError, match="env.target_toolset"):
        preflight(settings(env={"target_toolset": str(tmp_path / "missing.json")}))
