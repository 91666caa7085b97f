"""The hash tagged on a model version (tasks.promotion.step) and the drift monitor's hash (tasks.signals.monitor)
of the same toolset are equal, whether the toolset is given as a shipped version, a file path (JSON or YAML)
or a dict: both read it through the one loader, tasks.envs.toolset.load_toolset."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest
import yaml

from tasks.config import load_settings
from tasks.envs.desk import TOOLSET_DIR
from tasks.signals.monitor import check_production
from tasks.signals.toolset_hash import schema_hash
from tasks.signals.traces import Window
from tasks.signals.windowstats import WindowStats

SHIPPED_V2 = TOOLSET_DIR / "registry_v2.json"


class _FakeModelRegistry:
    """Just enough of tasks.promotion.registry.ModelRegistry to see the tags a version is registered with."""

    registered: list[dict] = []

    def __init__(self, name):
        pass

    def register(self, run_id, path, run_key, tags):
        self.registered.append(tags)
        return "7"

    def moved_for(self, run_key):
        return False

    def set_challenger(self, version):
        pass

    def record_not_promoted(self, version, decision):
        pass

    def aliases(self):
        return {}


@pytest.fixture
def ingested(tmp_path):
    """An ingest output with no traces (reference = current): the monitor's drift part is a no-op."""
    d = tmp_path / "ingested"
    d.mkdir()
    (d / "stats.json").write_text(json.dumps(WindowStats().to_dict()))
    (d / "summary.json").write_text(json.dumps({"rows_accepted": 0, "verdict": "passed"}))
    champion = tmp_path / "champion"
    champion.mkdir()
    shutil.copy(TOOLSET_DIR / "registry_v1.json", champion / "tool_registry.json")
    return d, champion


def _monitor_hash(settings, ingested, toolset, out) -> str:
    source, champion = ingested
    verdict = check_production(
        settings, source, out, Window.parse("2026-11-22"), champion=champion, toolset=toolset, reference=source
    )
    assert verdict["tool_change_breaking"]  # v1 -> v2: the diff ran against the toolset given
    return verdict["registry_hash"]


def _tag_hash(settings, target: str, monkeypatch) -> str:
    from tasks.promotion import step

    monkeypatch.setattr("tasks.promotion.registry.ModelRegistry", _FakeModelRegistry)
    _FakeModelRegistry.registered = []
    s = settings.model_copy(update={"env": settings.env.model_copy(update={"target_toolset": target})})
    comparisons = {target: {"difference": {"mean": 0.1}, "challenger": {"mean": 0.5}}}
    decision = SimpleNamespace(promote=False, to_dict=lambda: {}, summary="held")
    step.apply_decision(s, decision, {"total_usd": 0.0, "run_usd": 0.0}, comparisons, "run", "key")
    (tags,) = _FakeModelRegistry.registered
    return tags["evergreen.registry_hash"]


@pytest.mark.parametrize("form", ["version", "path", "yaml", "dict"])
def test_model_version_tag_and_monitor_hash_agree(form, ingested, tmp_path, monkeypatch):
    settings = load_settings(environ={})
    copy = tmp_path / "toolsets" / "current.json"
    copy.parent.mkdir()
    shutil.copy(SHIPPED_V2, copy)
    as_yaml = copy.with_suffix(".yaml")
    as_yaml.write_text(yaml.safe_dump(json.loads(SHIPPED_V2.read_text())))
    toolset = {"version": "2", "path": str(copy), "yaml": str(as_yaml), "dict": json.loads(SHIPPED_V2.read_text())}[
        form
    ]

    monitor = _monitor_hash(settings, ingested, toolset, tmp_path / "monitor")
    if form == "dict":  # a setting is a string: the tag's hash function itself, as step.py calls it
        tag = schema_hash(toolset, settings.env.name)
    else:
        tag = _tag_hash(settings, toolset, monkeypatch)
    assert tag == monitor == schema_hash("2")
    assert tag.startswith("sha256:") and tag != schema_hash("1")
