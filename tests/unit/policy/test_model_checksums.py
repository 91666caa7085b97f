"""Saved models carry checksums.json; load_model refuses a file whose bytes changed."""

from __future__ import annotations

import json

import pytest

from tasks.config import load_settings
from tasks.policy.model import build_model, load_model, save_model
from tasks.storage import MANIFEST, ChecksumError


@pytest.fixture
def saved(tmp_path):
    model, tok = build_model(load_settings(environ={}).model)
    return save_model(model, tok, tmp_path / "m", toolset={"version": "1", "tools": []})


def test_manifest_lists_every_file_and_load_passes(saved):
    files = json.loads((saved / MANIFEST).read_text())["files"]
    assert {"model.safetensors", "config.json", "tool_registry.json"} <= set(files)
    load_model(saved)


def test_a_flipped_byte_is_refused(saved):
    weights = saved / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ChecksumError, match="model.safetensors.*refusing to load"):
        load_model(saved)


def test_a_missing_file_or_manifest_is_refused(saved):
    (saved / "tool_registry.json").unlink()
    with pytest.raises(ChecksumError, match="tool_registry.json"):
        load_model(saved)
    (saved / MANIFEST).unlink()
    with pytest.raises(ChecksumError, match="no checksums.json"):
        load_model(saved)
