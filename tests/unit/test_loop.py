"""The pure parts of tasks/loop.py: when to train, the asset event's extra, run directories."""
from tasks.loop import RunDir, retrain_request_extra, should_train
from tasks.config import load_settings


def test_should_train_on_drift_force_or_event_with_data_only():
    moved = {"retrain": True, "summary": "tool change", "rows": {"current": 500}}
    calm = {"retrain": False, "summary": "no drift", "rows": {"current": 500}}
    empty = {"retrain": False, "summary": "no data", "rows": {"current": 0}}
    event = {"asset_events": [{"extra": {"retrain": True}}]}
    assert should_train(moved, {})[0]
    assert not should_train(calm, {})[0] and "no drift" in should_train(calm, {})[1]
    assert should_train(calm, {}, force=True) == (True, "forced by the `force` param")
    assert should_train(calm, event)[0], "an event asking for retraining with new data trains"
    assert not should_train(empty, event)[0], "nothing to learn from: the cheap skip"
    assert not should_train({**moved, "no_champion": True, "summary": "no champion"}, {}, force=True)[0]


def test_retrain_request_extra_is_small_and_keeps_the_reasons():
    verdict = {"retrain": True, "window": "a/b", "summary": "x" * 2000, "reasons": ["r" * 1000] * 30,
               "registry_hash": "abc", "rows": {"current": 3}, "tool_change_breaking": True, "drifted": False}
    extra = retrain_request_extra(verdict)
    assert len(extra["summary"]) == 500 and len(extra["reasons"]) == 10 and len(extra["reasons"][0]) == 300
    assert extra["retrain"] is True and extra["registry_hash"] == "abc"


def test_run_dir_is_safe_and_writes_atomically(tmp_path):
    settings = load_settings(environ={}, overrides={"run_dir": str(tmp_path)})
    rd = RunDir.for_run(settings, "continuous_post_training", "manual__2026-12-03T04:00:00+00:00/../x")
    assert rd.path.parent == tmp_path / "continuous_post_training" and ".." not in rd.path.name
    rd.write({"a": 1}, "sub", "f.json")
    assert rd.read("sub", "f.json") == {"a": 1} and rd.read("missing.json", default=7) == 7
    assert not list(rd.path.rglob("*.tmp"))
