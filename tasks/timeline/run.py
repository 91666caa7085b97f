"""A simulated month of production, each policy over the same days from the same first champion.

    python -m tasks timeline --out runs/timeline            # prepare, every day, the report
    python -m tasks --set timeline.days=3 ... timeline      # a shorter month (event days must fit in it)

    from tasks.timeline.run import Timeline
    tl = Timeline(settings, "runs/timeline")
    tl.prepare(); [tl.run_day(i) for i in range(settings.timeline.days)]; tl.report()

Every day, for every policy (tasks.timeline.plan.POLICIES):
1. the day's traffic: `traces_per_day` episodes of that day's tasks (that day's toolset and workload mix) run by
   the policy's deployed model through vLLM, greedy as it is served, written as production traces (with the
   day's malformed lines); the share solved is the day's production success;
2. the verdict of the drift monitor (tasks.signals.monitor.check_production: ingest with GX, the drift tests
   against the traffic this model served before, up to drift.reference_days; the tool diff of the model's
   toolset against production's), which only the evergreen policy acts on;
3. a retrain where the policy wants one: a continuous_post_training run through the DAG's stage functions
   (tasks.stages.demo.post_training_run), trained on that day's window, gated, its alias moved in the policy's
   own MLflow registry (SQLite under the policy's directory, thrown away with it); the nightly policy promotes
   whatever its gate says. The promoted champion serves from the next day.
Dollars are the runs' cost ledgers (run_usd: the compute each retrain held, priced). What is scaled down from
a real deployment: traces per day and the size of each retrain (`timeline.retrain`, the same for every
policy); a retrain happens at the end of its day and takes no simulated time. Results: <out>/days/day-NN.json
(one record per policy), <out>/report.json, <out>/report.md and <out>/timeline.png (tasks.timeline.report).
Each day is written once: a rerun resumes after the last day written.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from tasks.storage import write_atomic
from tasks.timeline.plan import Day, plan, promotes, wants_retrain
from tasks.timeline.traffic import Traffic

if TYPE_CHECKING:
    from tasks.config import Settings

log = logging.getLogger(__name__)


def _merged(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


class Timeline:
    def __init__(self, settings: Settings, out: str | Path) -> None:
        from tasks.envs import get_env
        from tasks.rl.cluster import hold_token
        from tasks.signals.tooldiff import diff_toolsets

        self.settings, self.out = settings, Path(out).resolve()
        hold_token(f"timeline-{os.getpid()}")  # before the traffic engine imports Ray (tasks.rl.cluster.hold_token)
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # a month of download bars otherwise
        self.env = get_env(settings.env.name)
        families = tuple(dict.fromkeys(t.family for t in self.env.generate_tasks(12, 0, None)))

        def breaking(old: str, new: str) -> bool:
            return diff_toolsets(self.env.load_toolset(old), self.env.load_toolset(new), settings.env.name).breaking

        self.days = plan(settings.timeline, families, breaking)
        fewest = min(settings.timeline.traces_per_day * min(d.mix.values()) for d in self.days)
        min_samples = settings.timeline.drift_min_samples or settings.drift.min_samples
        if fewest < min_samples:  # the drift tests would say "insufficient data" for that workload
            log.warning(
                "timeline: as few as %d traces of a workload a day, below its drift min_samples=%d: raise "
                "timeline.traces_per_day or lower timeline.drift_min_samples, or the monitor will not test it",
                fewest,
                min_samples,
            )
        self._traffic = Traffic(settings, self.out / "traffic")
        # the Ray head of the day (or of the month: run_day's keep_cluster) and its key
        self._run_key, self._cluster = f"timeline/{self.out}/month", cast("dict | None", None)

    # ------------------------------------------------------------ settings and state per policy

    def policy_settings(self, policy: str, day: Day) -> Settings:
        """The settings of the policy's runs on `day`: the retrain overrides, the day's GRPO seed, production's
        toolset as the target, the policy's own run directory, traces and (throwaway) MLflow registry."""
        from tasks.config import Settings, nest

        root = self.out / policy
        base = Settings.model_validate(_merged(self.settings.model_dump(), nest(self.settings.timeline.retrain)))
        if self.settings.timeline.drift_min_samples is not None:  # a day of the timeline is a small window
            base = base.model_copy(
                update={
                    "drift": base.drift.model_copy(update={"min_samples": self.settings.timeline.drift_min_samples})
                }
            )
        return base.model_copy(
            update={
                # a night's run draws its own tasks and samples (the same for every policy that night): with one
                # seed all month, a retrain refused on Monday would be the same run, refused again, on Tuesday
                "grpo": base.grpo.model_copy(update={"seed": base.grpo.seed + day.index}),
                "run_dir": str(root / "runs"),
                # production serves one toolset: the gate judges it, and nothing older is guarded
                "env": base.env.model_copy(update={"target_toolset": day.toolset, "champion_toolset": day.toolset}),
                "tracking": base.tracking.model_copy(update={"uri": None, "experiment": f"timeline-{policy}"}),
                "promotion": base.promotion.model_copy(update={"model_name": f"timeline-{policy}"}),
                "monitor": base.monitor.model_copy(update={"traces": str(root / "traces")}),
            }
        )

    def state(self, policy: str) -> dict:
        return json.loads((self.out / policy / "state.json").read_text())

    def _save_state(self, policy: str, state: dict) -> None:
        write_atomic(self.out / policy / "state.json", json.dumps(state, indent=1))

    # ------------------------------------------------------------ the month

    def prepare(self) -> dict:
        """The first champion (timeline.champion, or SFT from the bootstrap settings), registered as `champion`
        in every policy's registry; the plan in <out>/plan.json. Idempotent."""
        from tasks.rundir import RunDir
        from tasks.stages.models import bootstrap, sft_champion

        champion = self.out / "champion"
        if not (champion / "config.json").exists():
            given = self.settings.timeline.champion
            if given:
                shutil.copytree(given, champion, dirs_exist_ok=True)
            else:
                log.info("timeline: no timeline.champion given: SFT of the first champion (bootstrap settings)")
                sft_champion(self.settings, champion)
        write_atomic(self.out / "plan.json", json.dumps([_day_dict(d) for d in self.days], indent=1))
        first, history = self.days[0], self.settings.drift.reference_days
        # production did not start on day 0: the champion served drift.reference_days before it, which the
        # monitor and every run's validate_data take as their reference
        before = [
            Day(-k, first.date - timedelta(days=k), first.toolset, first.mix, first.malformed_share)
            for k in range(history, 0, -1)
        ]
        for policy in self.settings.timeline.policies:
            if (self.out / policy / "state.json").exists():
                continue
            for day in before:
                self.traffic(policy, day, champion)
            s = self.policy_settings(policy, first)
            rd = RunDir.for_run(s, "bootstrap_champion", "timeline")
            shutil.copytree(champion, rd.path / "model", dirs_exist_ok=True)
            version = bootstrap(s, rd)["champion"]
            self._save_state(policy, {"deployed": str(champion), "version": version, "since": -history})
        return {"champion": str(champion), "days": len(self.days), "policies": self.settings.timeline.policies}

    def run_day(self, index: int, keep_cluster: bool = False) -> dict:
        """Every policy's day `index`: <out>/days/day-NN/<policy>.json as each is done (a retried day redoes only
        the policies not written yet), then <out>/days/day-NN.json. The day's retrains share one local Ray head
        and its rollout engines (ray.engine_namespace), started at the first retrain and stopped at the end of
        the day, or with `keep_cluster` kept for the next day (stop_cluster ends them): the command line keeps
        one for the month, the DAG's day tasks, each a process of its own, one a day."""
        path = self.out / "days" / f"day-{index:02d}.json"
        if path.exists():
            return json.loads(path.read_text())
        day = self.days[index]
        log.info("timeline day %d (%s): toolset v%s; %s", index, day.date, day.toolset, "; ".join(day.events) or "-")
        if not keep_cluster:
            self._run_key = f"timeline/{self.out}/day-{index:02d}"
        records = {}
        try:
            for policy in self.settings.timeline.policies:
                part = self.out / "days" / f"day-{index:02d}" / f"{policy}.json"
                if not part.exists():
                    write_atomic(part, json.dumps(self._policy_day(policy, day), indent=1))
                records[policy] = json.loads(part.read_text())
        finally:
            if not keep_cluster:
                self.stop_cluster()
        write_atomic(path, json.dumps(records, indent=1))
        return records

    def stop_cluster(self) -> None:
        from tasks.rl.cluster import teardown_local_cluster

        if self._cluster is not None:
            teardown_local_cluster(self._run_key)
            self._cluster = None

    def cluster(self, settings: Settings) -> dict:
        """The day's local Ray head, started on first use with the day's rollout engines (ray.engine_namespace)
        built side by side: the runs' probes then find them up instead of building one after the other."""
        import ray

        from tasks.rl.cluster import connect, setup_local_cluster
        from tasks.rl.rollout import start_rollout_actors

        if self._cluster is None:
            from tasks.net import free_port

            # ports of its own: the deployment's (ray.head_port) may be a running DAG's, or another timeline's
            ports = {"head_port": free_port(), "dashboard_port": free_port()}
            settings = settings.model_copy(update={"ray": settings.ray.model_copy(update=ports)})
            self._cluster = info = setup_local_cluster(settings, self._run_key)
            os.environ.update(info["env"])
            connect(settings.model_copy(update={"ray": settings.ray.model_copy(update={"address": info["address"]})}))
            try:
                actors = start_rollout_actors(self.out / "champion", settings, namespace=settings.ray.engine_namespace)
                ray.get([a.info.remote() for a in actors])
            finally:
                ray.shutdown()
        return self._cluster

    def _policy_day(self, policy: str, day: Day) -> dict:
        t0 = time.time()
        state = self.state(policy)
        deployed = Path(state["deployed"])
        traffic = self.traffic(policy, day, deployed)
        verdict = self.verdict(policy, day, deployed, state)
        record: dict[str, Any] = {
            "policy": policy,
            "day": day.index,
            "date": day.date.isoformat(),
            "toolset": day.toolset,
            "events": list(day.events),
            "deployed_version": state["version"],
            "success": traffic["success"],
            "workloads": traffic["workloads"],
            "verdict": verdict,
            "pending": verdict["tool_change_breaking"],
            "retrained": False,
            "promoted": False,
            "usd": 0.0,
        }
        if wants_retrain(policy, verdict["retrain"]):
            record |= self.retrain(policy, day, verdict, state)
        record["seconds"] = round(time.time() - t0, 1)
        log.info(
            "timeline day %d %s: success %.3f, retrain %s%s, $%.4f",
            day.index,
            policy,
            record["success"],
            record["retrained"],
            f" ({record['run_status']})" if record["retrained"] else "",
            record["usd"],
        )
        return record

    # ------------------------------------------------------------ one policy's day

    def traffic(self, policy: str, day: Day, model: Path) -> dict:
        """The day's production traffic by `model` in the policy's traces (tasks.timeline.traffic)."""
        return self._traffic.serve(day, model, self.out / policy / "traces")

    def verdict(self, policy: str, day: Day, model: Path, state: dict) -> dict:
        """The drift monitor's verdict on the day against the traffic the deployed model served before it (up to
        drift.reference_days; none on its first day: the tool diff alone then)."""
        from tasks.data.validation import BatchValidationError
        from tasks.envs.toolset import toolset_of_model
        from tasks.signals.monitor import check_production
        from tasks.signals.tooldiff import diff_toolsets
        from tasks.signals.traces import Window

        s = self.policy_settings(policy, day)
        served = day.index - state["since"]
        diff = diff_toolsets(toolset_of_model(model), self.env.load_toolset(day.toolset), s.env.name)
        tool = {"tool_change_breaking": diff.breaking, "tool_summary": diff.summary if diff.changes else ""}
        if served < 1:
            reasons = [f"tool change: {diff.summary}"] if diff.breaking else []
            return {"retrain": diff.breaking, "reasons": reasons, "drifted": False, "data": "no reference yet"} | tool
        s = s.model_copy(
            update={"drift": s.drift.model_copy(update={"reference_days": min(served, s.drift.reference_days)})}
        )
        out = self.out / policy / "monitor" / f"day-{day.index:02d}"
        try:
            v = check_production(
                s, s.monitor.traces, out, Window.parse(day.date.isoformat()), champion=model, toolset=day.toolset
            )
        except BatchValidationError as e:  # the day's data failed validation: nothing is learnt from it
            return {
                "retrain": False,
                "reasons": [f"data failed validation: {e}"[:300]],
                "drifted": False,
                "data": "failed",
            } | tool
        return {"retrain": v["retrain"], "reasons": v["reasons"][:5], "drifted": v["drifted"], "data": "passed"} | tool

    def retrain(self, policy: str, day: Day, verdict: dict, state: dict) -> dict:
        """One continuous_post_training run of the policy at the end of `day`; what it cost and whether it
        promoted (the policy's deployed model moves with the registry's champion alias)."""
        from tasks.promotion.registry import CHAMPION, ModelRegistry
        from tasks.stages.contracts import RunSummary
        from tasks.stages.demo import Workers, post_training_run
        from tasks.stages.models import fetch_champion
        from tasks.stages.report import tracker_of
        from tasks.stages.signals import retrain_request_extra

        s = self.policy_settings(policy, day)
        run_id = f"timeline__day-{day.index:02d}"
        if policy == "evergreen":
            extra = retrain_request_extra(
                {**verdict, "window": day.date.isoformat(), "summary": "; ".join(verdict["reasons"])}
            )
            trigger = {
                "kind": "asset",
                "asset_events": [{"extra": extra, "source_dag_id": "drift_monitor"}],
                "params": {},
            }
        else:
            trigger = {"kind": "schedule", "asset_events": [], "params": {"force": True}}
        # a policy without a gate (nightly) ships whatever its gate says; the gate's checks stay on record
        forced = f"policy {policy} promotes every retrain" if promotes(policy, gate_promote=False) else ""
        # the day's retrains share a head and its engines: starting them per run cost ~1 minute of each
        s = s.model_copy(update={"ray": s.ray.model_copy(update={"engine_namespace": "timeline-engines"})})
        workers, error = Workers(s, "continuous_post_training", run_id), None
        try:
            summary = post_training_run(
                workers,
                trigger,
                force=policy != "evergreen",
                window=day.date.isoformat(),
                forced_promotion=forced,
                cluster=lambda: self.cluster(s),
            )
        except Exception as e:  # a failed run (bad data, a crash) ships nothing; its summary is written
            log.warning("timeline day %d %s: the run failed: %s: %s", day.index, policy, type(e).__name__, e)
            summary = RunSummary.model_validate(workers.rd().read("summary.json"))
            error = f"{type(e).__name__}: {e}"[-3000:]
        rd = workers.rd()
        cost, decision = rd.read("cost.json") or {}, rd.read("decision.json") or {}
        promoted = summary.status == "promoted"
        target = (summary.greedy or {}).get(day.toolset)
        out = {
            "retrained": True,
            "run_status": summary.status,
            "promoted": promoted,
            "usd": float(
                cost.get("run_usd", 0.0)
            ),  # a run that failed before its cost stage: its compute is not priced
            "gate": decision.get("reasons"),
            "target_gain": target.difference.mean if target else None,
            "run_dir": str(rd.path),
            "error": error,
        }
        if promoted:
            tracker_of(s)
            version = ModelRegistry(s.promotion.model_name).version_of(CHAMPION)
            model = fetch_champion(s, self.out / policy / "models" / f"v{version}")
            self._save_state(policy, {"deployed": str(model), "version": version, "since": day.index + 1})
        return out

    def report(self) -> dict:
        from tasks.timeline.report import write_report

        return write_report(self.out, self.days, self.settings.timeline)


def run_timeline(settings: Settings, out: str | Path | None = None, report_only: bool = False) -> dict:
    """The whole month (resuming after the last day written), then the report; returns the report."""
    tl = Timeline(settings, out or settings.local_root / "timeline")
    if not report_only:
        tl.prepare()
        t0 = time.time()
        try:
            for i in range(len(tl.days)):
                tl.run_day(i, keep_cluster=True)  # one head and engine set for the month: ~50 s a day saved
                log.info("timeline: day %d of %d done (%.0f s so far)", i + 1, len(tl.days), time.time() - t0)
        finally:
            tl.stop_cluster()
    report = tl.report()
    log.info("timeline report: %s", tl.out / "report.md")
    return report


def _day_dict(day: Day) -> dict:
    return {
        "day": day.index,
        "date": day.date.isoformat(),
        "toolset": day.toolset,
        "mix": day.mix,
        "malformed_share": day.malformed_share,
        "events": list(day.events),
        "breaking": day.breaking,
    }
