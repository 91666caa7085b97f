"""The run's record: its MLflow pipeline run (open_run), the nested stage runs, and the summary at the end.

    info = open_run(settings, rd, trigger={"kind": "rest"})
    ...
    summarize(settings, rd)
    print(format_summary(RunSummary.model_validate_json(path.read_text())))

`format_summary` is the one text rendering of a run: the DAG's summarize log, `make demo` and
`python -m tasks demo` print it.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from tasks.config import Settings
    from tasks.rundir import RunDir
    from tasks.stages.contracts import RunSummary
    from tasks.tracking import Tracker

log = logging.getLogger(__name__)


def tracker_of(settings: Settings) -> Tracker:
    from tasks.tracking import Tracker

    return Tracker.from_settings(settings)


def stage_run(settings: Settings, rd: RunDir, name: str) -> AbstractContextManager[Any]:
    """A nested MLflow run `name` under the DAG run's pipeline run (opened by open_run)."""
    return tracker_of(settings).stage_of(rd.read("run.json")["mlflow_run_id"], name)


def preflight(settings: Settings) -> None:
    """What a run would otherwise find out after training: the price table and the chosen price keys, the
    toolsets (target and champion, read through the environment), the environment itself. Raises with the
    setting to fix. (The tracking server is reached when open_run opens the run; the champion is fetched
    by validate_data, whose skip path covers a deployment with none yet.)"""
    from tasks.envs import get_env
    from tasks.promotion.cost import load_prices

    prices = load_prices(settings.cost.prices_file)
    prices.choose("cpu", settings.cost.cpu_price)
    prices.choose("serving", settings.cost.serving_price)
    if settings.grpo.gpus_per_train_worker > 0 or settings.rollout.gpus_per_worker > 0:
        prices.choose("gpu", settings.cost.gpu_price)
    env = get_env(settings.env.name)
    for field in ("target_toolset", "champion_toolset"):
        try:
            env.load_toolset(getattr(settings.env, field))
        except Exception as e:
            raise ValueError(
                f"env.{field}={getattr(settings.env, field)!r} cannot be read: {type(e).__name__}: {e}"
            ) from e


def open_run(settings: Settings, rd: RunDir, trigger: dict) -> dict:
    """Open the DAG run's MLflow pipeline run (params = the effective settings); once per DAG run. Checks
    first what the run needs before it spends anything (preflight)."""
    existing = rd.read("run.json")
    if existing:  # a retried task must not open a second MLflow run
        return existing
    preflight(settings)
    from tasks.run_params import overrides_from_params

    tracker = tracker_of(settings)
    # what the run's params changed (tasks/run_params.py allowed it): a tag per field, and run.json for the page
    overrides = overrides_from_params(trigger.get("params") or {})
    run_id = tracker.open_run(
        rd.dag_id,
        settings=settings,
        tags={
            "airflow.dag_id": rd.dag_id,
            "airflow.run_id": rd.run_id,
            "evergreen.trigger": trigger.get("kind", ""),
            **{f"evergreen.override.{field}": json.dumps(value) for field, value in overrides.items()},
        },
    )
    info = {
        "dag_id": rd.dag_id,
        "run_id": rd.run_id,
        "run_dir": str(rd.path),
        "mlflow_run_id": run_id,
        "mlflow_url": tracker.url_of(run_id),
        "started_at": datetime.now(UTC).isoformat(),
        "trigger": trigger,
        "overrides": overrides,
    }
    rd.write(info, "run.json")
    log.info("run %s: MLflow run %s", rd.run_id, info["mlflow_url"])
    return info


def summarize(settings: Settings, rd: RunDir) -> dict:
    """The run's summary.json (the Evergreen page reads it), its MLflow status, and a printed summary;
    runs whatever happened upstream."""
    summary = collect_summary(settings, rd)
    rd.write(summary, "summary.json")
    run = rd.read("run.json") or {}
    if run.get("mlflow_run_id"):
        try:
            tracker = tracker_of(settings)
            with tracker.within(run["mlflow_run_id"]):
                tracker.log_artifact(rd.path / "summary.json")
            tracker.finish(run["mlflow_run_id"], "FAILED" if summary.status == "failed" else "FINISHED")
        except Exception as e:
            log.warning("could not close MLflow run %s: %s", run["mlflow_run_id"], e)
    log.info("%s", format_summary(summary))
    return {"status": summary.status, "summary": str(rd.path / "summary.json")}


