"""bench/peers.py's bridge to TRL: its tools render our prompts exactly and its rollouts get our verifier's reward.

TRL itself is not needed here (bench/requirements-peers.txt installs it for the bench); the bridge's two
halves are what make the comparison fair, so they are checked on every task family of both toolsets.
"""

import importlib.util
import json
import random
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"
sys.path.insert(0, str(BENCH))  # peers imports its sibling seeds
spec = importlib.util.spec_from_file_location("peers", BENCH / "peers.py")
peers = importlib.util.module_from_spec(spec)
spec.loader.exec_module(peers)

LIMITS = {"max_turns": 4, "max_tokens_per_turn": 96, "max_len": 512}


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    from tasks.config import load_settings
    from tasks.policy.model import build_model, load_model, save_model

    model, fmt = build_model(load_settings().model)
    return load_model(save_model(model, fmt, tmp_path_factory.mktemp("model") / "m"))[1]


def _tasks(toolset: int, n: int = 12):
    from tasks.envs import get_env

    env = get_env("desk")
    return env, env.generate_tasks(n, 5, env.load_toolset(toolset), split="train")


@pytest.mark.parametrize("toolset", [1, 2])
def test_trl_tools_render_our_prompt(chat, toolset):
    _, tasks = _tasks(toolset)
    classes = peers.environment_classes(tasks)
    assert {t.family for t in tasks} == set(classes) and len(classes) == 3
    for task in tasks:
        instance = classes[task.family]()
        instance.reset(task=json.dumps(task.to_dict()))
        tools = [{"type": "function", "function": t["function"]} for t in task.tools]
        ours = chat.prompt([{"role": "user", "content": task.question}], tools)
        theirs = chat.tokenizer.apply_chat_template(
            [{"role": "user", "content": task.question}],
            tools=[getattr(instance, t["function"]["name"]) for t in task.tools],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        assert list(theirs) == ours, task.task_id


def test_trl_tool_answers_as_our_episode(chat):
    env, tasks = _tasks(1)
    task = next(t for t in tasks if t.family == "calc")
    instance = peers.environment_classes([task])["calc"]()
    instance.reset(task=json.dumps(task.to_dict()))
    call = env.demonstration(task, random.Random(0))[0]["tool_calls"][0]["function"]
    assert getattr(instance, call["name"])(**call["arguments"]) == task.expected
    assert getattr(instance, call["name"])(x="1").startswith("error: missing required argument")


@pytest.mark.parametrize("toolset, expert_reward", [(1, 1.0), (2, 0.1)])
def test_replayed_rollout_gets_our_verifiers_reward(chat, toolset, expert_reward):
    """The v1 expert solves v1 tasks and fails v2's (the breaking change), through the replay as directly."""
    from tasks.envs import new_episode

    env, tasks = _tasks(toolset, 6)
    reward = peers.replay_reward(chat, LIMITS)
    completions, rows, direct = [], [], []
    for task in tasks:
        # the v1 expert's habits (a lenient demonstration: v2's own would follow v2's convention)
        habit = type(task).from_dict({**task.to_dict(), "data": {**task.data, "convention": "any"}})
        demo = env.demonstration(habit, random.Random(1))
        # TRL's completion: assistant messages with tool messages between them (the replay answers again)
        completions.append([demo[0], {"role": "tool", "name": "x", "content": "ignored"}, *demo[1:]])
        rows.append(json.dumps(task.to_dict()))
        ep = new_episode(task, chat, **LIMITS)
        for message in demo:
            ep.add_completion(chat.turn_ids(ep.messages, ep.tools, message))
        direct.append(ep.score()["reward"])
    got = reward(None, completions, rows)
    assert got == direct
    assert any(r == expert_reward for r in got)
    # a rollout TRL cut off before any answer scores as an unanswered episode, not an error
    assert reward(None, [[demo[0]]], rows[-1:])[0] < 0.5
