"""Great Expectations 1.x validation of pandas frames against the suites kept in `include/gx/`.

    from tasks.data.validation import Validator
    v = Validator(docs_dir="runs/x/gx_docs")                 # data docs are written there
    result = v.validate("traces", frame, {"window_start": 0.0, "future_limit": 1.8e9}, docs=True)
    result.success, result.failed_rows()                      # {row index: reason}
    result.raise_for_failure()                                # BatchValidationError naming expectation, observed, threshold

A suite file is GX's own serialisation (`{"name", "expectations": [{"type", "kwargs", "meta"}]}`), with
thresholds as `{"$PARAMETER": name}` so that one suite serves every configured threshold. Each
expectation's `meta.reason` is the short reason a quarantined row or a failed batch carries.

The context is ephemeral (nothing written besides the data docs); analytics and progress bars are off.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasks.config import PROJECT_ROOT

if TYPE_CHECKING:
    import pandas as pd

SUITE_DIR = PROJECT_ROOT / "include" / "gx"
DOCS_SITE = "evergreen"


class BatchValidationError(ValueError):
    """A batch failed a batch-level expectation; the message names it, the observed value and the threshold."""

    def __init__(self, suite: str, failures: list[dict]) -> None:
        self.suite, self.failures = suite, failures
        self.summary: dict | None = None  # the window's counts, where ingest raises it (tasks.signals.ingest)
        super().__init__(f"suite {suite!r} failed: " + "; ".join(f["message"] for f in failures))


def load_suite_spec(name: str) -> dict:
    path = SUITE_DIR / f"{name}.json"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in SUITE_DIR.glob("*.json")))
        raise FileNotFoundError(f"no GX suite {name!r} in {SUITE_DIR}; known suites: {known}")
    return json.loads(path.read_text())


def _threshold(kwargs: dict, params: dict) -> dict:
    """The expectation's bounds with parameters filled in (what a failure message shows)."""
    out = {}
    for k, v in kwargs.items():
        if k in ("column", "column_A", "column_B", "column_list", "batch_id"):
            continue
        out[k] = params.get(v["$PARAMETER"]) if isinstance(v, dict) and "$PARAMETER" in v else v
    return {k: v for k, v in out.items() if v is not None}


@dataclass
class ExpectationOutcome:
    expectation: str
    column: str | None
    reason: str
    success: bool
    threshold: dict
    observed: Any = None
    unexpected_count: int = 0
    unexpected_index: list[int] = field(default_factory=list)

    @property
    def message(self) -> str:
        where = self.column or "table"
        bounds = ", ".join(f"{k}={v}" for k, v in self.threshold.items())
        return f"{self.expectation}({where}; {bounds}): observed {self.observed!r} ({self.reason})"

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d.pop("unexpected_index")
        d["message"] = self.message
        return d


@dataclass
class SuiteOutcome:
    suite: str
    success: bool
    rows: int
    expectations: list[ExpectationOutcome]

    def failed_rows(self) -> dict[int, str]:
        """Row index -> the reasons of every row-level expectation it failed (joined)."""
        out: dict[int, list[str]] = {}
        for e in self.expectations:
            for i in e.unexpected_index:
                out.setdefault(int(i), []).append(e.reason)
        return {i: "; ".join(r) for i, r in out.items()}

    def raise_for_failure(self) -> None:
        failed = [e.to_dict() for e in self.expectations if not e.success]
        if failed:
            raise BatchValidationError(self.suite, failed)

    def to_dict(self) -> dict:
        return {
            "suite": self.suite,
            "success": self.success,
            "rows": self.rows,
            "expectations": [e.to_dict() for e in self.expectations],
        }