def collect_summary(settings: Settings, rd: RunDir) -> RunSummary:
    """The RunSummary of whatever the run's stages left in its directory (cluster.json is the cluster
    setup's, grpo_job.json the GRPO job's)."""
    from tasks.rl.metrics import metrics_digest
    from tasks.stages.contracts import RunSummary, SignalsDigest
    from tasks.stages.rollouts import toolsets

    run = rd.read("run.json") or {}
    promotion, skip = rd.read("promotion.json"), rd.read("skip.json")
    status = (
        ("promoted" if promotion["decision"]["promote"] else "not_promoted")
        if promotion
        else "skipped"
        if skip
        else "failed"
    )
    signals = rd.read("signals.json") or {}
    drift = (rd.read("signals", "monitor", "drift_report.json") or {}).get("tests", [])
    tooldiff = rd.read("signals", "monitor", "tooldiff.json") or {}
    comparisons = rd.read("comparisons.json") or {}
    started = run.get("started_at")
    now = datetime.now(UTC)
    move = (promotion or {}).get("move") or {}
    return RunSummary(
        dag_id=rd.dag_id,
        run_id=rd.run_id,
        run_dir=str(rd.path),
        status=status,
        started_at=started,
        overrides=run.get("overrides") or {},
        finished_at=now.isoformat(),
        trigger=run.get("trigger", {}),
        skip_reason=(skip or {}).get("reason"),
        signals=SignalsDigest(
            **{k: signals.get(k) for k in ("retrain", "summary", "window", "rows", "data_validation")},
            production_tasks=signals.get("production_tasks") or {},
            reasons=signals.get("reasons", []),
            drift=[
                {k: t.get(k) for k in ("workload", "statistic", "effect", "p_adjusted", "significant", "verdict")}
                for t in drift
            ],
            tooldiff={
                "breaking": (tooldiff.get("counts") or {}).get("breaking", 0),
                "summary": tooldiff.get("summary"),
                "changes": [_change_text(c) for c in (tooldiff.get("changes") or [])][:40],
            },
        ),
        target_toolset=settings.env.target_toolset,
        guard_toolsets=toolsets(settings)[1:],
        greedy=comparisons.get("greedy"),
        sampled=comparisons.get("sampled"),
        probe=[json.loads(f.read_text()) for f in sorted((rd.path / "probe").glob("shard-*.json"))],
        training={
            **metrics_digest(rd.path / "grpo" / "metrics.jsonl"),
            **({"resumed_from": r} if (r := (rd.read("grpo_job.json") or {}).get("resumed_from")) else {}),
            # GRPO started from a grpo.init_fallback model, not the champion (tasks.stages.models.init_dir)
            **({"init": i} if (i := rd.read("init.json") or {}).get("alias", "champion") != "champion" else {}),
        },
        promotion=promotion,
        # the champion the challenger was measured against: the alias moved from it, or (not promoted) it
        # still holds it
        champion_version=(move.get("from") or promotion["aliases"].get("champion")) if promotion else None,
        challenger_version=(promotion or {}).get("version"),
        links={
            "mlflow_run": run.get("mlflow_url"),
            "ray_dashboard": (rd.read("cluster.json") or {}).get("dashboard_url"),
            "ray_job_id": (rd.read("grpo_job.json") or {}).get("job_id"),
            "airflow_run": None
            if run.get("trigger", {}).get("kind") == "cli"
            else f"/dags/{rd.dag_id}/runs/{rd.run_id}",
            "run_dir": str(rd.path),
        },
        timings={f.stem: json.loads(f.read_text())["wall_s"] for f in sorted((rd.path / "timings").glob("*.json"))},
        wall_s=(now - datetime.fromisoformat(started)).total_seconds() if started else None,
    )


def _change_text(change: Any) -> str:
    if not isinstance(change, dict):
        return str(change)
    return f"{change.get('kind', '')}: {change.get('detail') or change.get('description') or change}"


def format_summary(summary: RunSummary) -> str:
    """Plain-text summary of one run (the task log, `make demo`, `python -m tasks demo`)."""
    from tasks.evals.harness import format_interval

    lines = [
        "=" * 78,
        f"{summary.dag_id} {summary.run_id}: {summary.status.upper()}",
        f"  trigger: {summary.trigger.get('kind') or 'unknown'}",
    ]
    if summary.training and summary.training.get("resumed_from"):
        r = summary.training["resumed_from"]
        lines.append(
            f"  training resumed from run {r.get('run')} at step {r.get('step')} (same champion, toolsets, settings)"
        )
    if summary.training and summary.training.get("init"):
        lines.append(f"  GRPO started from {summary.training['init']['alias']}: {summary.training['init']['reason']}")
    if summary.overrides:
        lines.append("  changed by the run's params: " + ", ".join(f"{k}={v!r}" for k, v in summary.overrides.items()))
    sig = summary.signals
    if sig.window:
        lines.append(f"  signals {sig.window}: retrain={sig.retrain}; {str(sig.summary)[:150]}")
    if prod := sig.production_tasks:
        lines.append(
            f"  tasks from production: {prod.get('train', 0)} train, {prod.get('eval', 0)} held out"
            + (", trained on" if prod.get("used") else f"; not trained on: {prod.get('reason')}")
        )
    if summary.skip_reason:
        lines.append(f"  skipped: {summary.skip_reason}")
    for kind in ("greedy", "sampled"):
        for reg, c in (getattr(summary, kind) or {}).items():
            lines.append(
                f"  [{kind:7s}] toolset v{reg}: champion {format_interval(c.champion.model_dump())} -> "
                f"challenger {format_interval(c.challenger.model_dump())}  "
                f"diff {format_interval(c.difference.model_dump(), points=True)}"
            )
    promo = summary.promotion
    if promo:  # free-form (the page shows hand-written and older summaries too): absent parts are left out
        d, c = promo.get("decision") or {}, promo.get("cost") or {}
        if d:
            lines.append(
                f"  decision: {'PROMOTED' if d.get('promote') else 'not promoted'} {promo.get('model_name')} "
                f"version {promo.get('version')}; aliases {promo.get('aliases')}"
            )
        usd = [c.get(k) for k in ("total_usd", "run_usd")]
        if all(isinstance(v, (int, float)) for v in usd):
            lines.append(f"  cost ${usd[0]:.4f} (run ${usd[1]:.4f}); {str(d.get('summary', ''))[:160]}")
    if summary.wall_s:
        lines.append(f"  wall {summary.wall_s:.0f}s; " + ", ".join(f"{k} {v:.0f}s" for k, v in summary.timings.items()))
    for name, url in summary.links.items():
        if url:
            lines.append(f"  {name}: {url}")
    lines.append("=" * 78)
    return "\n".join(lines)
