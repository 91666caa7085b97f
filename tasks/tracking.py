"""MLflow tracking, the one chokepoint: a pipeline run is an MLflow run, each stage a nested run.

    from tasks.tracking import Tracker
    tracker = Tracker("http://127.0.0.1:5000", experiment="evergreen")
    with tracker.pipeline_run("nightly", tags={"airflow.dag_id": dag_id, "airflow.run_id": run_id}, settings=s):
        with tracker.stage("rollouts"):
            tracker.log_metrics({"reward": 0.4}, step=1)
        tracker.log_dataset(frame, name="traces-2026-12-01", source="s3://bucket/traces/", context="training")
        tracker.log_artifacts("runs/x/monitor", "signals")

Params are the resolved settings, flattened (`grpo.lr`); anything that looks like a credential is
redacted before it leaves the process (values of keys named like secret/password/token/credential,
and user:password@ in URLs). The MLflow client retries a few times with a short timeout, so a server
that is down fails the step within a minute instead of hanging it (MLFLOW_HTTP_REQUEST_* to change).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tasks.config import Settings

# "token" only as a whole last word: `max_tokens_per_turn` or `trained_tokens` are figures, not secrets
_SECRET_KEY = re.compile(
    r"secret|password|passwd|credential|access_key|api_key|(^|[._])(auth_|access_|api_)?token$", re.I
)
_URL_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")


def redact(key: str, value: Any) -> Any:
    if value is not None and _SECRET_KEY.search(key):
        return "***"
    if isinstance(value, str):
        return _URL_USERINFO.sub("***@", value)
    return value


def flatten(d: dict, prefix: str = "", redacted: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + ".", redacted))
        else:
            out[key] = redact(key, v) if redacted else v
    return out


def credentials_to_environment(uri: str) -> str:
    """`uri` without its user:password@, which go to MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD (where
    those are not set already): MLflow authenticates from them, and the URI that ends up in run links,
    run.json, logs and the page carries no credential."""
    from urllib.parse import unquote, urlsplit

    netloc = urlsplit(uri).netloc
    if uri.startswith("http") and "@" in netloc:
        user, _, password = netloc.rsplit("@", 1)[0].partition(":")
        os.environ.setdefault("MLFLOW_TRACKING_USERNAME", unquote(user))
        if password:
            os.environ.setdefault("MLFLOW_TRACKING_PASSWORD", unquote(password))
    return without_credentials(uri) or uri


def without_credentials(uri: str | None) -> str | None:
    """An http(s) URI with its user:password@ removed (other URIs as they are). Pure."""
    from urllib.parse import urlsplit, urlunsplit

    if not uri or not uri.startswith("http"):
        return uri
    parts = urlsplit(uri)
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[-1]))


def fail_fast() -> None:
    """A down server should fail the step within a minute (MLflow's defaults retry for minutes);
    explicit MLFLOW_HTTP_REQUEST_* variables win."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")


