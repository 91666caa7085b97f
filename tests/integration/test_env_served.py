"""The loop against served tools: an environment declared in YAML (tasks/envs/spec.py) whose calls go to
the desk MCP server (stdio) or the desk resources server (HTTP); rollouts through the rollout worker, one
GRPO step on their records, and an eval, each answered by the server."""

from __future__ import annotations

import random
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tasks.envs import get_env, new_episode
from tasks.net import free_port

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
V2 = ROOT / "include" / "tools" / "registry_v2.json"


@pytest.fixture(scope="module")
def resources_url(tmp_path_factory):
    port = free_port()
    log = open(tmp_path_factory.mktemp("resources") / "server.log", "w")  # noqa: SIM115 (the server's log, open while it runs)
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "include/tools/desk_resources_server.py"),
            "--toolset",
            str(V2),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while True:
        try:
            urllib.request.urlopen(f"{url}/tools", timeout=2).close()
            break
        except OSError:
            if time.time() > deadline or proc.poll() is not None:
                proc.kill()
                pytest.fail(f"resources server did not start; see {log.name}")
            time.sleep(0.3)
    yield url
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture(scope="module", params=["mcp", "resources"])
def served_env(request, tmp_path_factory):
    spec = tmp_path_factory.mktemp("spec") / f"desk_{request.param}.yaml"
    if request.param == "mcp":
        server = f'["{{python}}", "{{root}}/include/tools/desk_mcp_server.py", "--toolset", "{V2}"]'
    else:
        server = f'"{request.getfixturevalue("resources_url")}"'
    spec.write_text(
        f'name: desk_{request.param}\nbase: desk\ntools:\n  kind: {request.param}\n  servers:\n    "2": {server}\n'
    )
    yield str(spec)
    from tasks.envs.spec import close_backends

    close_backends()


@pytest.fixture(scope="module")
def taught(tmp_path_factory):
    """A small model taught the accepted call of one v2 task (deterministic), once for both servers."""
    import torch

    from tasks.config import ModelSettings
    from tasks.policy.model import build_model, save_model
    from tasks.policy.sft import demonstration_backward

    env = get_env("desk")
    task = env.generate_tasks(1, 0, env.load_toolset(str(V2)), split="train")[0]  # calc: 2 operands and an operator
    model, chat = build_model(ModelSettings(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128))
    for seed in range(50):  # a demonstration whose formats the strict v2 service accepts
        ep = new_episode(task, chat)
        call, answer = env.demonstration(task, random.Random(seed))
        ep.add_message(call)
        if not ep.messages[-1]["content"].startswith("error"):
            ep.add_message(answer)
            break
    assert ep.score()["success"], ep.messages
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(200):
        opt.zero_grad()
        demonstration_backward(model, [(ep.token_ids, ep.loss_mask)], chat.pad_id)
        opt.step()
    model.eval()
    return save_model(model, chat, tmp_path_factory.mktemp("caller") / "model"), task


@pytest.fixture(scope="module")
def caller(taught, served_env):
    """The taught model and its task, the task now of the served environment (its calls go to the server)."""
    model_dir, task = taught
    served = get_env(served_env).generate_tasks(1, 0, get_env(served_env).load_toolset(str(V2)), split="train")[0]
    assert (served.question, served.expected) == (task.question, task.expected)
    return model_dir, served


def test_rollouts_a_grpo_step_and_an_eval_through_the_served_tools(served_env, caller, settings, tmp_path):
    import torch

    from tasks.policy.model import load_model
    from tasks.rl.records import read_step
    from tasks.rl.rollout_worker import RolloutWorker
    from tasks.rl.update import grpo_step

    model_dir, task = caller
    assert task.env == served_env.removeprefix(str(ROOT) + "/")  # the tasks name the spec: workers load it too
    worker = RolloutWorker(str(model_dir), backend="hf")  # a char-level call is about 80 tokens
    shard = {
        "items": [{"task": task.to_dict(), "task_index": 0, "rollout_index": r} for r in range(4)],
        "policy_version": 0,
        "temperature": 1.0,
        "seed": 3,
        "path": str(tmp_path / "step-00000/shard-0000.jsonl"),
    }
    summary = worker.run_shard(shard)
    records = read_step(tmp_path / "step-00000", {(0, r, 0) for r in range(4)})
    assert summary["episodes"] == 4 and len(records) == 4
    # the taught call went to the server and its answer came back into the transcript
    assert any(r["components"]["call_validity"] == 1.0 for r in records), records[0]["components"]
    assert summary["faults"].keys() <= {"refused"}

    model, _, _ = load_model(model_dir, checksums=False)
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    metrics = grpo_step(model, opt, records, settings, worker.chat.pad_id)
    assert metrics["episodes"] == 4
    assert metrics["episodes_trained"] == 0 or any(
        not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True)
    )

    table = worker.score_attempts([task.to_dict()], samples=2, temperature=1.0, seed=0, first_index=0)
    assert table[0]["greedy_success"] == 1.0, table[0]  # greedy repeats the taught call; the server answers it


def test_tooldiff_reads_a_toolset_from_an_mcp_server():
    """`python -m tasks tooldiff` and the monitor read any source load_toolset reads: an MCP server too."""
    from tasks.signals.tooldiff import diff_toolsets

    server = f"mcp:{sys.executable} {ROOT}/include/tools/desk_mcp_server.py --toolset {V2}"
    same = diff_toolsets(str(V2), server)
    assert not same.breaking and same.old_hash == same.new_hash
    changed = diff_toolsets("1", server)
    assert changed.breaking and "calculator -> calculate" in changed.summary
