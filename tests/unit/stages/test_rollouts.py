"""tasks/stages/rollouts.py without a cluster: the toolsets a run serves, its held-out tasks written once
and read back by every later stage, the run's cluster file and its engines' namespace."""

from __future__ import annotations

from collections import Counter

import pytest

from tasks.config import load_settings
from tasks.rundir import RunDir
from tasks.stages import rollouts
from tasks.stages.contracts import ClusterInfo


def _settings(tmp_path, **env):
    return load_settings(
        environ={}, overrides={"run_dir": str(tmp_path), "eval": {"num_tasks": 12, "seed": 77}, "env": env}
    )


def _rd(settings, run_id="manual__2026-12-03T04:00:00+00:00"):
    return RunDir.for_run(settings, "continuous_post_training", run_id)


def test_toolsets_are_the_target_then_the_guard(tmp_path):
    assert rollouts.toolsets(_settings(tmp_path)) == ["2", "1"]
    assert rollouts.toolsets(_settings(tmp_path, target_toolset="1", champion_toolset="2")) == ["1", "2"]
    assert rollouts.toolsets(_settings(tmp_path, target_toolset="2", champion_toolset="2")) == ["2"]  # no guard


def test_build_tasks_writes_the_eval_tasks_and_load_tasks_reads_them_back(tmp_path):
    settings = _settings(tmp_path)
    rd = _rd(settings)
    out = rollouts.build_tasks(settings, rd, toolset="2")
    path = rd.path / "tasks" / "eval_v2.jsonl"
    assert out["path"] == str(path) and path.exists() and out["toolset"] == "2" and out["role"] == "target"
    expected = rollouts.eval_tasks(settings, "2")
    assert out["tasks"] == len(expected) == 12 == len(path.read_text().splitlines())
    assert out["families"] == dict(Counter(t.family for t in expected)) and sum(out["families"].values()) == 12
    loaded = rollouts.load_tasks(rd, "2")
    assert loaded == expected, "a later stage must meet exactly the tasks build_tasks drew"
    assert len({t.task_id for t in loaded}) == 12


def test_the_guard_toolset_gets_its_own_tasks_with_its_own_tools(tmp_path):
    settings = _settings(tmp_path)
    rd = _rd(settings)
    assert rollouts.build_tasks(settings, rd, toolset="1")["role"] == "guard"
    rollouts.build_tasks(settings, rd, toolset="2")
    v1, v2 = rollouts.load_tasks(rd, "1"), rollouts.load_tasks(rd, "2")
    assert sorted(p.name for p in (rd.path / "tasks").iterdir()) == ["eval_v1.jsonl", "eval_v2.jsonl"]
    tools = lambda tasks: {t["function"]["name"] for task in tasks for t in task.tools}  # noqa: E731
    assert tools(v1) != tools(v2), "each toolset's tasks offer that toolset's tools"


def test_eval_tasks_are_fixed_by_the_eval_seed_and_split(tmp_path):
    settings = _settings(tmp_path)
    again = rollouts.eval_tasks(settings, "2")
    assert again == rollouts.eval_tasks(settings, "2")
    other_seed = settings.model_copy(update={"eval": settings.eval.model_copy(update={"seed": 78})})
    assert [t.question for t in rollouts.eval_tasks(other_seed, "2")] != [t.question for t in again]
    dev = settings.model_copy(update={"eval": settings.eval.model_copy(update={"split": "dev"})})
    assert {t.question for t in rollouts.eval_tasks(dev, "2")}.isdisjoint({t.question for t in again})


def test_a_rebuild_replaces_the_file_and_reads_the_same(tmp_path):
    settings = _settings(tmp_path)
    rd = _rd(settings)
    rollouts.build_tasks(settings, rd, toolset="2")
    first = (rd.path / "tasks" / "eval_v2.jsonl").read_text()
    rollouts.build_tasks(settings, rd, toolset="2")  # a retried task
    assert (rd.path / "tasks" / "eval_v2.jsonl").read_text() == first
    assert sorted(p.name for p in (rd.path / "tasks").iterdir()) == ["eval_v2.jsonl"]  # no temporary file left