class Tracker:
    """Wraps the MLflow client for one experiment; stages nest under the active pipeline run."""

    def __init__(
        self,
        tracking_uri: str | None = None,
        experiment: str = "evergreen",
        artifact_location: str | Path | None = None,
    ):
        fail_fast()
        import mlflow

        self.mlflow = mlflow
        if tracking_uri:
            mlflow.set_tracking_uri(credentials_to_environment(tracking_uri))
        self.tracking_uri = mlflow.get_tracking_uri()
        if artifact_location is not None and mlflow.get_experiment_by_name(experiment) is None:
            # a server-less store would put artifacts in ./mlruns of whatever directory we run in
            mlflow.create_experiment(experiment, artifact_location=Path(artifact_location).resolve().as_uri())
        self.experiment = mlflow.set_experiment(experiment)

    @classmethod
    def from_settings(cls, settings: Settings) -> Tracker:
        """The configured server, or a SQLite store under run_dir (mlflow.db + mlartifacts/)."""
        t = settings.tracking
        if t.uri:
            return cls(t.uri, t.experiment)
        run_dir = settings.local_root  # local: settings refuse an S3 run_dir without tracking.uri
        run_dir.mkdir(parents=True, exist_ok=True)
        return cls(f"sqlite:///{run_dir / 'mlflow.db'}", t.experiment, artifact_location=run_dir / "mlartifacts")

    @contextlib.contextmanager
    def pipeline_run(
        self, name: str, tags: dict[str, str] | None = None, settings: Settings | None = None
    ) -> Iterator[Any]:
        with self.mlflow.start_run(run_name=name, tags={k: str(redact(k, v)) for k, v in (tags or {}).items()}) as run:
            if settings is not None:
                self.log_params(settings.model_dump(mode="json"))
            yield run

    def open_run(self, name: str, tags: dict[str, str] | None = None, settings: Settings | None = None) -> str:
        """Start a pipeline run that later processes (Airflow tasks) add stages to; returns its id."""
        with self.pipeline_run(name, tags=tags, settings=settings) as run:
            run_id = run.info.run_id
        self.mlflow.MlflowClient().update_run(run_id, status="RUNNING")  # open until finish()
        return run_id

    @contextlib.contextmanager
    def within(self, run_id: str) -> Iterator[Any]:
        """Log into a pipeline run opened by another process (open_run); it stays RUNNING until finish()."""
        with self.mlflow.start_run(run_id=run_id) as run:
            yield run
        self.mlflow.MlflowClient().update_run(run_id, status="RUNNING")  # leaving the block marked it FINISHED

    @contextlib.contextmanager
    def stage_of(self, parent_run_id: str, name: str, tags: dict[str, str] | None = None) -> Iterator[Any]:
        """A stage nested under a pipeline run opened by another process."""
        with self.within(parent_run_id), self.stage(name, tags) as run:
            yield run

    def finish(self, run_id: str, status: str) -> None:
        """End a pipeline run opened with open_run: FINISHED or FAILED."""
        self.mlflow.MlflowClient().set_terminated(run_id, status)

    def url_of(self, run_id: str) -> str:
        return self.run_url(self.mlflow.get_run(run_id))

    @contextlib.contextmanager
    def stage(self, name: str, tags: dict[str, str] | None = None) -> Iterator[Any]:
        with self.mlflow.start_run(run_name=name, nested=True, tags={"evergreen.stage": name, **(tags or {})}) as run:
            yield run

    def log_params(self, params: dict) -> None:
        flat = {k: ("" if v is None else str(v))[:6000] for k, v in flatten(params).items()}
        items = list(flat.items())
        for i in range(0, len(items), 100):  # the REST API takes at most 100 params per batch
            self.mlflow.log_params(dict(items[i : i + 100]))

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        # metrics are numbers, never credentials: no redaction (it would drop e.g. `trained_tokens`)
        clean = {
            k: float(v)
            for k, v in flatten(metrics, redacted=False).items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        self.mlflow.log_metrics(clean, step=step)

    def set_tags(self, tags: dict[str, Any]) -> None:
        self.mlflow.set_tags({k: str(redact(k, v)) for k, v in tags.items()})

    def log_artifacts(self, local_dir: str | Path, artifact_path: str | None = None) -> None:
        self.mlflow.log_artifacts(str(local_dir), artifact_path)

    def log_model(self, model_dir: str | Path, artifact_path: str = "model") -> None:
        """A saved model directory as an MLflow model of the transformers flavor (`MLmodel`, the directory
        unchanged under `model/`, its tokenizer under `components/`, a pyfunc for OpenAI-style chat), so that
        `mlflow.transformers.load_model` / `mlflow.pyfunc.load_model` and MLflow's serving read a registry
        version; Evergreen's loaders take the directory under `model/` (tasks.policy.model.resolve_model_dir)."""
        import tempfile

        import mlflow.transformers
        import torch
        import transformers
        from huggingface_hub import ModelCard

        with tempfile.TemporaryDirectory(prefix="evergreen-mlmodel-") as tmp:
            out = Path(tmp) / "model"
            # a local checkpoint: MLflow copies the directory as it is (checksums included); pinned requirements
            # and a card of our own, so nothing is inferred by importing the model or asked of the Hub
            mlflow.transformers.save_model(
                transformers_model=str(model_dir),
                path=str(out),
                task="llm/v1/chat",
                pip_requirements=[f"transformers=={transformers.__version__}", f"torch=={torch.__version__}"],
                model_card=ModelCard("Evergreen agent: a policy trained by the Evergreen loop."),
            )
            self.mlflow.log_artifacts(str(out), artifact_path)

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        self.mlflow.log_artifact(str(path), artifact_path)

    def log_dict(self, data: dict, artifact_file: str) -> None:
        self.mlflow.log_dict(data, artifact_file)

    def log_dataset(self, frame: Any, name: str, source: str, context: str) -> str:
        """Record a dataset input (its digest, schema and source) through mlflow.data."""
        dataset = self.mlflow.data.from_pandas(frame, source=str(redact("source", source)), name=name)
        self.mlflow.log_input(dataset, context=context)
        return dataset.digest

    def run_url(self, run: Any) -> str:
        """A link to the run in the MLflow UI (for a SQLite store: the `mlflow ui` command that serves it)."""
        if self.tracking_uri.startswith("http"):
            return f"{self.tracking_uri.rstrip('/')}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}"
        return (
            f"mlflow ui --backend-store-uri {self.tracking_uri} --port 5000, then "
            f"http://127.0.0.1:5000/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}"
        )
