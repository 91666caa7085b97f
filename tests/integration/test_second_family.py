"""A second model family through the loop: proof that the path is not Llama-specific.

A tiny Qwen2 (random weights, a byte-level BPE trained here on the environment's text, a Qwen2.5-style
template: tests/families.py) is brought as a team's checkpoint (`model.name_or_path`), fine-tuned for two
SFT steps on demonstrations its own template renders, rolled out on vLLM and on HF `generate`, trained for
two GRPO steps on Ray (each step a weight sync into the engine), evaluated, registered in MLflow and
loaded back through `models:/`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.families import build_qwen
from tests.services import register_champion

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
# the Qwen-style prompt (system text, tools as JSON) is about 350 tokens
QWEN = [
    "--set",
    "model.max_len=1024",
    "--set",
    "rollout.kv_cache_mb=32",
    "--set",
    "rollout.num_workers=1",
    "--set",
    "env.max_tokens_per_turn=24",
    "--set",
    "env.max_turns=2",
]


def _run(ray_head, *args, timeout=600) -> dict:
    env = os.environ | {"EVERGREEN_RAY__ADDRESS": ray_head.address, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "tasks", *QWEN, *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def champion(ray_head, tmp_path_factory):
    """The team's checkpoint after two SFT steps, saved as Evergreen saves a champion."""
    qwen = build_qwen(tmp_path_factory.mktemp("qwen") / "qwen2-tiny")
    out = tmp_path_factory.mktemp("qwen-champion") / "model"
    stats = _run(
        ray_head,
        "--set",
        f"model.name_or_path={qwen}",
        "--set",
        "bootstrap.steps=2",
        "--set",
        "bootstrap.batch_size=4",
        "bootstrap",
        "--out",
        str(out),
    )
    assert stats["sft_steps"] == 2 and stats["architecture"] == "Qwen2ForCausalLM"
    return out


def test_the_champion_is_a_standard_checkpoint_with_the_teams_template(champion):
    from transformers import AutoTokenizer

    from tests.families import QWEN_TEMPLATE

    config = json.loads((champion / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"] and config["model_type"] == "qwen2"
    assert AutoTokenizer.from_pretrained(champion).chat_template == QWEN_TEMPLATE
    assert (champion / "checksums.json").exists()


@pytest.mark.parametrize("backend", ["vllm", "hf"])
def test_rollouts_on_vllm_and_hf_generate(champion, backend):
    from tasks.envs.desk import toolset_tasks
    from tasks.rl.rollout_worker import RolloutWorker

    worker = RolloutWorker(
        str(champion), backend=backend, max_len=1024, kv_cache_mb=32, max_turns=2, max_tokens_per_turn=24
    )
    tasks = toolset_tasks("2", 4, 5)
    from tasks.envs import new_episode
    from tasks.policy.backends import Sampling

    episodes = [new_episode(t, worker.chat, max_turns=2, max_tokens_per_turn=24, max_len=1024) for t in tasks]
    stats = worker.backend.run_episodes(episodes, Sampling(temperature=1.0, seed=3))
    assert stats["generated_tokens"] > 0 and all(e.done for e in episodes)
    for e in episodes:
        prompt = worker.chat.decode(e.token_ids[: e.loss_mask.index(1)])
        assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
        assert "<tools>" in prompt and e.tools[0]["function"]["name"] in prompt
        assert len(e.token_ids) == len(e.loss_mask) == len(e.logprobs) <= 1024
        assert all(lp <= 0 for lp, m in zip(e.logprobs, e.loss_mask, strict=True) if m)


def test_grpo_weight_sync_eval_and_the_registry_round_trip(champion, ray_head, mlflow_server, tmp_path):
    from tasks.policy.model import load_model

    run_dir = tmp_path / "grpo"
    result = _run(
        ray_head,
        "--set",
        "grpo.steps=2",
        "--set",
        "grpo.tasks_per_step=2",
        "--set",
        "rollout.group_size=4",
        "--set",
        "grpo.checkpoint_every=2",
        "train",
        "--init",
        str(champion),
        "--run-dir",
        str(run_dir),
    )
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in steps] == [1, 2] and all(m["weight_sync_s"] > 0 for m in steps)
    trained = Path(result["model"])
    assert json.loads((trained / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"]

    evals = _run(
        ray_head,
        "--set",
        "eval.num_tasks=10",
        "--set",
        "eval.samples=1",
        "--set",
        "eval.interval_resamples=100",
        "eval",
        "--model",
        str(trained),
        "--toolset",
        "2",
    )
    assert 0.0 <= evals["2"]["mean"] <= 1.0 and 0.0 <= evals["2"]["greedy"] <= 1.0

    register_champion(mlflow_server.uri, "evergreen-qwen", trained, run_key="qwen-1")
    model, chat, _ = load_model("models:/evergreen-qwen@champion", cache_dir=tmp_path / "loaded")
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert chat.eos_id == chat.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert chat.parse('<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>').calls[0].name == "f"
