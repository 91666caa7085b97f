"""Typed pipeline settings: `include/config/pipeline.yaml`, overridden by `EVERGREEN_<SECTION>__<FIELD>`
(JSON for lists and objects, `null` for None), then by dotted overrides (`--set`, DAG params): pydantic-settings
sources, merged deeply.

    from tasks.config import load_settings
    s = load_settings()                      # the shipped file plus environment overrides
    s = load_settings(overrides={"grpo": {"steps": 3}})

Every field is documented where it is declared; a bad value fails here, at load, with a message that
names the field and what to change (never later, deep inside a Ray job).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)
from pydantic_settings.sources.utils import parse_env_vars

# the sections are declared in their own modules; callers import them from here, with the root and the loading
from tasks.config_deployment import (
    CostSettings,
    DriftSettings,
    IngestSettings,
    MonitorSettings,
    OrchestrationSettings,
    PromotionSettings,
    RaySettings,
    SimulateSettings,
    TimelineSettings,
    TrackingSettings,
)
from tasks.config_grpo import (
    GRPOSettings,
    LoraSettings,  # noqa: F401 (re-exported: callers import the sections from here)
)
from tasks.config_sections import (
    PROJECT_ROOT,
    BootstrapSettings,
    EnvSettings,
    EvalSettings,
    ModelSettings,
    ProjectPath,
    ProjectUri,
    RolloutSettings,
    _Section,
)
from tasks.storage import is_s3

DEFAULT_CONFIG = PROJECT_ROOT / "include" / "config" / "pipeline.yaml"
ENV_PREFIX = "EVERGREEN_"


class Settings(_Section):
    run_dir: ProjectUri = Field(
        str(PROJECT_ROOT / "runs" / "local"),
        description="where runs keep models, records, checkpoints: a local directory, or s3://bucket/prefix when "
        "tasks run on machines that share no disk (each task then works in scratch_dir and pushes its files)",
    )
    scratch_dir: ProjectPath = Field(
        PROJECT_ROOT / "runs" / "scratch",
        description="this worker's local working copies of runs kept on S3 (tasks.mirror); one per worker "
        "(EVERGREEN_SCRATCH_DIR); unused when run_dir is local",
    )
    model: ModelSettings = ModelSettings()
    env: EnvSettings = EnvSettings()
    bootstrap: BootstrapSettings = BootstrapSettings()
    rollout: RolloutSettings = RolloutSettings()
    grpo: GRPOSettings = GRPOSettings()
    eval: EvalSettings = EvalSettings()
    ingest: IngestSettings = IngestSettings()
    drift: DriftSettings = DriftSettings()
    simulate: SimulateSettings = SimulateSettings()
    promotion: PromotionSettings = PromotionSettings()
    cost: CostSettings = CostSettings()
    tracking: TrackingSettings = TrackingSettings()
    ray: RaySettings = RaySettings()
    monitor: MonitorSettings = MonitorSettings()
    orchestration: OrchestrationSettings = OrchestrationSettings()
    timeline: TimelineSettings = TimelineSettings()

    @property
    def collective_sync(self) -> bool:
        """Whether weights reach the engines through a weight-transfer group: LoRA adapters always go by the
        object store (they are small; vLLM takes an adapter from a directory, not a broadcast)."""
        return self.rollout.collective_sync and self.grpo.lora is None

    def run_uri(self, *parts: str) -> str:
        """A path or s3:// URI below run_dir: where a file that every worker must see lives."""
        return "/".join([str(self.run_dir).rstrip("/"), *parts])

    @property
    def local_root(self) -> Path:
        """Where this process works on runs: run_dir itself when it is local, else this worker's scratch_dir."""
        return Path(self.scratch_dir if is_s3(self.run_dir) else self.run_dir).resolve()

    @model_validator(mode="after")
    def _s3_runs_need_a_tracking_server(self) -> Settings:
        if is_s3(self.run_dir) and not self.tracking.uri:
            raise ValueError(
                f"run_dir={self.run_dir} is on S3, but tracking.uri is empty (an SQLite MLflow store under "
                "run_dir): set tracking.uri to the MLflow server the workers share"
            )
        return self

    @model_validator(mode="after")
    def _lora_needs_vllm(self) -> Settings:
        if self.grpo.lora is not None and self.rollout.backend != "vllm":
            raise ValueError(
                "grpo.lora trains an adapter that vLLM's engines apply per request: set "
                "rollout.backend=vllm, or grpo.lora=null for full-weight training on the hf backend"
            )
        return self

    @model_validator(mode="after")
    def _gpu_transfer_needs_gpus(self) -> Settings:
        r = self.rollout
        if r.gpu_weight_transfer:
            missing = [
                f
                for f, v in (
                    ("grpo.gpus_per_train_worker", self.grpo.gpus_per_train_worker),
                    ("rollout.gpus_per_worker", r.gpus_per_worker),
                )
                if v <= 0
            ]
            if r.backend != "vllm":
                missing.append("rollout.backend=vllm")
            if missing:
                raise ValueError(
                    f"rollout.weight_transfer_backend={r.weight_transfer_backend} moves weights GPU to "
                    f"GPU: set {' and '.join(missing)} (> 0 on a GPU machine), or use "
                    "weight_transfer_backend=gloo"
                )
            if r.weight_transfer_backend == "ipc" and self.grpo.num_train_workers > 1:
                # vLLM's IPC trainer gathers handles over the default group, which only rank 0 (the pool's
                # owner) would enter
                raise ValueError(
                    "rollout.weight_transfer_backend=ipc serves one trainer worker: set "
                    "grpo.num_train_workers=1, or use weight_transfer_backend=nccl"
                )
        return self


