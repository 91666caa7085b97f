"""The sections of the pipeline settings that a deployment sets: production signals (ingest, drift, simulate,
monitor), promotion and cost, tracking, Ray and orchestration. One pydantic model per `include/config/pipeline.yaml`
section, each field documented where it is declared; the training sections are in tasks/config_sections.py, the
root model and the loading in tasks/config.py (which re-exports these names).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from tasks.config_sections import PROJECT_ROOT, ProjectPath, TraceSource, _Section


class IngestSettings(_Section):
    chunk_rows: int = Field(
        50_000,
        ge=100,
        description="rows parsed, checked and validated (GX) per chunk: bounds memory "
        "(the chunk's raw lines); each GX run costs ~0.25 s whatever its size",
    )
    max_line_bytes: int = Field(1 << 20, ge=1024, description="a longer line is quarantined unparsed ('line too long')")
    max_quarantine_share: float = Field(0.1, ge=0, le=1, description="a window with a larger share of bad rows fails")
    required_workloads: list[str] = Field(
        default_factory=list, description="workloads that must appear in every window"
    )
    future_tolerance_s: float = Field(
        300.0, ge=0, description="clock skew allowed past the window end before a timestamp counts as 'in the future'"
    )


class DriftSettings(_Section):
    alpha: float = Field(
        0.05, gt=0, lt=0.5, description="family-wise false-alarm rate across all drift tests of a report"
    )
    correction: Literal["holm", "bonferroni"] = Field(
        "holm", description="multiple-testing correction across the family"
    )
    min_samples: int = Field(
        200, ge=10, description="traces per workload and window below which a test says 'insufficient data'"
    )
    min_success_diff: float = Field(
        0.05, gt=0, lt=1, description="smallest success-rate change (absolute) that must be detected"
    )
    min_tool_error_diff: float = Field(
        0.05, gt=0, lt=1, description="smallest tool-error-rate change (absolute) that must be detected"
    )
    min_ks: float = Field(
        0.1, gt=0, lt=1, description="smallest KS distance (prompt tokens, turns, tool calls) that must be detected"
    )
    min_psi: float = Field(
        0.1, gt=0, description="smallest population-stability index of the tool-name mix that must be detected"
    )
    reference_days: int = Field(7, ge=1, description="the reference window: this many days before the current one")


class SimulateSettings(_Section):
    traces: int = Field(
        1500, ge=10, description="simulated production traces of the demo (two days, the tool change between)"
    )
    malformed_share: float = Field(
        0.02, ge=0, lt=1, description="share of simulated lines made malformed (quarantine path)"
    )


class PromotionSettings(_Section):
    model_name: str = Field("evergreen-agent", description="MLflow registered model name")
    metric: Literal["greedy_success", "sampled_success"] = Field(
        "greedy_success", description="eval column the gate judges (greedy = how the model is served)"
    )
    min_gain: float = Field(
        0.05,
        gt=-1,
        lt=1,
        description="the lower 95% bound of the target workload's success "
        "difference (challenger - champion, absolute) must reach this; a negative value is a "
        "non-inferiority margin (ship a challenger that is at worst this much worse)",
    )
    guard_tolerance: float = Field(
        0.10,
        ge=0,
        lt=1,
        description="non-inferiority margin of each guard workload: the "
        "lower bound of its difference must stay above -guard_tolerance",
    )
    min_gain_per_dollar: float = Field(
        1.0,
        ge=0,
        description="success points gained on the target (point estimate, "
        "in percentage points) per dollar of total cost (run + projected serving change); "
        "0 disables the check",
    )
    max_cost_usd: float | None = Field(
        None,
        ge=0,
        description="budget of one run in USD (run + projected serving "
        "change, as the cost stage prices it): a dearer run is not promoted however "
        "good; null: no budget (the DAG param max_cost_usd sets it per run)",
    )


class CostSettings(_Section):
    prices_file: ProjectPath = Field(
        PROJECT_ROOT / "include" / "config" / "prices.yaml", description="price table with dated sources"
    )
    cpu_price: str = Field("aws-c7i-on-demand", description="key under `cpu:` in the price table")
    gpu_price: str = Field("h200-aws-p5e-on-demand", description="key under `gpu:` in the price table (GPU runs only)")
    serving_price: str = Field("self-hosted-tiny", description="key under `serving:` ($ per million tokens)")
    traffic_episodes_per_day: float = Field(100_000, ge=0, description="production episodes a day (serving projection)")
    horizon_days: float = Field(30, gt=0, description="days over which the serving-cost change is projected")


class TrackingSettings(_Section):
    uri: str | None = Field(
        None,
        description="MLflow tracking URI (an `mlflow server`); None: a SQLite store "
        "under run_dir (mlflow.db, artifacts in mlartifacts/), no server needed",
    )
    experiment: str = Field("evergreen", description="MLflow experiment of the pipeline runs")


class RaySettings(_Section):
    address: str | None = Field(
        None,
        description="existing cluster address for drivers (`auto` inside a Ray job); "
        "None starts a local one in-process (the command line and tests)",
    )
    num_cpus: int | None = Field(None, ge=1, description="logical CPUs of a local cluster (None: all cores)")
    backend: Literal["local", "address", "kuberay"] = Field(
        "local",
        description="how the Airflow DAG gets its cluster: `local` starts a head on this machine for the run "
        "and stops it after; `address` uses the existing cluster at `address` (dashboard at `dashboard_url`); "
        "`kuberay` creates a RayCluster from `kuberay_manifest` and deletes it after",
    )
    head_port: int = Field(6390, ge=1024, le=65535, description="GCS port of a `local` head")
    dashboard_port: int = Field(8265, ge=1024, le=65535, description="dashboard / Jobs API port of a `local` head")
    dashboard_url: str | None = Field(None, description="Jobs API of an `address` cluster, e.g. http://ray-head:8265")
    kuberay_manifest: ProjectPath = Field(
        Path("include/deploy/kuberay/raycluster.yaml"), description="RayCluster template"
    )
    kuberay_namespace: str = Field("evergreen", description="namespace of the RayClusters the DAG creates")
    kuberay_image: str | None = Field(None, description="image for every Ray container (None: the manifest's)")
    job_timeout_s: int = Field(7200, ge=60, description="a Ray job (GRPO) that runs longer is stopped and fails")
    engine_namespace: str | None = Field(
        None,
        description="a Ray namespace whose rollout engines outlive a run: runs on a cluster that outlives them "
        "reuse its engines (loading the weights each stage needs) and leave them running; None: each run "
        "starts its own engines and its evals stop them",
    )

    @model_validator(mode="after")
    def _backend_needs(self) -> RaySettings:
        if self.backend == "address" and not (self.address and self.dashboard_url):
            raise ValueError(
                "ray.backend=address needs ray.address (GCS, host:6379) and ray.dashboard_url "
                "(Jobs API, http://host:8265); set both, or use ray.backend=local"
            )
        return self


class OrchestrationSettings(_Section):
    task_timeout_s: int = Field(
        7200,
        ge=60,
        description="an Airflow task (a stage) that runs longer is stopped "
        "and fails (its execution_timeout; the deferred GRPO wait has ray.job_timeout_s)",
    )


class MonitorSettings(_Section):
    traces: TraceSource = Field(
        "runs/production/traces",
        description="where production traces land: a directory "
        "(relative to the project) or an s3:// prefix, partitioned date=YYYY-MM-DD/; or "
        "mlflow:EXPERIMENT (MLflow Tracing) or otel:FILE.json (an OTLP JSON GenAI span export)",
    )
    window_days: int = Field(1, ge=1, le=31, description="the current window: this many whole days before the run")


class ToolsetChange(_Section):
    day: int = Field(ge=0, description="day of the timeline (0 = its first) from which production serves `toolset`")
    toolset: str = Field(description="a toolset version the environment ships (desk: 1-4)")


class MixShift(_Section):
    start_day: int = Field(ge=0, description="first day of the gradual shift of the workload mix")
    days: int = Field(7, ge=1, description="days over which the mix moves linearly from even to `to`")
    to: dict[str, float] = Field(
        description="the workload mix at the end of the shift (weights per workload, normalised; a workload not "
        "named keeps weight 0)"
    )


Policy = Literal["never", "nightly", "nightly_gated", "evergreen"]


def _every_policy() -> list[Policy]:
    return ["never", "nightly", "nightly_gated", "evergreen"]


def _retrain_overrides() -> dict[str, object]:
    return {
        "grpo.steps": 10,  # 12 x 8 tasks x 8 samples took the champion's v2 greedy success +38 pts (one draw)
        "grpo.tasks_per_step": 8,
        "grpo.checkpoint_every": 10,
        "grpo.validation_tasks": 0,
        "grpo.demo_coef": 0.0,  # production has no demonstrations of its changed tools: RL finds them
        "eval.num_tasks": 60,
        "eval.samples": 2,
    }


class TimelineSettings(_Section):
    """`python -m tasks timeline` (tasks/timeline): a simulated month of production, the same for every policy."""

    days: int = Field(30, ge=2, description="simulated days")
    start: str = Field("2026-11-02", description="the first simulated day's date (YYYY-MM-DD): traces are dated by it")
    traces_per_day: int = Field(
        400, ge=30, description="production episodes a day, run by the deployed model (greedy, as it is served)"
    )
    drift_min_samples: int | None = Field(
        60,
        ge=10,
        description="drift.min_samples in the timeline (its monitor and runs): a simulated day is a smaller window "
        "than a production one; null keeps drift.min_samples",
    )
    toolsets: list[ToolsetChange] = Field(
        default_factory=lambda: [
            ToolsetChange(day=0, toolset="1"),
            ToolsetChange(day=5, toolset="2"),
            ToolsetChange(day=12, toolset="3"),
            ToolsetChange(day=22, toolset="4"),
        ],
        description="what production serves from which day: desk's v2 and v4 are breaking changes, v3 a "
        "non-breaking one (an optional parameter); the first entry must be day 0",
    )
    mix_shift: MixShift | None = Field(
        MixShift(start_day=15, days=7, to={"calc": 0.6, "convert": 0.2, "lookup": 0.2}),
        description="a gradual change of the workload mix; null: an even mix all month",
    )
    malformed_day: int | None = Field(
        19, ge=0, description="the day a broken client sends malformed traffic (null: none)"
    )
    malformed_share: float = Field(
        0.3, ge=0, lt=1, description="share of that day's trace lines that are malformed (ingest quarantines them)"
    )
    background_malformed_share: float = Field(0.01, ge=0, lt=1, description="share of malformed lines on other days")
    policies: list[Policy] = Field(
        default_factory=_every_policy,
        description="never: never retrain; nightly: retrain and promote every night (no gate); nightly_gated: "
        "retrain every night, promote through the gate; evergreen: the drift monitor and tool diff decide when "
        "to retrain, the gate and its cost threshold what ships",
    )
    retrain: dict[str, object] = Field(
        default_factory=_retrain_overrides,
        description="overrides ({section.field: value}) of every retrain, the same for every policy: what is "
        "scaled down from the demo's run so that the month fits (the report says so)",
    )
    champion: str | None = Field(
        None, description="the first champion (a model directory); null: SFT one with the bootstrap settings"
    )
    fix_margin: float = Field(
        0.1,
        gt=0,
        lt=1,
        description="a breaking change counts as fixed on the first day a model promoted since serves with daily "
        "success at least this much above the day the change landed",
    )

    @model_validator(mode="after")
    def _events_in_range(self) -> TimelineSettings:
        days = sorted(c.day for c in self.toolsets)
        if not days or days[0] != 0:
            raise ValueError("timeline.toolsets must start with a change at day 0 (what production serves first)")
        if len(set(days)) != len(days):
            raise ValueError("timeline.toolsets names one day twice: give each day at most one toolset")
        late = [d for d in [*days, self.malformed_day] if d is not None and d >= self.days]
        if late:
            raise ValueError(f"timeline event day(s) {late} are past the last day ({self.days - 1}): lower them")
        return self
