"""What the stages hand each other and what the page, the CLI and the tests read back: pydantic models,
each with a schema version. A writer builds the model (a wrong field fails where it is written, not in
the page a day later); a reader validates the file or XCom it gets.

    verdict = DataVerdict.model_validate(rd.read("signals.json"))
    summary = RunSummary.model_validate_json((rd.path / "summary.json").read_text())

Models allow extra fields where a stage passes on a richer report (the monitor's verdict carries its
drift tests), so that adding a field never breaks an old reader; `schema_version` changes when a field
changes meaning or goes away.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1


class _Contract(BaseModel):
    model_config = ConfigDict(extra="allow")
    schema_version: int = SCHEMA_VERSION


class DataVerdict(_Contract):
    """validate_data's verdict on the production window (signals.json)."""

    retrain: bool
    reasons: list[str] = []
    summary: str
    window: str
    rows: dict = {}
    data_validation: str = Field(description="passed | failed | no data")
    no_champion: bool = False
    production_tasks: dict = Field(
        {},
        description="tasks from the window's traces: used (whether GRPO trains on "
        "them), reason, train, eval, traces, unverifiable, path",
    )


class TrainingChoice(_Contract):
    """should_train's answer (should_train.json): the branch and the skip read it, nobody recomputes it."""

    train: bool
    reason: str


class Decision(_Contract):
    """The gate's decision (decision.json; tasks.promotion.gate.decide builds it): move_aliases, the
    summary and the page read it."""

    promote: bool
    checks: list[dict] = Field(description="one per check: name, passed, observed, threshold, unit, reason")
    reasons: list[str] = Field(description="the failed checks' reasons, or one line saying why it is promoted")
    summary: str

    def to_dict(self) -> dict:
        return self.model_dump()


class ClusterInfo(_Contract):
    """The run's Ray cluster as its setup describes it; drivers and the Ray job connect with it."""

    backend: Literal["local", "address", "kuberay"]
    address: str
    dashboard_url: str | None = None
    env: dict[str, str] = Field({}, description="what a driver needs in its environment (the head's auth token)")
    temp_dir: str | None = None
    name: str | None = None
    kuberay: dict[str, str | None] | None = Field(
        None,
        description="a KubeRay cluster's {name, namespace, conn_id}: the Jobs API client and the trigger read its Ray "
        "token from the cluster's Secret with these (hooks/kuberay.py auth_token), so the token is never in XCom",
    )


class Interval(BaseModel):
    model_config = ConfigDict(extra="allow")
    mean: float
    low: float
    high: float


class Comparison(BaseModel):
    """tasks.evals.harness.compare: challenger against champion on the same tasks, paired."""

    model_config = ConfigDict(extra="allow")
    metric: str
    champion: Interval
    challenger: Interval
    difference: Interval


class Comparisons(_Contract):
    """validate_evals' output (comparisons.json), per registry and decoding."""

    sampled: dict[str, Comparison]
    greedy: dict[str, Comparison]
    evals_valid: bool


class SignalsDigest(BaseModel):
    retrain: bool | None = None
    reasons: list[str] = []
    summary: str | None = None
    window: str | None = None
    rows: dict | None = None
    data_validation: str | None = None
    drift: list[dict] = []
    tooldiff: dict = {}
    production_tasks: dict = {}


class RunSummary(_Contract):
    """summary.json of one run: what the Evergreen page, `make demo` and `python -m tasks demo` show."""

    dag_id: str
    run_id: str
    run_dir: str
    overrides: dict = Field({}, description="settings the run's params changed: {section.field: value}")
    status: Literal["promoted", "not_promoted", "skipped", "failed"]
    started_at: str | None = None
    finished_at: str
    trigger: dict = {}
    skip_reason: str | None = None
    signals: SignalsDigest = SignalsDigest()
    target_toolset: str
    guard_toolsets: list[str] = []
    greedy: dict[str, Comparison] | None = None
    sampled: dict[str, Comparison] | None = None
    probe: list[dict] = []
    training: dict | None = None
    promotion: dict | None = None
    champion_version: str | None = None
    challenger_version: str | None = None
    links: dict[str, str | None] = {}
    timings: dict[str, float] = {}
    wall_s: float | None = None