class SettingsError(ValueError):
    pass


def parse_value(text: str) -> Any:
    """A value given as text (an EVERGREEN_* variable, `--set`): JSON when it is a list, an object or null
    (`[1, 2]`, `{"a": 1}`, `null`), else the text itself, which pydantic converts to the field's type."""
    stripped = text.strip()
    if stripped == "null" or stripped[:1] in ("[", "{"):
        try:
            return json.loads(stripped)
        except json.JSONDecodeError as e:
            raise SettingsError(
                f'{text!r} looks like JSON but is not ({e}); quote it as JSON, e.g. \'["a", "b"]\''
            ) from e
    return text


def nest(flat: dict[str, object]) -> dict:
    """{"grpo.steps": 5} -> {"grpo": {"steps": 5}}: the one reader of dotted overrides (`--set`, DAG params)."""
    nested: dict = {}
    for key, value in flat.items():
        *parents, leaf = key.split(".")
        if not parents and key not in Settings.model_fields:
            raise SettingsError(f"override {key!r}: expected SECTION.FIELD, e.g. grpo.steps")
        node = nested
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return nested


class _Env(EnvSettingsSource):
    """EVERGREEN_<SECTION>__<FIELD> from a given mapping (os.environ, or {} for a run's resolved file)."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ = environ
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        # a misspelt section would be silently ignored by pydantic-settings; EVERGREEN_CONFIG and
        # EVERGREEN_S3_ENDPOINT_URL (no `__`) are not settings and are left alone
        for key in self._environ:
            section = key[len(ENV_PREFIX) :].split("__")[0].lower()
            if key.upper().startswith(ENV_PREFIX) and "__" in key and section not in Settings.model_fields:
                raise SettingsError(
                    f"{key}: Evergreen settings have no section {section!r} "
                    f"(sections: {', '.join(Settings.model_fields)}); fix the variable's name"
                )
        return parse_env_vars(self._environ, self.case_sensitive, self.env_ignore_empty, self.env_parse_none_str)


# the file and the environment of the load in progress: pydantic-settings builds sources in a classmethod
_SOURCES: ContextVar[tuple[Path, Mapping[str, str]]] = ContextVar("evergreen_settings_sources")


class _Sources(BaseSettings, Settings):
    """Settings read through pydantic-settings' sources, highest first: `overrides`, then EVERGREEN_*
    variables (nested with `__`; JSON for lists, objects; `null` for None), then the YAML file. Sources
    merge deeply: a variable for one field leaves the file's other fields of its section alone."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        env_parse_none_str="null",
        extra="forbid",
        validate_assignment=True,
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        path, environ = _SOURCES.get()
        return init_settings, _Env(settings_cls, environ), YamlConfigSettingsSource(settings_cls, yaml_file=path)


def _check_file(path: Path) -> None:
    """A settings file that is no YAML mapping: SettingsError with the line (pydantic-settings' source would
    raise a parser traceback, or read a directory as empty settings)."""
    import yaml

    if not path.is_file():
        raise SettingsError(f"settings file {path} is not a file: give the YAML file (or {ENV_PREFIX}CONFIG)")
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise SettingsError(f"settings file {path} is not UTF-8 text: give the YAML file") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SettingsError(
            f"settings file {path} is not valid YAML{where}: {getattr(e, 'problem', None) or e}"
        ) from None
    if doc is not None and not isinstance(doc, dict):
        raise SettingsError(
            f"settings file {path}: the top level is a {type(doc).__name__}; it must map sections "
            "(grpo:, rollout:, ...) to their fields"
        )


def load_settings(
    path: str | Path | None = None, overrides: dict | None = None, environ: Mapping[str, str] | None = None
) -> Settings:
    """The settings file (default include/config/pipeline.yaml, or $EVERGREEN_CONFIG), then EVERGREEN_*
    variables of `environ` (default os.environ; {} for none: a run's resolved settings file), then
    `overrides` (nested, see `nest`). Raises SettingsError saying what to change."""
    path = Path(path or os.environ.get(ENV_PREFIX + "CONFIG", str(DEFAULT_CONFIG)))
    if not path.exists():
        raise SettingsError(f"settings file {path} does not exist: fix the path (or {ENV_PREFIX}CONFIG)")
    _check_file(path)
    token = _SOURCES.set((path, os.environ if environ is None else environ))
    try:
        return Settings.model_validate(dict(_Sources(**(overrides or {}))))
    except ValidationError as e:
        lines = [f"invalid Evergreen settings (from {path}, {ENV_PREFIX}* variables and overrides):"]
        for err in e.errors():
            if not err["loc"]:  # a rule across fields: its message names them and the fix
                lines.append(f"  {err['msg'].removeprefix('Value error, ')}")
                continue
            where = ".".join(str(p) for p in err["loc"])
            env = ENV_PREFIX + "__".join(str(p).upper() for p in err["loc"])
            lines.append(f"  {where}: {err['msg']} (got {err.get('input')!r}); fix it in {path.name} or {env}")
        raise SettingsError("\n".join(lines)) from None
    finally:
        _SOURCES.reset(token)