def test_load_tasks_without_build_tasks_names_the_stage(tmp_path):
    rd = _rd(_settings(tmp_path))
    with pytest.raises(FileNotFoundError, match="build_tasks"):
        rollouts.load_tasks(rd, "2")


def test_cluster_of_reads_the_setup_file_or_names_the_task(tmp_path):
    rd = _rd(_settings(tmp_path))
    with pytest.raises(FileNotFoundError, match="ray_cluster_setup"):
        rollouts.cluster_of(rd)
    rd.write(ClusterInfo(backend="local", address="127.0.0.1:6390", env={"RAY_AUTH_MODE": "token"}), "cluster.json")
    info = rollouts.cluster_of(rd)
    assert isinstance(info, ClusterInfo) and info.address == "127.0.0.1:6390" and info.env == {"RAY_AUTH_MODE": "token"}
    rd.write({"backend": "slurm", "address": "x"}, "cluster.json")
    with pytest.raises(ValueError, match="backend"):
        rollouts.cluster_of(rd)


def test_engine_namespace_is_one_per_run(tmp_path):
    settings = _settings(tmp_path)
    a, b = _rd(settings, "manual__a"), _rd(settings, "manual__b")
    assert rollouts.engine_namespace(settings, a) == rollouts.engine_namespace(settings, _rd(settings, "manual__a"))
    assert rollouts.engine_namespace(settings, a) != rollouts.engine_namespace(settings, b)
    assert rollouts.engine_namespace(settings, a).startswith("evergreen-engines-")
    shared = settings.model_copy(update={"ray": settings.ray.model_copy(update={"engine_namespace": "day-3"})})
    assert rollouts.engine_namespace(shared, a) == rollouts.engine_namespace(shared, b) == "day-3"


def test_a_served_toolset_is_pinned_to_what_the_run_read_first(tmp_path):
    """The tools change (a file a tool watch reads, rewritten) after the run's first stage: every later
    stage still gets the first copy, under the same hash label, and the run's files keep their names."""
    import shutil

    from tasks.envs.toolset import load_toolset, shipped_toolset_path, toolset_label

    served = tmp_path / "served.json"
    shutil.copy(shipped_toolset_path("2", "desk"), served)
    settings = _settings(tmp_path / "runs", target_toolset=str(served))
    rd = _rd(settings)
    label = toolset_label(served, "desk")
    first = rollouts.pin_toolsets(settings, rd)
    pinned = rd.path / "toolsets" / "target_toolset.json"
    assert first.env.target_toolset == str(pinned) and first.env.champion_toolset == "1"  # shipped: as is
    rollouts.build_tasks(first, rd, first.env.target_toolset)

    shutil.copy(shipped_toolset_path("1", "desk"), served)  # the served tools change mid-run
    later = rollouts.pin_toolsets(settings, rd)  # a later stage starts from the run's raw settings
    assert later.env.target_toolset == str(pinned) and rollouts.pin_toolsets(later, rd) == later
    assert load_toolset(pinned)["tools"] == load_toolset(shipped_toolset_path("2", "desk"))["tools"]
    now = shutil.copy(served, tmp_path / "now.json")  # what is served now, at a path not labelled before
    assert toolset_label(pinned, "desk") == label != toolset_label(now, "desk")
    assert rollouts.load_tasks(rd, later.env.target_toolset, "desk")  # eval_<label>.jsonl found by name


def test_an_unreadable_toolset_is_left_for_the_stage_that_needs_it(tmp_path, caplog):
    settings = _settings(tmp_path / "runs", target_toolset="mcp:http://127.0.0.1:9/mcp")
    assert rollouts.pin_toolsets(settings, _rd(settings)) == settings
    assert "not pinned" in caplog.text
