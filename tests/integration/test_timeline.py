"""`python -m tasks timeline` on a 3-day, tiny-budget month (issue 20): real traffic through vLLM, the drift monitor,
retrains through the DAG's stage functions on one Ray head a day, alias moves in each policy's own MLflow registry,
the cost ledger, the report and the chart. Day 1 ships a breaking tool change (v1 -> v2); day 2 brings malformed
traffic. Run as a user runs it (a subprocess, outside the test session's Ray cluster)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

MONTH = {
    "timeline.days": 3,
    "timeline.toolsets": [{"day": 0, "toolset": "1"}, {"day": 1, "toolset": "2"}],
    "timeline.malformed_day": 2,
    "timeline.mix_shift": {"start_day": 1, "days": 2, "to": {"calc": 2, "convert": 1, "lookup": 1}},
    "timeline.traces_per_day": 60,
    "timeline.policies": ["never", "nightly", "evergreen"],
    "timeline.retrain": {
        "grpo.steps": 1,
        "grpo.tasks_per_step": 4,
        "grpo.checkpoint_every": 1,
        "grpo.validation_tasks": 0,
        "grpo.demo_coef": 0.0,
        # every run probes its fallback (`previous`, once a promotion has made one): the path that lets a retrain
        # start from an older champion, at the cost of one more probe batch of 4 x 2 episodes
        "grpo.init_fallback_below": 1.0,
        "rollout.group_size": 2,
        "eval.num_tasks": 10,
        "eval.samples": 1,
        "eval.interval_resamples": 200,
    },
    "drift.min_samples": 15,
    "drift.reference_days": 2,
    "env.max_tokens_per_turn": 48,
}


def test_a_three_day_month_runs_every_policy_and_reports_it(tmp_path):
    from mlflow import MlflowClient

    from tasks.config import PROJECT_ROOT
    from tests.taught import taught_model

    champion, _, _ = taught_model(tmp_path / "champion")
    out = tmp_path / "timeline"
    sets = [f"--set={k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in MONTH.items()]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_") or k == "RAY_TRAIN_V2_ENABLED"}

    def timeline(timeout: int) -> subprocess.CompletedProcess:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "tasks",
                *sets,
                f"--set=timeline.champion={champion}",
                "timeline",
                "--out",
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=PROJECT_ROOT,
            env={**env, "PYTHONPATH": str(PROJECT_ROOT), "EVERGREEN_RUN_DIR": str(tmp_path / "runs")},
        )

    proc = timeline(1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    by = {p["policy"]: p for p in report["policies"]}
    assert report["days"] == 3 and set(by) == {"never", "nightly", "evergreen"}
    days = {d: json.loads((out / "days" / f"day-{d:02d}.json").read_text()) for d in range(3)}

    # the same traffic for a model whoever deploys it: every policy served the champion on day 0
    assert len({days[0][p]["success"] for p in by}) == 1 and days[0]["never"]["workloads"]
    assert by["never"]["retrains"] == 0 and by["never"]["usd"] == 0
    # nightly: a run every night; the malformed day's run fails its data validation and ships nothing
    nightly = [days[d]["nightly"] for d in range(3)]
    assert [r["retrained"] for r in nightly] == [True, True, True]
    assert [r["run_status"] for r in nightly] == ["promoted", "promoted", "failed"]  # no gate: whatever it said
    assert "forced" in " ".join(nightly[0]["gate"]) and nightly[1]["deployed_version"] != nightly[0]["deployed_version"]
    # day 1's run probed the champion before day 0's promotion (`previous`) on the same tasks, and trained from
    # whichever solved more of them
    run = out / "nightly" / "runs" / "continuous_post_training" / "timeline__day-01"
    probes = [json.loads(f.read_text()) for f in sorted((run / "probe").glob("shard-*.json"))]
    assert probes and all(p["fallbacks"]["previous"]["version"] == "1" for p in probes)
    init = json.loads((run / "init.json").read_text())
    assert init["alias"] in ("champion", "previous") and init["reason"]
    # evergreen: nothing to do on a quiet day, a retrain on the breaking change, none on malformed traffic
    ev = [days[d]["evergreen"] for d in range(3)]
    assert [r["retrained"] for r in ev[:2]] == [False, True]
    assert ev[1]["verdict"]["tool_change_breaking"] and "tool change" in ev[1]["verdict"]["reasons"][0]
    assert not ev[2]["promoted"] and report["goals"]["no_promotion_on_malformed_day"] is True
    # dollars are the runs' own cost ledgers; promotions are alias moves in each policy's registry
    ledgers = sum(
        json.loads(
            (out / "nightly" / "runs" / "continuous_post_training" / f"timeline__day-{d:02d}" / "cost.json").read_text()
        )["run_usd"]
        for d in (0, 1)
    )
    assert by["nightly"]["usd"] == pytest.approx(ledgers) and ledgers > 0
    registry = MlflowClient(tracking_uri=f"sqlite:///{out / 'nightly' / 'runs' / 'mlflow.db'}")
    champion_version = registry.get_model_version_by_alias("timeline-nightly", "champion").version
    assert str(champion_version) == str(json.loads((out / "nightly" / "state.json").read_text())["version"]) != "1"
    # the report and the chart
    png = (out / "timeline.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    table = (out / "report.md").read_text()
    assert "| nightly, no gate |" in table and "| Evergreen (drift + gate) |" in table
    # a rerun resumes: every day is written, nothing runs again
    again = timeline(300)
    assert again.returncode == 0 and "continuous_post_training" not in again.stderr, again.stderr[-2000:]
