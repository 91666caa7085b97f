"""Signals against a real S3 endpoint (moto server on loopback): traces, registries and models from s3://."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.integration

START = datetime(2026, 11, 20, tzinfo=UTC)


def _upload_dir(s3, local: Path, bucket: str, prefix: str) -> None:
    for f in sorted(local.rglob("*")):
        if f.is_file():
            s3.upload_file(str(f), bucket, f"{prefix}/{f.relative_to(local)}")


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    from tasks.signals.simulate import simulate_traces

    out = tmp_path_factory.mktemp("sim")
    manifest = simulate_traces(
        out,
        START,
        START + timedelta(days=4),
        1200,
        [(START, "1"), (START + timedelta(days=2), "2")],
        malformed_share=0.05,
        seed=5,
    )
    return out, manifest


def test_ingest_from_s3_prefix_equals_local(s3, traces, tmp_path):
    from tasks.config import load_settings
    from tasks.signals.ingest import ingest
    from tasks.signals.traces import Window, select_files

    local, manifest = traces
    s3.create_bucket(Bucket="prod-traces")
    _upload_dir(s3, local, "prod-traces", "agent/v1")
    settings = load_settings(environ={}).ingest
    window = Window.parse("2026-11-21/2026-11-23")
    files = select_files("s3://prod-traces/agent/v1/", window)
    assert [f.rsplit("/", 2)[-2] for f in files] == ["date=2026-11-21", "date=2026-11-22"], (
        "partitions outside the window are not read"
    )
    remote = ingest("s3://prod-traces/agent/v1/", tmp_path / "s3", settings, window)
    here = ingest(local, tmp_path / "local", settings, window)
    for key in ("rows_read", "rows_accepted", "rows_quarantined", "rows_outside_window", "workloads"):
        assert remote[key] == here[key], key
    assert remote["rows_read"] == remote["rows_accepted"] + remote["rows_quarantined"] > 0
    assert (tmp_path / "s3" / "accepted" / "part-00000.jsonl").read_bytes() == (
        tmp_path / "local" / "accepted" / "part-00000.jsonl"
    ).read_bytes()
    # whole input: every malformed line quarantined, every valid one accepted
    everything = ingest("s3://prod-traces/agent/v1/", tmp_path / "all", settings)
    assert everything["rows_quarantined"] == sum(manifest["malformed"].values())
    assert everything["rows_accepted"] == manifest["valid"]


def test_missing_s3_object_is_a_clear_error(s3):
    from tasks import storage

    s3.create_bucket(Bucket="empty-bucket")
    assert storage.list_files("s3://empty-bucket/nothing/") == []
    with pytest.raises(FileNotFoundError, match="s3://empty-bucket/missing.json"):
        storage.read_bytes("s3://empty-bucket/missing.json")


def test_tooldiff_and_model_registry_from_s3(s3, tmp_path):
    from tasks.envs.desk import TOOLSET_DIR
    from tasks.envs.toolset import load_toolset, toolset_of_model
    from tasks.signals.tooldiff import diff_toolsets

    s3.create_bucket(Bucket="registries")
    s3.upload_file(str(TOOLSET_DIR / "registry_v2.json"), "registries", "desk/current.json")
    s3.put_object(
        Bucket="registries",
        Key="models/champion/tool_registry.json",
        Body=(TOOLSET_DIR / "registry_v1.json").read_bytes(),
    )
    trained_on = toolset_of_model("s3://registries/models/champion")
    diff = diff_toolsets(trained_on, load_toolset("s3://registries/desk/current.json"))
    assert diff.breaking and any(c.change == "tool_renamed" for c in diff.changes)


def test_load_model_from_s3_prefix(s3, tmp_path):
    from tasks.config import load_settings
    from tasks.envs.toolset import load_toolset
    from tasks.policy.model import build_model, load_model, save_model

    model, tok = build_model(load_settings(environ={}).model)
    local = save_model(model, tok, tmp_path / "model", toolset=load_toolset("1"))
    s3.create_bucket(Bucket="models")
    _upload_dir(s3, local, "models", "evergreen-agent/v3")
    loaded, tok2, directory = load_model("s3://models/evergreen-agent/v3", cache_dir=tmp_path / "cache")
    assert (
        tok2.tokenizer.get_vocab() == tok.tokenizer.get_vocab()
        and json.loads((directory / "tool_registry.json").read_text())["version"] == "1"
    )
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    with pytest.raises(FileNotFoundError, match="no objects under"):
        load_model("s3://models/evergreen-agent/v404", cache_dir=tmp_path / "c2")
    # an object changed in the store after the save is refused at load
    s3.put_object(
        Bucket="models",
        Key="evergreen-agent/v3/config.json",
        Body=(local / "config.json").read_bytes().replace(b"{", b"{ ", 1),
    )
    from tasks.storage import ChecksumError

    with pytest.raises(ChecksumError, match="config.json"):
        load_model("s3://models/evergreen-agent/v3", cache_dir=tmp_path / "c3")
