"""GX checks on the loop's own data, built from real records and eval tables of the desk environment."""

from __future__ import annotations

import copy
import random

import pytest

from tasks.data.checks import check_eval_table, check_rollouts
from tasks.data.validation import BatchValidationError, Validator
from tasks.envs import new_episode
from tasks.envs.desk import demonstration, generate_tasks
from tasks.envs.toolset import load_toolset
from tasks.policy.tokenizer import default_chat
from tasks.rl.records import episode_record


@pytest.fixture(scope="module")
def validator():
    return Validator()


@pytest.fixture(scope="module")
def records():
    """Records of 3 tasks x 4 rollouts from scripted episodes (real Episode, real records)."""
    tok = default_chat()
    out = []
    for ti, task in enumerate(generate_tasks(3, 5, load_toolset("1"))):
        for ri in range(4):
            ep = new_episode(task, tok)
            call, _ = demonstration(task, random.Random(ti * 10 + ri))
            ids = tok.turn_ids(ep.messages, ep.tools, call)
            ep.add_completion(ids, [-0.5] * len(ids))
            answer = tok.encode(ep.messages[-1]["content"]) + [tok.eos_id]
            ep.add_completion(answer, [-0.1] * len(answer))
            out.append(episode_record(ep, ti, ri, policy_version=2))
    return out


def test_real_records_pass(records, validator):
    result = check_rollouts(records, group_size=4, validator=validator)
    assert result.success, [e.message for e in result.expectations if not e.success]


@pytest.mark.parametrize(
    "mutate, reason",
    [
        (lambda rs: rs.append(copy.deepcopy(rs[0])), "a rollout is counted twice"),
        (lambda rs: rs[1].update(rollout_index=4), "rollout_index outside the group"),
        (lambda rs: rs[2].update(reward=1.5), "reward outside [0, 1]"),
        (
            lambda rs: rs[3].update(
                logprobs=[0.3] + rs[3]["logprobs"][1:], completion_mask=[1] + rs[3]["completion_mask"][1:]
            ),
            "a logprob above 0",
        ),
        (lambda rs: rs[4].update(logprobs=rs[4]["logprobs"][:-1]), "completion ids and logprobs differ in length"),
        (lambda rs: rs[5].update(policy_version=-1), "policy_version < 0"),
    ],
)
def test_each_broken_record_is_named(records, validator, mutate, reason):
    broken = copy.deepcopy(records)
    mutate(broken)
    result = check_rollouts(broken, group_size=4, validator=validator)
    assert not result.success
    assert reason in [e.reason for e in result.expectations if not e.success]
    with pytest.raises(BatchValidationError, match="rollouts"):
        result.raise_for_failure()


def _table(n):
    return [
        {
            "task_id": f"t{i}",
            "family": "calc",
            "greedy_success": float(i % 2),
            "sampled_success": 0.25 * (i % 5),
            "sampled_reward": 0.5,
        }
        for i in range(n)
    ]


def test_eval_table_passes_and_fails_by_reason(validator, tmp_path):
    assert check_eval_table(_table(20), min_tasks=20, validator=validator).success
    short = check_eval_table(_table(5), min_tasks=20, validator=validator)
    assert [e.reason for e in short.expectations if not e.success] == ["too few eval tasks"]
    table = _table(20)
    table[3]["sampled_success"] = None
    table[4]["task_id"] = "t5"
    table[6]["greedy_success"] = 0.5
    bad = check_eval_table(table, min_tasks=20, validator=validator)
    assert {
        "success rate missing where samples were claimed",
        "a task is counted twice",
        "greedy success is not 0 or 1",
    } <= {e.reason for e in bad.expectations if not e.success}
    docs = check_eval_table(_table(20), min_tasks=20, docs_dir=tmp_path / "docs")
    assert docs.success and (tmp_path / "docs" / "index.html").exists()
