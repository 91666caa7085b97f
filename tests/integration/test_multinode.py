"""Multi-node Ray on one machine: a head and two worker nodes, each its own raylet with its own resources (as
`ray start --address` joins other machines). Rollout actors go to the rollout nodes by resource, the trainer to
the head; losing a rollout node mid-batch replaces its actors on the other one and the batch's records are
exactly a clean batch's; a GRPO step syncs weights from the head's trainer to engines on the worker nodes.

The driver runs as its own process (tests/integration/multinode.py): a process joins one cluster, and this
session's Ray head is another.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tasks.config import PROJECT_ROOT

pytestmark = pytest.mark.integration


def test_rollouts_and_training_placed_on_their_nodes_survive_a_lost_node(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_") or k == "RAY_TRAIN_V2_ENABLED"}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.integration.multinode", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=PROJECT_ROOT,
        env={**env, "PYTHONPATH": str(PROJECT_ROOT), "RAY_TRAIN_V2_ENABLED": "1"},
    )
    (tmp_path / "driver.log").write_text(proc.stderr)
    assert proc.returncode == 0, f"{proc.stderr[-3000:]}\n(whole log: {tmp_path / 'driver.log'})"
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    rollout_nodes, train_node = set(out["rollout_nodes"]), out["train_node"]
    assert len(rollout_nodes) == 2 and train_node not in rollout_nodes
    assert set(out["actors_before"]) <= rollout_nodes, "rollout actors only on the nodes offering `rollout`"
    assert out["killed"], "the victim node's raylet was killed"
    assert out["victim"] not in out["actors_after"], "the lost node's actors were replaced elsewhere"
    assert set(out["actors_after"]) <= rollout_nodes - {out["victim"]}
    assert sorted(map(tuple, map(lambda r: r[:2], out["lost"]))) == sorted(
        map(tuple, map(lambda r: r[:2], out["clean"]))
    ), "every (task, sample) exactly once"
    assert out["lost"] == out["clean"], "per-episode seeds: the rerun shards reproduce the lost records exactly"
    assert out["train_offered_by"] == [train_node], "only the head offers `train`: the trainer ran there"
    metrics = out["metrics"]
    assert metrics["step"] == 1 and metrics["weight_sync_bytes"] > 0, metrics
