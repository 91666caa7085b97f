"""GRPO on Ray Train against a real local head: checkpoints, kill and resume, failure reporting."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _train_cmd(tiny_model, run_dir, *extra):
    return [
        sys.executable,
        "-m",
        "tasks",
        "--set",
        "grpo.steps=4",
        "--set",
        "grpo.checkpoint_every=2",
        "--set",
        "grpo.tasks_per_step=4",
        "--set",
        "rollout.group_size=4",
        "--set",
        "env.max_tokens_per_turn=32",
        "--set",
        "rollout.num_workers=1",  # one engine: checkpoints and resumption are what is tested here
        *extra,
        "train",
        "--init",
        str(tiny_model),
        "--run-dir",
        str(run_dir),
    ]


def _env(ray_head):
    return os.environ | {"EVERGREEN_RAY__ADDRESS": ray_head.address, "PYTHONPATH": str(ROOT)}


VALIDATED = ("--set", "grpo.validation_tasks=10")  # the checkpoint choice across the kill as well


def test_killed_training_resumes_from_checkpoint_and_ends_at_same_step(ray_head, tiny_model, tmp_path):
    run_dir = tmp_path / "grpo"
    log = open(tmp_path / "first.log", "w")  # noqa: SIM115 (the server's log, open while it runs)
    first = subprocess.Popen(
        _train_cmd(tiny_model, run_dir, *VALIDATED),
        env=_env(ray_head),
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    ckpt = run_dir / "checkpoints" / "step-000002" / "state.json"
    deadline = time.time() + 400
    while not ckpt.exists():
        assert first.poll() is None, f"training exited early: {(tmp_path / 'first.log').read_text()[-3000:]}"
        assert time.time() < deadline, "no checkpoint at step 2 within 400 s"
        time.sleep(0.5)
    os.killpg(first.pid, signal.SIGKILL)  # the driver and everything it started locally
    first.wait()
    steps_before = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert 2 in steps_before and max(steps_before) < 4

    second = subprocess.run(
        _train_cmd(tiny_model, run_dir, *VALIDATED),
        env=_env(ray_head),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resuming GRPO from" in second.stderr
    state = json.loads((run_dir / "checkpoints" / "step-000004" / "state.json").read_text())
    assert state["step"] == 4
    steps_after = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps_after[-1] == 4 and set(steps_after) == {1, 2, 3, 4}
    assert "resuming GRPO from" in second.stderr and "step 2 of 4" in second.stderr
    assert (run_dir / "model" / "model.safetensors").exists()
    # rollout records of every step are on disk, one directory per policy version
    assert {p.name for p in (run_dir / "rollouts").iterdir()} >= {f"step-{v:05d}" for v in range(4)}
    # each step's metrics once: tokens are priced once
    assert steps_after == [1, 2, 3, 4]

    # resume equals uninterrupted: the same four steps in one go end at the same weights and metrics
    straight = tmp_path / "straight"
    third = subprocess.run(
        _train_cmd(tiny_model, straight, *VALIDATED),
        env=_env(ray_head),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert third.returncode == 0, third.stderr[-3000:]
    import torch
    from safetensors.torch import load_file

    resumed, uninterrupted = (
        load_file(run_dir / "model" / "model.safetensors"),
        load_file(straight / "model" / "model.safetensors"),
    )
    assert resumed.keys() == uninterrupted.keys()
    worst = max(float((resumed[k] - uninterrupted[k]).abs().max()) for k in resumed)
    assert worst <= 1e-6, f"resumed weights differ from an uninterrupted run's by up to {worst}"

    def metrics(d):
        return [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]

    for a, b in zip(metrics(run_dir), metrics(straight), strict=True):
        assert (a["step"], a["reward_mean"], a["trained_tokens"]) == (b["step"], b["reward_mean"], b["trained_tokens"])

    # the challenger is the validated choice among steps 2 and 4, the same with and without the kill, and
    # its weights are that checkpoint's (kept on disk whatever the rotation)
    choices = [json.loads((d / "selection.json").read_text()) for d in (run_dir, straight)]
    assert choices[0]["step"] == choices[1]["step"] in (2, 4)
    assert [r["step"] for r in choices[0]["rows"]] == [r["step"] for r in choices[1]["rows"]] == [0, 2, 4]
    assert choices[0]["rows"] == choices[1]["rows"]
    chosen = load_file(run_dir / "checkpoints" / f"step-{choices[0]['step']:06d}" / "model.safetensors")
    assert all(torch.equal(chosen[k], resumed[k]) for k in chosen)


def test_injected_training_failure_fails_the_command_with_the_reason(ray_head, tiny_model, tmp_path):
    """Asynchronous GRPO (grpo.async) up to a failure injected at its second step: the first step trained on a
    fresh batch while the second's sampled at the same weights, one version stale when it is taken."""
    proc = subprocess.run(
        _train_cmd(tiny_model, tmp_path / "grpo", "--set", "grpo.async.max_staleness=1") + ["--fail-at-step", "1"],
        env=_env(ray_head),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode != 0
    assert "injected failure at GRPO step 1" in proc.stderr
    metrics = [json.loads(line) for line in (tmp_path / "grpo" / "metrics.jsonl").read_text().splitlines()]
    assert [(m["step"], m["staleness"]) for m in metrics] == [(1, 0)]
    shards = sorted((tmp_path / "grpo" / "rollouts" / "step-00001").glob("shard-*.jsonl"))
    versions = {json.loads(line)["policy_version"] for f in shards for line in f.read_text().splitlines()}
    assert shards and versions == {0}, versions  # sampled while step 0 updated, before its weights were sent
