"""A run kept on S3 (moto server on loopback): working copies on two "workers" (scratch directories that share
nothing) pull and push through tasks.mirror; checksums are checked; bad buckets and credentials fail in one
line when the run opens."""

from __future__ import annotations

import json
import secrets

import pytest

from tasks import storage
from tasks.mirror import Mirror

pytestmark = pytest.mark.integration


@pytest.fixture
def bucket(s3):
    name = f"runs-{secrets.token_hex(4)}"
    s3.create_bucket(Bucket=name)
    return name


def _objects(s3, bucket: str) -> dict[str, dict]:
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
    return {k: s3.head_object(Bucket=bucket, Key=k) for k in keys}


def test_two_working_copies_exchange_files_through_the_prefix(s3, bucket, tmp_path):
    uri = f"s3://{bucket}/dag/run-1"
    a, b = Mirror(uri, tmp_path / "worker-a"), Mirror(uri, tmp_path / "worker-b")
    a.pull()  # an empty prefix: nothing to do
    (a.local / "signals.json").write_text('{"retrain": true}')
    (a.local / "grpo" / "checkpoints" / "step-1").mkdir(parents=True)
    (a.local / "grpo" / "checkpoints" / "step-1" / "model.bin").write_bytes(b"\x00weights" * 1000)
    (a.local / ".signals.json.tmp123").write_text("an atomic writer's temporary")
    assert a.push() == {"uploaded": 2, "deleted": 0}
    objects = _objects(s3, bucket)
    assert sorted(objects) == ["dag/run-1/grpo/checkpoints/step-1/model.bin", "dag/run-1/signals.json"]
    for key, head in objects.items():  # every object carries the sha256 a reader checks
        data = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        assert head["Metadata"]["sha256"] == __import__("hashlib").sha256(data).hexdigest()
    assert a.push() == {"uploaded": 0, "deleted": 0}, "nothing changed: nothing sent"

    assert b.pull() == {"downloaded": 2, "kept": 0, "deleted": 0}
    assert (b.local / "grpo/checkpoints/step-1/model.bin").read_bytes() == b"\x00weights" * 1000
    assert b.pull()["downloaded"] == 0, "a second pull downloads nothing that did not change"

    # worker b changes one file and removes another; worker a sees both on its next pull
    (b.local / "signals.json").write_text('{"retrain": false}')
    (b.local / "grpo/checkpoints/step-1/model.bin").unlink()
    assert b.push() == {"uploaded": 1, "deleted": 1}
    # meanwhile a mapped task on worker a wrote a file not pushed yet: a pull must not delete it
    (a.local / "probe").mkdir()
    (a.local / "probe" / "shard-1.json").write_text("{}")
    assert a.pull() == {"downloaded": 1, "kept": 0, "deleted": 1}
    assert json.loads((a.local / "signals.json").read_text()) == {"retrain": False}
    assert not (a.local / "grpo/checkpoints/step-1/model.bin").exists()
    assert (a.local / "probe" / "shard-1.json").exists()

    # a third copy that already has the same bytes (a driver beside the worker) downloads nothing: one HEAD each
    c = Mirror(uri, tmp_path / "worker-a")
    (c.local / ".mirror.json").unlink()
    assert c.pull()["downloaded"] == 0


def test_a_corrupt_object_is_refused_and_the_local_copy_kept(s3, bucket, tmp_path):
    uri = f"s3://{bucket}/dag/run-2"
    a = Mirror(uri, tmp_path / "a")
    a.local.mkdir()
    (a.local / "summary.json").write_text('{"status": "promoted"}')
    a.push()
    b = Mirror(uri, tmp_path / "b")
    b.pull()
    # the object is replaced behind the mirror with bytes that do not match its recorded sha256
    s3.put_object(
        Bucket=bucket, Key="dag/run-2/summary.json", Body=b'{"status": "tampered"}', Metadata={"sha256": "0" * 64}
    )
    with pytest.raises(storage.ChecksumError, match="summary.json"):
        b.pull()
    assert json.loads((b.local / "summary.json").read_text()) == {"status": "promoted"}
    assert not [p for p in b.local.iterdir() if p.name.startswith(".summary")], "no temporary left behind"


def test_a_run_kept_on_s3_synced_by_two_workers(s3, bucket, tmp_path, settings):
    from tasks.rundir import RunDir, working_copy

    base = settings.model_copy(
        update={"run_dir": f"s3://{bucket}/runs", "tracking": settings.tracking.model_copy(update={"uri": "http://x"})}
    )
    on = [base.model_copy(update={"scratch_dir": tmp_path / f"worker-{i}"}) for i in range(2)]
    first = RunDir.for_run(on[0], "continuous_post_training", "manual__2026-12-07T05:00:00+00:00")
    assert first.uri == f"s3://{bucket}/runs/continuous_post_training/manual__2026-12-07T05_00_00_00_00"
    assert first.path == tmp_path / "worker-0" / "continuous_post_training" / first.path.name
    with first.synced() as rd:
        rd.write({"retrain": True}, "signals.json")
        rd.write({"key": "k"}, "grpo", "resume_key.json")
    second = RunDir.for_run(on[1], "continuous_post_training", first.run_id)
    assert second.read("signals.json") is None, "worker 1 shares no disk with worker 0"
    with second.synced() as rd:
        assert rd.read("signals.json") == {"retrain": True}
        assert rd.uri_of(rd.path / "grpo") == f"{first.uri}/grpo"
    # a job driver on worker 1 gets a local path for the run's GRPO directory
    local = working_copy(on[1], f"{first.uri}/grpo")
    assert local == second.path / "grpo" and (local / "resume_key.json").exists()
    with pytest.raises(ValueError, match="not inside a run"):
        working_copy(on[1], f"s3://{bucket}/elsewhere/grpo")


def test_a_missing_bucket_or_credentials_fail_when_the_run_opens(s3, tmp_path, settings, monkeypatch):
    from tasks.config import SettingsError, load_settings
    from tasks.rundir import RunDir

    s = settings.model_copy(
        update={
            "run_dir": "s3://no-such-bucket-here/runs",
            "scratch_dir": tmp_path,
            "tracking": settings.tracking.model_copy(update={"uri": "http://x"}),
        }
    )
    rd = RunDir.for_run(s, "continuous_post_training", "r")
    with pytest.raises(FileNotFoundError, match=r"s3://no-such-bucket-here/runs/continuous_post_training/r: not found"):
        rd.pull()
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    import boto3

    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # it keeps the credentials it resolved first
    storage._client.cache_clear()
    try:
        with pytest.raises(PermissionError, match="no S3 credentials"):
            rd.pull()
    finally:
        storage._client.cache_clear()
    with pytest.raises(SettingsError, match="tracking.uri"):
        load_settings(overrides={"run_dir": "s3://bucket/runs"}, environ={})
