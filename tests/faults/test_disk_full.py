"""Fault matrix: the run directory's disk fills up. Every writer fails with ENOSPC, nothing half-written is
left under a final name, no temporary copy is left behind, and what was there before is intact."""

from __future__ import annotations

import errno
import json

import pytest
import torch

from tests.faults.conftest import fill

pytestmark = pytest.mark.faults


def _tiny():
    from tasks.config_sections import ModelSettings
    from tasks.policy.model import build_model

    model, chat = build_model(ModelSettings(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.tensor([[1, 2, 3]]), labels=torch.tensor([[1, 2, 3]])).loss.backward()
    optimizer.step()  # Adam state to save
    return model, chat, optimizer


def _leftovers(root) -> list[str]:
    return sorted(p.name for p in root.rglob(".*") if p.name != "filler")


def test_a_full_disk_fails_every_writer_and_leaves_the_old_files_whole(small_disk):
    from tasks.policy.model import load_model, save_model
    from tasks.rl.checkpoint import latest_checkpoint, save_checkpoint
    from tasks.storage import write_atomic

    model, chat, optimizer = _tiny()
    write_atomic(small_disk / "run" / "summary.json", json.dumps({"status": "promoted"}))
    save_model(model, chat, small_disk / "run" / "model")
    save_checkpoint(small_disk / "run" / "checkpoints", 1, model, chat, optimizer)
    fill(small_disk)

    with pytest.raises(OSError) as e:
        write_atomic(small_disk / "run" / "summary.json", json.dumps({"status": "x" * 100_000}))
    assert e.value.errno == errno.ENOSPC
    assert json.loads((small_disk / "run" / "summary.json").read_text()) == {"status": "promoted"}
    with pytest.raises(OSError):
        save_model(model, chat, small_disk / "run" / "model")
    with pytest.raises(OSError):
        save_checkpoint(small_disk / "run" / "checkpoints", 2, model, chat, optimizer)

    assert _leftovers(small_disk) == []  # no temporary file or directory left behind
    assert latest_checkpoint(small_disk / "run" / "checkpoints").name == "step-000001"
    (small_disk / "filler").unlink()
    load_model(small_disk / "run" / "model")  # the old model, whole: its checksums pass
