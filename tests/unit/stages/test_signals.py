"""tasks/stages/signals.py and the run directory: when to train (pure, and as the stage the branch and
the skip read), the asset event's extra, run directories."""

from tasks.config import load_settings
from tasks.rundir import RunDir
from tasks.stages.signals import decide_training as should_train
from tasks.stages.signals import retrain_request_extra


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


def test_a_breaking_tool_change_event_trains_even_without_new_data_and_says_why():
    empty = {"retrain": False, "summary": "no data", "rows": {"current": 0}}
    event = {
        "asset_events": [
            {
                "extra": {
                    "from_trigger": True,
                    "payload": {
                        "kind": "tool_change",
                        "summary": "tool change: tool renamed a -> b",
                        "source": "mcp:http://h/mcp",
                    },
                }
            }
        ]
    }
    train, reason = should_train(empty, event)
    assert train and reason == "tool change: tool renamed a -> b (watched at mcp:http://h/mcp)"


def test_retrain_request_extra_is_small_and_keeps_the_reasons():
    verdict = {
        "retrain": True,
        "window": "a/b",
        "summary": "x" * 2000,
        "reasons": ["r" * 1000] * 30,
        "registry_hash": "abc",
        "rows": {"current": 3},
        "tool_change_breaking": True,
        "drifted": False,
    }
    extra = retrain_request_extra(verdict)
    assert len(extra["summary"]) == 500 and len(extra["reasons"]) == 10 and len(extra["reasons"][0]) == 300
    assert extra["retrain"] is True and extra["registry_hash"] == "abc"


def test_run_dir_is_safe_and_writes_atomically(tmp_path):
    settings = load_settings(environ={}, overrides={"run_dir": str(tmp_path)})
    rd = RunDir.for_run(settings, "continuous_post_training", "manual__2026-12-03T04:00:00+00:00/../x")
    assert rd.path.parent == tmp_path / "continuous_post_training" and ".." not in rd.path.name
    rd.write({"a": 1}, "sub", "f.json")
    assert rd.read("sub", "f.json") == {"a": 1} and rd.read("missing.json", default=7) == 7
    assert sorted(p.name for p in (rd.path / "sub").iterdir()) == ["f.json"]  # no temporary file left


def test_should_train_is_decided_once_and_the_skip_records_it(tmp_path):
    from tasks.stages.signals import should_train as stage
    from tasks.stages.signals import skip

    settings = load_settings(environ={}, overrides={"run_dir": str(tmp_path)})
    rd = RunDir.for_run(settings, "continuous_post_training", "r1")
    rd.write({"retrain": False, "summary": "no drift", "rows": {"current": 5}}, "signals.json")
    assert stage(settings, rd, trigger={}) == {
        "schema_version": 1,
        "train": False,
        "reason": "no drift and no breaking tool change: no drift",
    }
    assert stage(settings, rd, trigger={}, force=True)["train"] is True
    rd.write({"train": False, "reason": "quiet"}, "should_train.json")
    assert skip(settings, rd) == {"skipped": True, "reason": "quiet"} and rd.read("skip.json")["reason"] == "quiet"


def test_atomic_write_leaves_no_temporary_file_when_it_fails(tmp_path):
    import pytest

    from tasks.storage import atomic_writer, write_atomic

    target = write_atomic(tmp_path / "a" / "f.json", "old")
    with pytest.raises(RuntimeError), atomic_writer(target) as f:
        f.write(b"half")
        raise RuntimeError("crash mid-write")
    assert target.read_text() == "old" and sorted(p.name for p in target.parent.iterdir()) == ["f.json"]


def test_a_missing_trace_source_is_an_error_naming_the_setting_and_an_empty_one_is_no_data(tmp_path):
    import pytest

    from tasks.signals.traces import Window
    from tasks.stages.signals import _has_traces

    window = Window.parse("2026-12-05")
    with pytest.raises(FileNotFoundError, match="monitor.traces=.*EVERGREEN_MONITOR__TRACES"):
        _has_traces(str(tmp_path / "prodution-typo"), window)
    (tmp_path / "empty").mkdir()
    assert _has_traces(str(tmp_path / "empty"), window) is False


def test_s3_failures_keep_their_meaning():
    import pytest
    from botocore.exceptions import ClientError

    from tasks.storage import s3_error

    def failure(code: str) -> ClientError:
        return ClientError({"Error": {"Code": code, "Message": code}}, "ListObjectsV2")

    assert isinstance(s3_error(failure("NoSuchBucket"), "s3://b/p"), FileNotFoundError)
    assert isinstance(s3_error(failure("NoSuchKey"), "s3://b/k"), FileNotFoundError)
    denied = s3_error(failure("AccessDenied"), "s3://b/p")
    assert isinstance(denied, PermissionError) and "credentials" in str(denied)
    for code in ("SlowDown", "InternalError", "ServiceUnavailable"):  # not "no data": raised as they are
        error = failure(code)
        assert s3_error(error, "s3://b/p") is error
    with pytest.raises(FileNotFoundError):
        raise s3_error(failure("404"), "s3://b/k")
