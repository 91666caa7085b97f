"""The models of a run: the first champion (SFT), and the registry's champion fetched for a stage.

    bootstrap(settings, rd)                   # bootstrap_champion's task: SFT, log, register (champion if none)
    champion_dir(settings, rd)                # the champion, downloaded once per run into <rd>/champion
    fetch_champion(settings, dest)            # the one resolver of `models:/<name>@champion` (or another alias)
    init_dir(settings, rd)                    # what GRPO starts from: the champion, or a fallback the probes chose

"bootstrap" here is the SFT of the first champion; the statistical bootstrap (intervals) is tasks.evals.intervals.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasks.storage import write_atomic

if TYPE_CHECKING:
    from tasks.config import Settings
    from tasks.rundir import RunDir

log = logging.getLogger(__name__)

CHAMPION_URI = "models:/{name}@{alias}"


def fetch_champion(settings: Settings, dest: Path, alias: str = "champion") -> Path:
    """The registry's champion (or the version under another `alias`) in `dest` (downloaded when not there yet;
    its checksums verified when loaded). Parallel tasks may ask at once: each downloads to its own directory
    and the first rename wins. Raises RuntimeError, saying what to run, when the registry has no such alias."""
    from tasks.policy.model import resolve_model_dir
    from tasks.stages.report import tracker_of

    dest = Path(dest)
    if (dest / "config.json").exists():
        return dest
    tracker_of(settings)  # sets the tracking URI the registry lives in
    uri = CHAMPION_URI.format(name=settings.promotion.model_name, alias=alias)
    dest.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".champion-", dir=dest.parent))
    try:
        try:
            # the alias's version, then that version by number: an alias moved meanwhile cannot mix two models,
            # and the gate learns which champion the challenger was measured against (<dest>.json)
            from mlflow import MlflowClient

            version = str(MlflowClient().get_model_version_by_alias(settings.promotion.model_name, alias).version)
            got = resolve_model_dir(f"models:/{settings.promotion.model_name}/{version}", cache_dir=scratch)
        except Exception as e:
            first = "run the bootstrap_champion DAG first" if alias == "champion" else "no model holds that alias"
            raise RuntimeError(f"no {alias} in the MLflow registry ({uri}): {first} ({type(e).__name__}: {e})") from e
        try:
            got.rename(dest)
            write_atomic(dest.with_name(dest.name + ".json"), json.dumps({"version": version, "uri": uri}))
        except OSError:
            if not (dest / "config.json").exists():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return dest


def champion_dir(settings: Settings, rd: RunDir) -> Path:
    """This run's champion: fetched once per run, shared by its stages."""
    return fetch_champion(settings, rd.path / "champion")


def fallback_dir(settings: Settings, rd: RunDir, alias: str) -> Path | None:
    """The model under a grpo.init_fallback `alias` (<rd>/init/<alias>), or None when no version holds it or it
    is the run's champion (nothing else to try)."""
    from tasks.promotion.registry import ModelRegistry
    from tasks.stages.report import tracker_of

    tracker_of(settings)
    version = ModelRegistry(settings.promotion.model_name).version_of(alias)  # None: never set (no promotion yet)
    champion_dir(settings, rd)  # the run's champion, and its version in <rd>/champion.json
    if version is None or version == str((rd.read("champion.json") or {}).get("version")):
        return None
    return fetch_champion(settings, rd.path / "init" / alias, alias=alias)


def init_dir(settings: Settings, rd: RunDir) -> Path:
    """What this run's GRPO starts from: the champion, unless the probes found it solving too little of its own
    toolset's first batch to learn from and a grpo.init_fallback model solving more (tasks.rl.selection.
    choose_init); the choice is written to <rd>/init.json."""
    from tasks.rl.selection import choose_init

    probes = [rd.read("probe", p.name) for p in sorted((rd.path / "probe").glob("shard-*.json"))]
    choice = choose_init(probes, settings.grpo.init_fallback_below)
    rd.write(choice, "init.json")
    if choice["alias"] == "champion":
        return champion_dir(settings, rd)
    log.warning("GRPO starts from %s, not the champion: %s", choice["alias"], choice["reason"])
    path = fallback_dir(settings, rd, choice["alias"])
    if path is None:  # the probes saw it: only a registry changed meanwhile gets here
        raise RuntimeError(f"grpo.init_fallback: {choice['alias']} is no longer in the registry; rerun the run")
    return path


