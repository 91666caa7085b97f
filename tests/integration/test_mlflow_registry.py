"""MLflow tracking and the registry against a real `mlflow server` (SQLite) with artifacts on a real S3
endpoint (moto server): a run logged as the pipeline logs it, alias moves once per run key, checksum
refusal at load, a server that is down, and no credential anywhere."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

pytestmark = pytest.mark.integration
NAME = "evergreen-agent-test"


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    from tasks.config import load_settings
    from tasks.envs.toolset import load_toolset
    from tasks.policy.model import build_model, save_model

    out = {}
    for version, seed in (("1", 0), ("2", 1)):
        s = load_settings(environ={}, overrides={"model": {"seed": seed}})
        model, tok = build_model(s.model)
        out[version] = save_model(
            model, tok, tmp_path_factory.mktemp(f"m{version}") / "model", toolset=load_toolset(version)
        )
    return out


def _log_pipeline_run(tracker, settings, model_dir: Path, tmp_path: Path, run_key: str):
    drift = {"drifted": True, "reasons": ["calc: success rate 0.91 -> 0.45"]}
    (tmp_path / "docs").mkdir(parents=True, exist_ok=True)
    (tmp_path / "docs" / "index.html").write_text("<html>gx</html>")
    with tracker.pipeline_run(
        "nightly",
        settings=settings,
        tags={
            "airflow.dag_id": "continuous_post_training",
            "airflow.run_id": run_key,
            "evergreen.registry_hash": "sha256:abc",
        },
    ) as run:
        with tracker.stage("rollouts"):
            for step in range(3):
                tracker.log_metrics({"reward_mean": 0.2 * step, "tokens": 1000 * step}, step=step)
        with tracker.stage("training"):
            tracker.log_metrics({"loss": 0.5}, step=1)
        with tracker.stage("evals"):
            tracker.log_metrics({"target": {"challenger": 0.8, "champion": 0.3}})
            tracker.log_dict({"rows": [{"task_id": "t0", "greedy_success": 1.0}]}, "evals/table.json")
        digest = tracker.log_dataset(
            pd.DataFrame({"trace_id": ["a", "b"], "workload": ["calc", "lookup"]}),
            name="traces-2026-12-01",
            source="s3://prod-traces/agent/",
            context="training",
        )
        tracker.log_dict(drift, "signals/drift_report.json")
        tracker.log_artifacts(tmp_path / "docs", "signals/gx_docs")
        tracker.log_artifacts(model_dir, "model")
        tracker.log_metrics({"cost.run_usd": 0.03})
    return run, digest


def test_a_pipeline_run_is_logged_with_nested_stages_inputs_artifacts_and_tags(mlflow_server, s3, model_dirs, tmp_path):
    from mlflow import MlflowClient

    from tasks.config import load_settings
    from tasks.tracking import Tracker

    tracker = Tracker(mlflow_server.uri, experiment="evergreen-it")
    run, digest = _log_pipeline_run(
        tracker, load_settings(environ={}), model_dirs["1"], tmp_path, "manual__2026-12-01T00:00:00+00:00"
    )
    client = MlflowClient()
    got = client.get_run(run.info.run_id)
    assert got.data.params["grpo.lr"] == str(load_settings(environ={}).grpo.lr)
    assert got.data.tags["airflow.dag_id"] == "continuous_post_training"
    assert got.data.tags["evergreen.registry_hash"] == "sha256:abc"
    assert got.inputs.dataset_inputs[0].dataset.digest == digest
    children = client.search_runs([run.info.experiment_id], f"tags.mlflow.parentRunId = '{run.info.run_id}'")
    assert sorted(c.data.tags["evergreen.stage"] for c in children) == ["evals", "rollouts", "training"]
    rollouts = next(c for c in children if c.data.tags["evergreen.stage"] == "rollouts")
    assert [m.step for m in client.get_metric_history(rollouts.info.run_id, "reward_mean")] == [0, 1, 2]
    names = {a.path for a in client.list_artifacts(run.info.run_id, "model")}
    assert {"model/model.safetensors", "model/checksums.json", "model/tool_registry.json"} <= names
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="mlflow-artifacts").get("Contents", [])]
    assert any(k.endswith("model/model.safetensors") for k in keys), "artifacts live on the S3 endpoint"


def test_promotion_moves_aliases_once_per_run_key_and_rollback(mlflow_server, model_dirs, tmp_path):
    from tasks.config import load_settings
    from tasks.promotion.registry import ModelRegistry
    from tasks.tracking import Tracker

    tracker = Tracker(mlflow_server.uri, experiment="evergreen-it")
    settings = load_settings(environ={})
    reg = ModelRegistry(NAME)
    run1, _ = _log_pipeline_run(tracker, settings, model_dirs["1"], tmp_path / "a", "run-a")
    v1 = reg.register(run1.info.run_id, "model", run_key="run-a", tags={"registry_hash": "h1"})
    assert reg.promote(v1, run_key="run-a")["moved"]
    assert reg.aliases() == {"champion": v1}

    run2, _ = _log_pipeline_run(tracker, settings, model_dirs["2"], tmp_path / "b", "run-b")
    v2 = reg.register(run2.info.run_id, "model", run_key="run-b", tags={"registry_hash": "h2"})
    assert reg.register(run2.info.run_id, "model", run_key="run-b") == v2, "a retried step registers nothing new"
    reg.set_challenger(v2)
    first = reg.promote(v2, run_key="run-b", decision={"promote": True, "reasons": ["gain"]})
    assert first["moved"] and reg.aliases() == {"champion": v2, "previous": v1}
    again = reg.promote(v2, run_key="run-b")
    assert not again["moved"] and reg.aliases() == {"champion": v2, "previous": v1}
    versions = reg.client.search_model_versions(f"name = '{NAME}'")
    assert sorted(v.version for v in versions) == sorted([v1, v2])
    assert json.loads(reg.client.get_model_version(NAME, v2).tags["evergreen.decision_detail"])["promote"]

    back = reg.rollback(run_key="rollback-1")
    assert back["moved"] and reg.aliases() == {"champion": v1, "previous": v2}
    assert not reg.rollback(run_key="rollback-1")["moved"] and reg.aliases()["champion"] == v1


def test_an_interrupted_promotion_finishes_on_retry(mlflow_server, model_dirs, tmp_path):
    """The journal is written before the first alias moves: a crash between moves is repaired by the retry."""
    from tasks.promotion.registry import CHAMPION, ModelRegistry
    from tasks.tracking import Tracker

    reg = ModelRegistry(NAME + "-crash")
    tracker = Tracker(mlflow_server.uri, experiment="evergreen-it")
    with tracker.pipeline_run("x"):
        tracker.log_artifacts(model_dirs["1"], "model")
        run_id = tracker.mlflow.active_run().info.run_id
    v1 = reg.register(run_id, "model", run_key="c1")
    reg.promote(v1, run_key="c1")
    with tracker.pipeline_run("y"):
        tracker.log_artifacts(model_dirs["2"], "model")
        run_id = tracker.mlflow.active_run().info.run_id
    v2 = reg.register(run_id, "model", run_key="c2")

    calls = {"n": 0}
    real = reg.client.set_registered_model_alias

    def crash_on_champion(name, alias, version):
        if alias == CHAMPION:
            calls["n"] += 1
            raise ConnectionError("server went away between the two alias moves")
        return real(name, alias, version)

    reg.client.set_registered_model_alias = crash_on_champion
    with pytest.raises(ConnectionError):
        reg.promote(v2, run_key="c2")
    reg.client.set_registered_model_alias = real
    assert reg.aliases() == {"champion": v1, "previous": v1}, "half-way state after the crash"
    assert reg.promote(v2, run_key="c2")["moved"]
    assert reg.aliases() == {"champion": v2, "previous": v1}


def test_a_tampered_artifact_is_refused_at_load_through_models_uri(mlflow_server, s3, model_dirs, tmp_path):
    from tasks.policy.model import load_model
    from tasks.promotion.registry import ModelRegistry
    from tasks.storage import ChecksumError
    from tasks.tracking import Tracker

    tracker = Tracker(mlflow_server.uri, experiment="evergreen-it")
    with tracker.pipeline_run("tamper"):
        tracker.log_model(model_dirs["1"])  # the registry's layout: the directory under the MLflow model's model/
        run_id = tracker.mlflow.active_run().info.run_id
    reg = ModelRegistry(NAME + "-tamper")
    reg.promote(reg.register(run_id, "model", run_key="t1"), run_key="t1")
    model, _, _ = load_model(f"models:/{NAME}-tamper@champion", cache_dir=tmp_path / "ok")
    key = next(
        o["Key"]
        for o in s3.list_objects_v2(Bucket="mlflow-artifacts")["Contents"]
        if run_id in o["Key"] and o["Key"].endswith("model/config.json")
    )
    body = s3.get_object(Bucket="mlflow-artifacts", Key=key)["Body"].read()
    s3.put_object(Bucket="mlflow-artifacts", Key=key, Body=body.replace(b'"hidden_size": 128', b'"hidden_size": 256'))
    with pytest.raises(ChecksumError, match="config.json"):
        load_model(f"models:/{NAME}-tamper@champion", cache_dir=tmp_path / "bad")


def test_a_registered_model_is_an_mlflow_transformers_model_and_evergreen_loads_its_directory(
    mlflow_server, s3, model_dirs, tmp_path
):
    import mlflow
    import mlflow.transformers

    from tasks.policy.model import load_model
    from tasks.promotion.registry import ModelRegistry
    from tasks.tracking import Tracker

    tracker = Tracker(mlflow_server.uri, experiment="evergreen-it")
    with tracker.pipeline_run("flavor"):
        tracker.log_model(model_dirs["2"])
        run_id = tracker.mlflow.active_run().info.run_id
    reg = ModelRegistry(NAME + "-flavor")
    reg.promote(reg.register(run_id, "model", run_key="f1"), run_key="f1")
    uri = f"models:/{NAME}-flavor@champion"

    info = mlflow.models.get_model_info(uri)  # MLflow's own reading of the MLmodel file
    assert {"transformers", "python_function"} <= set(info.flavors)
    assert info.flavors["transformers"]["inference_task"] == "llm/v1/chat"
    pipe = mlflow.transformers.load_model(uri)
    assert type(pipe.model).__name__ == "LlamaForCausalLM"
    answer = mlflow.pyfunc.load_model(uri).predict({"messages": [{"role": "user", "content": "2+3?"}], "max_tokens": 8})
    assert answer[0]["choices"][0]["message"]["role"] == "assistant"

    # Evergreen's loader takes the model directory inside, checksums verified, the toolset file beside it
    model, chat, directory = load_model(uri, cache_dir=tmp_path / "evergreen")
    assert directory.name == "model" and (directory.parent / "MLmodel").exists()
    assert (directory / "tool_registry.json").exists() and chat.tokenizer is not None
    names = {a.path for a in mlflow.MlflowClient().list_artifacts(run_id, "model")}
    assert {"model/MLmodel", "model/model", "model/components"} <= names


def test_server_down_fails_cleanly_and_leaves_aliases(mlflow_server, model_dirs):
    import time

    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from tasks.promotion.registry import ModelRegistry

    live = ModelRegistry(NAME)
    before = live.aliases()
    dead = MlflowClient(tracking_uri="http://127.0.0.1:9")  # nothing listens on the discard port
    started = time.monotonic()
    with pytest.raises((MlflowException, OSError)):
        ModelRegistry(NAME, client=dead).promote("1", run_key="while-down")
    assert time.monotonic() - started < 120, "a down server must fail the step, not hang it"
    assert live.aliases() == before


def test_no_credential_in_params_tags_artifacts_or_logs(mlflow_server, s3, tmp_path):
    """Runs after the others in this module: every param, tag, artifact and server log line of the test run."""
    from mlflow import MlflowClient

    secret = s3.secret_for_tests
    client = MlflowClient()
    found = []
    for exp in client.search_experiments():
        for run in client.search_runs([exp.experiment_id]):
            text = json.dumps({"params": run.data.params, "tags": run.data.tags})
            if secret in text:
                found.append(f"run {run.info.run_id} params/tags")
    for obj in s3.list_objects_v2(Bucket="mlflow-artifacts").get("Contents", []):
        if secret.encode() in s3.get_object(Bucket="mlflow-artifacts", Key=obj["Key"])["Body"].read():
            found.append(obj["Key"])
    for log in (mlflow_server.log_path, s3.log_path):
        if secret in Path(log).read_text(errors="replace"):
            found.append(str(log))
    assert not found, f"test credentials leaked into: {found}"


def _comparisons(target_champion, target_challenger, guard_champion, guard_challenger, n=150):
    import numpy as np

    from tasks.evals.harness import EvalResult, compare

    def table(p):
        rng = np.random.default_rng(int(p * 1000))
        hits = np.zeros(n)
        hits[rng.choice(n, int(round(p * n)), replace=False)] = 1
        return EvalResult([{"task_id": f"t{i}", "greedy_success": float(h)} for i, h in enumerate(hits)])

    return {
        "2": compare(table(target_challenger), table(target_champion), "greedy_success", 500),
        "1": compare(table(guard_challenger), table(guard_champion), "greedy_success", 500),
    }


@pytest.mark.parametrize("gain, promoted", [(0.50, True), (0.0, False)])
def test_promotion_step_decides_logs_and_moves(mlflow_server, model_dirs, gain, promoted):
    from tasks.config import load_settings
    from tasks.promotion.cost import StageUsage
    from tasks.promotion.registry import ModelRegistry
    from tasks.promotion.step import apply_decision, judge, price_run
    from tasks.tracking import Tracker

    def promotion_step(settings, comparisons, validations, stages, run_id, run_key, tracker):
        report = price_run(settings, comparisons, stages)
        decision = judge(settings, comparisons, validations, report)
        return apply_decision(settings, decision, report, comparisons, run_id, run_key, tracker)

    name = f"{NAME}-step-{int(gain * 100)}"
    settings = load_settings(environ={}, overrides={"promotion": {"model_name": name}})
    tracker = Tracker(mlflow_server.uri, experiment="evergreen-it")
    registry = ModelRegistry(name)
    with tracker.pipeline_run("champion"):
        tracker.log_artifacts(model_dirs["1"], "model")
        champion_version = registry.register(tracker.mlflow.active_run().info.run_id, "model", run_key="boot")
        registry.promote(champion_version, run_key="boot")
    with tracker.pipeline_run("nightly") as run:
        tracker.log_artifacts(model_dirs["2"], "model")
        result = promotion_step(
            settings,
            _comparisons(0.3, 0.3 + gain, 0.9, 0.9),
            {"data": True, "evals": True},
            [StageUsage("grpo", 600, cpus=2, tokens_generated=10_000)],
            run.info.run_id,
            run_key="nightly-1",
            tracker=tracker,
        )
        again = promotion_step(
            settings,
            _comparisons(0.3, 0.3 + gain, 0.9, 0.9),
            {"data": True, "evals": True},
            [StageUsage("grpo", 600, cpus=2, tokens_generated=10_000)],
            run.info.run_id,
            run_key="nightly-1",
            tracker=tracker,
        )
    assert result["decision"]["promote"] is promoted and again["version"] == result["version"]
    aliases = registry.aliases()
    if promoted:
        assert aliases == {"champion": result["version"], "previous": champion_version}
        assert result["move"]["moved"] and not again["move"]["moved"]
    else:
        assert aliases == {"champion": champion_version, "challenger": result["version"]}
        tags = registry.client.get_model_version(name, result["version"]).tags
        assert tags["evergreen.decision"] == "not_promoted" and "target_gain" in tags["evergreen.decision_detail"]
    logged = registry.client.get_run(run.info.run_id)
    assert logged.data.tags["evergreen.decision"] == ("promoted" if promoted else "not_promoted")
    assert "cost.run_usd" in logged.data.metrics


def test_a_challenger_is_not_promoted_over_a_champion_that_moved_since_it_was_measured(mlflow_server, model_dirs):
    """Run A measured its challenger against version 1; meanwhile run B promoted version 2. A's winning
    decision is held with the reason, and the aliases stay as B left them."""
    from tasks.config import load_settings
    from tasks.promotion.cost import StageUsage
    from tasks.promotion.registry import ModelRegistry
    from tasks.promotion.step import apply_decision, judge, price_run
    from tasks.tracking import Tracker

    name = f"{NAME}-moved"
    settings = load_settings(environ={}, overrides={"promotion": {"model_name": name}})
    tracker = Tracker(mlflow_server.uri, experiment="evergreen-it")
    registry = ModelRegistry(name)
    runs = {}
    for key, model in (("boot", "1"), ("run-b", "2"), ("run-a", "2")):
        with tracker.pipeline_run(key) as run:
            tracker.log_artifacts(model_dirs[model], "model")
            runs[key] = run.info.run_id
    first = registry.register(runs["boot"], "model", run_key="boot")
    registry.promote(first, run_key="boot")
    second = registry.register(runs["run-b"], "model", run_key="run-b")
    registry.promote(second, run_key="run-b")  # run B wins the race

    comparisons = _comparisons(0.3, 0.8, 0.9, 0.9)
    report = price_run(settings, comparisons, [StageUsage("grpo", 60, cpus=2, tokens_generated=1_000)])
    decision = judge(settings, comparisons, {"data": True, "evals": True}, report)
    assert decision.promote  # against the champion it measured, A wins
    with tracker.within(runs["run-a"]):
        result = apply_decision(
            settings, decision, report, comparisons, runs["run-a"], "run-a", tracker, champion_version=first
        )
    assert result["decision"]["promote"] is False and not result["move"]["moved"]
    assert "champion moved from version 1 to 2" in result["decision"]["reasons"][0]
    assert registry.aliases()["champion"] == second and registry.aliases()["previous"] == first
