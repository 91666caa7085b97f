"""The registry on a server-less SQLite MLflow store (what `make demo` uses): versions come back as
ints there, strings over REST; aliases must compare the same either way."""

from __future__ import annotations

from tasks.promotion.registry import ModelRegistry
from tasks.tracking import Tracker


def test_promote_consumes_the_challenger_alias_on_a_sqlite_store(tmp_path):
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "unit", artifact_location=tmp_path / "artifacts")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "weights.bin").write_bytes(b"w")
    with tracker.pipeline_run("r") as run:
        tracker.log_artifacts(tmp_path / "model", "model")
    reg = ModelRegistry("unit-agent")
    v1 = reg.register(run.info.run_id, "model", run_key="a")
    reg.promote(v1, run_key="a")
    v2 = reg.register(run.info.run_id, "model", run_key="b")
    reg.set_challenger(v2)
    assert reg.aliases() == {"champion": v1, "challenger": v2}
    reg.promote(v2, run_key="b")
    assert reg.aliases() == {"champion": v2, "previous": v1} == {"champion": "2", "previous": "1"}
    assert (tmp_path / "artifacts").is_dir(), "a server-less store keeps artifacts where it was told"
