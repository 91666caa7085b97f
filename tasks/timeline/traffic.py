"""A day of production traffic for the timeline: the deployed model's episodes through vLLM, as traces.

    traffic = Traffic(settings, "runs/timeline/traffic")
    traffic.serve(day, model_dir, "runs/timeline/evergreen/traces")   # {"success", "workloads", "malformed"}

Traffic depends only on the model's weights and the day (its tasks, toolset, mix and malformed lines): it is
simulated once per (weights, day) under the cache directory and copied into every policy that deployed
that model, so two policies serving the same champion see the same day. One vLLM engine serves the whole
month; each model's weights are loaded into it in turn (tasks.signals.simulate, greedy as it is served).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from datetime import UTC, datetime, timedelta
from datetime import time as clock
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tasks.config import Settings
    from tasks.policy.backends import VLLMBackend
    from tasks.timeline.plan import Day


def digest(model_dir: Path) -> str:
    """The model's weights' sha256 (12 hex digits): one traffic simulation per model and day, whoever deploys it."""
    h = hashlib.sha256()
    with open(model_dir / "model.safetensors", "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:12]


class Traffic:
    def __init__(self, settings: Settings, cache: Path) -> None:
        self.settings, self.cache = settings, Path(cache)
        self._engine: VLLMBackend | None = None

    def serve(self, day: Day, model: Path, traces: Path) -> dict:
        """`day`'s traffic by `model` into the trace directory `traces` (its date partition)."""
        from tasks.signals.simulate import simulate_traces

        cache = self.cache / f"{digest(model)}-day-{day.index:02d}"
        if not (cache / "manifest.json").exists():
            start = datetime.combine(day.date, clock(), tzinfo=UTC)
            scratch = cache.with_name(cache.name + ".tmp")
            shutil.rmtree(scratch, ignore_errors=True)
            simulate_traces(
                scratch,
                start,
                start + timedelta(days=1),
                self.settings.timeline.traces_per_day,
                [(start, day.toolset)],
                policy=str(model),
                settings=self.settings,
                malformed_share=day.malformed_share,
                seed=self.settings.grpo.seed * 1000 + day.index,
                mix=day.mix,
                temperature=0.0,
                backend=self.engine(model),
            )
            scratch.rename(cache)
        manifest = json.loads((cache / "manifest.json").read_text())
        partition = f"date={day.date.isoformat()}"
        if not (traces / partition).exists():
            shutil.copytree(cache / partition, traces / partition)
        return {
            "success": manifest["success_rate"][day.toolset],
            "workloads": manifest["workloads"],
            "malformed": sum(manifest["malformed"].values()),
        }

    def engine(self, model: Path) -> VLLMBackend:
        """One vLLM engine for all the traffic of the month: each model's weights are loaded into it in turn."""
        if self._engine is None:
            from tasks.policy.backends import VLLMBackend

            s = self.settings
            self._engine = VLLMBackend(
                str(model), max_len=s.model.max_len, kv_cache_mb=s.rollout.kv_cache_mb, dtype=s.model.dtype
            )
        return self._engine
