"""`python -m tasks demo` end to end with tiny budgets: the DAGs' stage functions in one process (bootstrap,
simulated production, the monitor's check, signals, a local Ray head, probes, the GRPO job, evals, cost,
gate, model registry, summary), run as a user runs it, against an MLflow server whose tracking URI carries
credentials: none of them may appear in the output, the run's files, or what MLflow keeps (params, tags,
artifacts). The run is kept on S3 (`run_dir: s3://...`) and its stages take turns on two scratch
directories that share nothing, as tasks on two machines do (tasks.stages.demo.Workers): the run's
files are checked in a third copy pulled from the bucket."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def _leaks(secret: str, texts: dict[str, str], roots: list[Path], s3, buckets: list[str]) -> list[str]:
    """Where `secret` appears: in `texts`, in any file under `roots`, in any object of `buckets`."""
    needle = secret.encode()
    found = [name for name, text in texts.items() if secret in text]
    found += [str(f) for root in roots for f in root.rglob("*") if f.is_file() and needle in f.read_bytes()]
    for bucket in buckets:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            found += [
                f"s3://{bucket}/{o['Key']}"
                for o in page.get("Contents", [])
                if needle in s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
            ]
    return found


def test_the_command_line_demo_runs_the_stages_and_writes_their_artifacts(settings, tmp_path, mlflow_server, s3):
    from tasks.config import PROJECT_ROOT
    from tasks.stages.contracts import RunSummary

    secret = f"grep-me-{secrets.token_hex(8)}"
    tag = secrets.token_hex(4)  # the session's MLflow server is shared: this run's own experiment and model
    runs_bucket = f"evergreen-runs-{tag}"
    s3.create_bucket(Bucket=runs_bucket)
    s = settings.model_copy(
        update={
            "run_dir": f"s3://{runs_bucket}/demo",
            "scratch_dir": tmp_path / "scratch",
            "tracking": settings.tracking.model_copy(
                update={
                    "uri": mlflow_server.uri.replace("http://", f"http://evergreen:{secret}@"),
                    "experiment": f"cli-{tag}",
                }
            ),
            "promotion": settings.promotion.model_copy(update={"model_name": f"cli-agent-{tag}"}),
            "bootstrap": settings.bootstrap.model_copy(update={"steps": 3, "batch_size": 8}),
            "grpo": settings.grpo.model_copy(
                update={"steps": 2, "tasks_per_step": 4, "checkpoint_every": 1, "production_share": 0.5}
            ),
            "rollout": settings.rollout.model_copy(update={"group_size": 2}),
            "simulate": settings.simulate.model_copy(update={"traces": 240}),
        }
    )
    (tmp_path / "settings.json").write_text(s.model_dump_json())
    # a user's shell: not the test session's Ray cluster
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_") or k == "RAY_TRAIN_V2_ENABLED"}
    proc = subprocess.run(
        [sys.executable, "-m", "tasks", "--settings", str(tmp_path / "settings.json"), "demo"],
        capture_output=True,
        text=True,
        timeout=1500,
        cwd=PROJECT_ROOT,
        env={**env, "PYTHONPATH": str(PROJECT_ROOT)},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = proc.stdout
    from tasks.mirror import Mirror

    # what the bucket holds is the run: a third copy, pulled, checksums checked object by object
    objects = [o for p in s3.get_paginator("list_objects_v2").paginate(Bucket=runs_bucket) for o in p["Contents"]]
    assert all(s3.head_object(Bucket=runs_bucket, Key=o["Key"])["Metadata"].get("sha256") for o in objects)
    Mirror(f"s3://{runs_bucket}/demo/continuous_post_training", tmp_path / "demo").pull()
    runs = list((tmp_path / "demo").glob("*/summary.json"))
    assert len(runs) == 1
    workers = [tmp_path / "scratch" / f"worker-{i}" / "continuous_post_training" / runs[0].parent.name for i in (0, 1)]
    assert all((w / ".mirror.json").exists() for w in workers), "both workers ran stages of the run"
    summary = RunSummary.model_validate_json(runs[0].read_text())
    assert summary.status in ("promoted", "not_promoted") and summary.trigger["kind"] == "cli"
    assert summary.trigger["asset_events"][0]["extra"]["retrain"], "the monitor's check asked for retraining"
    assert "toolset v2" in out and "toolset v1" in out and "decision:" in out
    for kind in ("greedy", "sampled"):
        for toolset in ("1", "2"):
            d = getattr(summary, kind)[toolset].difference
            assert d.low <= d.mean <= d.high
    assert summary.signals.retrain and summary.training["steps"] == 2
    promo = summary.promotion
    assert {c["name"] for c in promo["decision"]["checks"]} >= {
        "target_gain",
        "gain_per_dollar",
        "validation:data",
        "validation:evals",
        "guard:registry_v1",
    }
    assert promo["cost"]["run_usd"] > 0 and promo["aliases"]["champion"]
    if promo["decision"]["promote"]:  # the challenger alias is consumed by the move
        assert promo["aliases"]["champion"] == promo["version"] and "challenger" not in promo["aliases"]
    else:
        assert promo["aliases"]["challenger"] == promo["version"] != promo["aliases"]["champion"]
    # the same stage records as a DAG run: timings priced, the run's cluster gone
    assert {"validate_data", "probe_rollouts_0", "probe_rollouts_1", "grpo", "evaluate"} <= set(summary.timings)
    rd = runs[0].parent
    assert json.loads((rd / "should_train.json").read_text())["train"] is True
    # tasks from the window's traces: round(0.5 * 3) = 2 of each step's 3 target tasks (4 with 1 guard)
    production = json.loads((rd / "signals.json").read_text())["production_tasks"]
    assert production["used"] and production["train"] > 0, production
    trained = {
        json.loads(line)["task_id"]
        for f in (rd / "grpo" / "rollouts").glob("*/*.jsonl")
        for line in f.read_text().splitlines()
    }
    assert any(t.startswith("desk-prod-") for t in trained), sorted(trained)[:10]
    held = {json.loads(line)["task_id"] for line in (rd / "production_tasks" / "eval.jsonl").read_text().splitlines()}
    assert not trained & held
    assert (rd / "grpo" / "model" / "model.safetensors").exists()
    assert len((rd / "eval_challenger_v2.jsonl").read_text().splitlines()) == s.eval.num_tasks
    from tasks.rl.cluster import LocalHead, local_temp_dir

    assert LocalHead("", local_temp_dir(f"continuous_post_training/{summary.run_id}"), None, {}).pids() == []
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=mlflow_server.uri)
    runs = client.search_runs([client.get_experiment_by_name(s.tracking.experiment).experiment_id])
    stages = sorted(r.data.tags.get("evergreen.stage", "") for r in runs)
    assert stages == ["", "", "bootstrap", "evals", "promotion", "signals", "training"], stages
    assert summary.links["mlflow_run"].startswith(mlflow_server.uri + "/#/experiments/")

    # the credentials: nowhere in the output, the run's files, MLflow's store (params, tags) or its artifacts
    texts = {"stdout": proc.stdout, "stderr": proc.stderr, "server log": mlflow_server.log_path.read_text()}
    texts |= {f"{r.info.run_id} params/tags": json.dumps([r.data.params, r.data.tags]) for r in runs}
    for credential in (secret, s3.secret_for_tests):
        assert (
            _leaks(
                credential,
                texts,
                [tmp_path / "demo", tmp_path / "scratch", mlflow_server.log_path.parent],
                s3,
                ["mlflow-artifacts", runs_bucket],
            )
            == []
        ), credential