def sft_champion(settings: Settings, out_dir: str | Path) -> dict:
    """The first champion: `model.name_or_path` (a team's checkpoint) or the embedded default built from
    config, fine-tuned for `bootstrap.steps` on the environment's demonstrations (0: saved as it is);
    returns its stats. The model's format is checked before any step is spent."""
    from tasks.envs import get_env
    from tasks.policy.model import build_model, check_engine_support, load_model, save_model
    from tasks.policy.sft import sft_train

    t0 = time.time()
    ms = settings.model
    if ms.name_or_path:
        model, chat, _ = load_model(ms.name_or_path, model_settings=ms, checksums=False)
        log.info("first champion from %s (%s)", ms.name_or_path, type(model).__name__)
    else:
        model, chat = build_model(ms, env_name=settings.env.name)
        chat.check("the embedded default")
    if settings.rollout.backend == "vllm":
        check_engine_support(model.config.to_dict() | {"architectures": [type(model).__name__]})
    losses = sft_train(model, chat, settings) if settings.bootstrap.steps else []
    toolset = get_env(settings.env.name).load_toolset(settings.env.champion_toolset)
    path = save_model(model, chat, out_dir, toolset=toolset)
    stats = {
        "model_dir": str(path),
        "sft_steps": len(losses),
        "final_loss": losses[-1] if losses else None,
        "seconds": time.time() - t0,
        "parameters": sum(p.numel() for p in model.parameters()),
        "architecture": type(model).__name__,
        "source": ms.name_or_path or "embedded default",
    }
    log.info("sft: %s", stats)
    return stats


def bootstrap(settings: Settings, rd: RunDir, force: bool = False) -> dict:
    """SFT the first champion and register it; it becomes `champion` when the registry has none. With a
    champion there, nothing happens unless `force` (then a new version is registered; the aliases stay)."""
    from tasks.promotion.registry import CHAMPION, ModelRegistry
    from tasks.stages.report import tracker_of

    tracker = tracker_of(settings)
    registry = ModelRegistry(settings.promotion.model_name)
    current = registry.version_of(CHAMPION)
    if current is not None and not force:
        log.info(
            "registry %s already has champion version %s; nothing to do (force=true retrains)",
            settings.promotion.model_name,
            current,
        )
        return {"champion": current, "bootstrapped": False}
    out = rd.path / "model"
    t0 = time.time()
    stats: dict[str, Any] = (
        sft_champion(settings, out) if not (out / "config.json").exists() else {"model_dir": str(out)}
    )
    with (
        tracker.pipeline_run(
            "bootstrap_champion", settings=settings, tags={"airflow.dag_id": rd.dag_id, "airflow.run_id": rd.run_id}
        ),
        tracker.stage("bootstrap") as stage,
    ):
        tracker.log_metrics(
            {
                k: v
                for k, v in stats.items()
                if k in ("sft_steps", "final_loss", "seconds", "parameters") and v is not None
            }
        )
        tracker.log_model(out)
        version = registry.register(
            stage.info.run_id,
            "model",
            run_key=f"{rd.run_id}:bootstrap",
            tags={"evergreen.kind": "bootstrap", "evergreen.registry": settings.env.champion_toolset},
        )
        if registry.version_of(CHAMPION) is None:
            registry.promote(
                version,
                run_key=f"{rd.run_id}:bootstrap",
                decision={"promote": True, "reasons": ["first model: the registry had no champion"]},
            )
    result = {
        "champion": registry.version_of(CHAMPION),
        "bootstrapped": True,
        "seconds": time.time() - t0,
        "aliases": registry.aliases(),
        **{k: v for k, v in stats.items() if k != "model_dir"},
    }
    log.info("bootstrap: %s", result)
    return result
