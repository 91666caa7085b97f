"""tasks/stages/evaluation.py on hand-made eval tables (no engines): the challenger's version, the tables
read back, and validate_evals' comparisons and GX verdict. MLflow is replaced by a recorder: what is
logged is checked by name, the store itself is tested in tests/unit/test_tracking.py."""

from __future__ import annotations

import contextlib
import json

import pytest

from tasks.config import load_settings
from tasks.rundir import RunDir
from tasks.stages import evaluation
from tasks.stages.contracts import Comparisons

N = 10  # eval.num_tasks (its minimum)


class Recorder:
    """The Tracker calls validate_evals makes, recorded."""

    def __init__(self):
        self.metrics, self.tags, self.artifacts, self.stages = {}, {}, [], []

    @contextlib.contextmanager
    def stage_of(self, parent_run_id, name, tags=None):
        self.stages.append((parent_run_id, name))
        yield None

    def log_metrics(self, metrics, step=None):
        self.metrics.update(metrics)

    def set_tags(self, tags):
        self.tags.update(tags)

    def log_artifact(self, path, artifact_path=None):
        self.artifacts.append((str(path), artifact_path))


@pytest.fixture
def recorder(monkeypatch):
    rec = Recorder()
    monkeypatch.setattr("tasks.stages.report.tracker_of", lambda settings: rec)
    return rec


def _settings(tmp_path):
    return load_settings(
        environ={}, overrides={"run_dir": str(tmp_path), "eval": {"num_tasks": N, "interval_resamples": 200}}
    )


def _rd(settings):
    rd = RunDir.for_run(settings, "continuous_post_training", "manual__1")
    rd.write({"mlflow_run_id": "pipeline-run"}, "run.json")
    return rd


def table(greedy_solved: int, sampled: float, n: int = N, toolset: str = "2") -> list[dict]:
    return [
        {
            "task_id": f"desk-r{toolset}-eval-s1000-{i}",
            "family": "calc",
            "greedy_success": float(i < greedy_solved),
            "sampled_success": sampled,
            "sampled_reward": sampled,
            "greedy_completion_tokens": 40,
        }
        for i in range(n)
    ]


def _write_tables(rd, tables: dict):
    for (who, toolset), rows in tables.items():
        rd.write_lines(rows, f"eval_{who}_v{toolset}.jsonl")


def test_challenger_version_is_the_last_trained_step(tmp_path):
    rd = _rd(_settings(tmp_path))
    assert evaluation.challenger_version(rd) == 0, "no metrics yet: the champion's version"
    (rd.path / "grpo").mkdir()
    (rd.path / "grpo" / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "reward_mean": 0.1}) + "\n" for s in (1, 2, 3)) + "\n"
    )
    assert evaluation.challenger_version(rd) == 3


def test_eval_table_reads_what_evaluate_wrote(tmp_path):
    rd = _rd(_settings(tmp_path))
    rows = table(4, 0.5)
    rd.write_lines(rows, "eval_challenger_v2.jsonl")
    got = evaluation.eval_table(rd, "challenger", "2")
    assert got.table == rows and got.column("greedy_success") == [1.0] * 4 + [0.0] * 6
    with pytest.raises(FileNotFoundError):
        evaluation.eval_table(rd, "champion", "2")