class Validator:
    """One ephemeral GX context; suites and validation definitions are made once and reused per batch."""

    def __init__(self, docs_dir: str | Path | None = None) -> None:
        os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
        logging.getLogger("great_expectations").setLevel(logging.WARNING)  # its INFO lines are per-call noise
        import great_expectations as gx
        from great_expectations.data_context.types.base import (
            DataContextConfig,
            InMemoryStoreBackendDefaults,
            ProgressBarsConfig,
        )

        self._gx = gx
        self.docs_dir = Path(docs_dir) if docs_dir else None
        sites = {}
        if self.docs_dir:
            sites[DOCS_SITE] = {
                "class_name": "SiteBuilder",
                "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(self.docs_dir)},
                "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
            }
        config = DataContextConfig(
            store_backend_defaults=InMemoryStoreBackendDefaults(),
            analytics_enabled=False,
            progress_bars=ProgressBarsConfig(globally=False),
            data_docs_sites=sites,
        )
        self.context = gx.get_context(mode="ephemeral", project_config=config)
        self._source = self.context.data_sources.add_pandas("evergreen")
        self._definitions: dict[str, Any] = {}
        self._checkpoints: dict[str, Any] = {}

    def _definition(self, suite_name: str) -> Any:
        if suite_name not in self._definitions:
            gx = self._gx
            spec = load_suite_spec(suite_name)
            suite = self.context.suites.add(
                gx.ExpectationSuite(name=spec["name"], expectations=spec["expectations"], meta=spec.get("meta", {}))
            )
            batch = self._source.add_dataframe_asset(suite_name).add_batch_definition_whole_dataframe("batch")
            vd = self.context.validation_definitions.add(
                gx.ValidationDefinition(name=suite_name, data=batch, suite=suite)
            )
            self._definitions[suite_name] = vd
            if self.docs_dir:
                self._checkpoints[suite_name] = self.context.checkpoints.add(
                    gx.Checkpoint(
                        name=suite_name,
                        validation_definitions=[vd],
                        result_format={"result_format": "COMPLETE"},
                        actions=[gx.checkpoint.UpdateDataDocsAction(name="data_docs", site_names=[DOCS_SITE])],
                    )
                )
        return self._definitions[suite_name]

    def validate(
        self, suite_name: str, frame: pd.DataFrame, params: dict | None = None, docs: bool = False
    ) -> SuiteOutcome:
        """Validate one frame; `docs=True` also renders the result into the data docs (about 0.3 s)."""
        params = dict(params or {})
        vd = self._definition(suite_name)
        if docs and self.docs_dir:
            run = self._checkpoints[suite_name].run(
                batch_parameters={"dataframe": frame}, expectation_parameters=params
            )
            result = next(iter(run.run_results.values()))
        else:
            result = vd.run(
                batch_parameters={"dataframe": frame},
                expectation_parameters=params,
                result_format={"result_format": "COMPLETE"},
            )
        outcomes = []
        for r in result.results:
            cfg = r.expectation_config
            res = r.result or {}
            index = res.get("unexpected_index_list") or []
            observed = _observed(res) if not r.success else res.get("observed_value")
            outcomes.append(
                ExpectationOutcome(
                    expectation=cfg.type,
                    column=cfg.kwargs.get("column") or _pair(cfg.kwargs),
                    reason=(cfg.meta or {}).get("reason", cfg.type),
                    success=bool(r.success),
                    threshold=_threshold(cfg.kwargs, params),
                    observed=_plain(observed),
                    unexpected_count=int(res.get("unexpected_count") or 0),
                    unexpected_index=[
                        int(i) if not isinstance(i, dict) else int(next(iter(i.values()))) for i in index
                    ],
                )
            )
        return SuiteOutcome(suite_name, bool(result.success), len(frame), outcomes)

    def docs_index(self) -> Path | None:
        return self.docs_dir / "index.html" if self.docs_dir and (self.docs_dir / "index.html").exists() else None


def _observed(res: dict) -> Any:
    """What a failed expectation saw: its observed value, else (one-row batch frames) the failing value,
    else (set expectations) the missing members."""
    if res.get("observed_value") is not None:
        return res["observed_value"]
    if res.get("partial_unexpected_list"):
        return res["partial_unexpected_list"][0]
    if res.get("partial_missing_list"):
        return {"missing": list(res["partial_missing_list"])}
    return None


def _pair(kwargs: dict) -> str | None:
    if "column_A" in kwargs:
        return f"{kwargs['column_A']},{kwargs['column_B']}"
    if "column_list" in kwargs:
        return ",".join(kwargs["column_list"])
    return None


def _plain(v: Any) -> Any:
    """Numpy scalars, tuples and sets, at any depth -> JSON-serialisable values."""
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, set):
        return sorted(_plain(x) for x in v)
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if hasattr(v, "item"):
        return v.item()
    return v
