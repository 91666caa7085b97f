"""The command-line loop end to end with tiny budgets: bootstrap, eval, GRPO on Ray Train, eval, summary."""
from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.integration


def test_demo_loop_runs_end_to_end_and_writes_its_artifacts(ray_head, settings, tmp_path, capsys):
    from tasks.pipeline import run_demo

    s = settings.model_copy(update={
        "run_dir": tmp_path / "demo",
        "bootstrap": settings.bootstrap.model_copy(update={"steps": 3, "batch_size": 8}),
        "grpo": settings.grpo.model_copy(update={"steps": 2, "tasks_per_step": 4, "checkpoint_every": 1}),
        "rollout": settings.rollout.model_copy(update={"group_size": 2}),
        "simulate": settings.simulate.model_copy(update={"traces": 240}),
    })
    summary = run_demo(s)
    out = capsys.readouterr().out
    assert "Evergreen demo" in out and "registry v2" in out and "registry v1" in out
    for reg in ("1", "2"):
        d = summary["sampled"][reg]["difference"]
        assert d["low"] <= d["mean"] <= d["high"] and d["n"] == s.eval.num_tasks
    assert [m["step"] for m in summary["grpo_metrics"]] == [1, 2]
    # production signals: the registry switched to v2 between the two simulated days
    assert summary["signals"]["retrain"] and summary["signals"]["tool_change_breaking"]
    assert "production signals" in out and "tool change" in out
    # one MLflow run (SQLite store under run_dir) with nested stages; the gate decided and the registry shows it
    promo = summary["promotion"]
    assert {c["name"] for c in promo["decision"]["checks"]} >= {"target_gain", "gain_per_dollar", "validation:data",
                                                                "validation:evals", "guard:registry_v1"}
    assert promo["cost"]["run_usd"] > 0 and promo["aliases"]["champion"]
    if promo["decision"]["promote"]:  # the challenger alias is consumed by the move
        assert promo["aliases"]["champion"] == promo["version"] and "challenger" not in promo["aliases"]
    else:
        assert promo["aliases"]["challenger"] == promo["version"] != promo["aliases"]["champion"]
    assert "promotion" in out and "MLflow:" in out
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'demo' / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name(s.tracking.experiment).experiment_id])
    stages = sorted(r.data.tags.get("evergreen.stage", "") for r in runs)
    assert stages == ["", "bootstrap", "evals", "signals", "training"]
    training = next(r for r in runs if r.data.tags.get("evergreen.stage") == "training")
    assert {"trained_tokens", "generated_tokens", "loss"} <= set(training.data.metrics)
    run = tmp_path / "demo"
    assert json.loads((run / "summary.json").read_text())["timings"]["grpo_s"] > 0
    assert (run / "signals" / "monitor" / "signals.json").exists() and (run / "signals" / "traces" / "manifest.json").exists()
    assert (run / "champion" / "model.safetensors").exists() and (run / "grpo" / "model" / "model.safetensors").exists()
    assert len((run / "eval_challenger_v2.jsonl").read_text().splitlines()) == s.eval.num_tasks