def test_validate_evals_compares_each_toolset_paired_and_writes_comparisons(tmp_path, recorder):
    settings = _settings(tmp_path)
    rd = _rd(settings)
    _write_tables(
        rd,
        {
            ("champion", "2"): table(3, 0.25),
            ("challenger", "2"): table(8, 0.75),
            ("champion", "1"): table(9, 0.9, toolset="1"),
            ("challenger", "1"): table(9, 0.8, toolset="1"),
        },
    )
    out = evaluation.validate_evals(settings, rd)

    c = Comparisons.model_validate(rd.read("comparisons.json"))
    assert c.evals_valid is True and set(c.greedy) == set(c.sampled) == {"2", "1"}
    assert (c.greedy["2"].champion.mean, c.greedy["2"].challenger.mean) == pytest.approx((0.3, 0.8))
    assert c.greedy["2"].difference.mean == pytest.approx(0.5) and c.greedy["2"].metric == "greedy_success"
    assert c.sampled["2"].difference.mean == pytest.approx(0.5) and c.sampled["2"].metric == "sampled_success"
    assert c.greedy["1"].difference.mean == pytest.approx(0.0)
    assert c.sampled["1"].difference.mean == pytest.approx(-0.1)
    # every task moved the same way on the target: the paired interval is a point
    assert c.sampled["2"].difference.low == pytest.approx(0.5) == c.sampled["2"].difference.high
    assert out == {
        "evals_valid": True,
        "target_greedy": c.greedy["2"].difference.model_dump(),
        "target_sampled": c.sampled["2"].difference.model_dump(),
    }

    assert recorder.stages == [("pipeline-run", "evals")]
    assert recorder.tags == {"evergreen.eval_validation": "passed"}
    assert recorder.metrics["v2.greedy.challenger"] == pytest.approx(0.8)
    assert recorder.metrics["v1.sampled.champion"] == pytest.approx(0.9)
    assert recorder.metrics["v2.greedy.difference_low"] == pytest.approx(c.greedy["2"].difference.low)
    assert sorted(p.rsplit("/", 1)[-1] for p, _ in recorder.artifacts) == [
        "eval_challenger_v1.jsonl",
        "eval_challenger_v2.jsonl",
        "eval_champion_v1.jsonl",
        "eval_champion_v2.jsonl",
    ]


def test_a_table_that_fails_gx_makes_the_evals_invalid(tmp_path, recorder):
    settings = _settings(tmp_path)
    rd = _rd(settings)
    bad = table(8, 0.75)
    bad[3]["greedy_success"] = 0.5  # greedy success is 0 or 1
    _write_tables(
        rd,
        {
            ("champion", "2"): table(3, 0.25),
            ("challenger", "2"): bad,
            ("champion", "1"): table(9, 0.9, toolset="1"),
            ("challenger", "1"): table(9, 0.9, toolset="1"),
        },
    )
    assert evaluation.validate_evals(settings, rd)["evals_valid"] is False
    assert rd.read("comparisons.json")["evals_valid"] is False
    assert recorder.tags == {"evergreen.eval_validation": "failed"}


def test_too_few_eval_tasks_make_the_evals_invalid(tmp_path, recorder):
    settings = _settings(tmp_path)
    rd = _rd(settings)
    short = {
        ("champion", "2"): table(3, 0.25, n=N - 1),
        ("challenger", "2"): table(8, 0.75, n=N - 1),
        ("champion", "1"): table(9, 0.9, toolset="1"),
        ("challenger", "1"): table(9, 0.9, toolset="1"),
    }
    _write_tables(rd, short)
    assert evaluation.validate_evals(settings, rd)["evals_valid"] is False


def test_tables_on_different_tasks_are_refused(tmp_path, recorder):
    settings = _settings(tmp_path)
    rd = _rd(settings)
    other = table(8, 0.75)[::-1]  # the same tasks in another order: not a paired comparison
    _write_tables(
        rd,
        {
            ("champion", "2"): table(3, 0.25),
            ("challenger", "2"): other,
            ("champion", "1"): table(9, 0.9, toolset="1"),
            ("challenger", "1"): table(9, 0.9, toolset="1"),
        },
    )
    with pytest.raises(ValueError, match="same tasks"):
        evaluation.validate_evals(settings, rd)
    assert rd.read("comparisons.json") is None, "no comparisons for the gate to judge"


def test_a_failed_eval_validation_leaves_the_data_docs_it_points_to(tmp_path, recorder):
    settings = _settings(tmp_path)
    rd = _rd(settings)
    bad = table(8, 0.75)
    bad[3]["greedy_success"] = 0.5
    _write_tables(
        rd,
        {
            ("champion", "2"): table(3, 0.25),
            ("challenger", "2"): bad,
            ("champion", "1"): table(9, 0.9, toolset="1"),
            ("challenger", "1"): table(9, 0.9, toolset="1"),
        },
    )
    assert evaluation.validate_evals(settings, rd)["evals_valid"] is False
    assert (rd.path / "gx_docs_evals" / "index.html").exists()
