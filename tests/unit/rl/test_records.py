"""Rollout records (tasks/rl/records.py): atomic shards, exact read-back."""

import json

import pytest

from tasks.envs import new_episode
from tasks.envs.desk import toolset_tasks
from tasks.policy.tokenizer import default_chat
from tasks.rl.records import episode_record, read_step, record_key, write_shard


def _rec(t, r, v=0, reward=0.0):
    return {"task_index": t, "rollout_index": r, "policy_version": v, "reward": reward}


def _files(d):
    return sorted(p.name for p in d.iterdir())


def test_write_then_read_returns_exactly_the_expected_set(tmp_path):
    recs = [_rec(t, r, reward=t + r / 10) for t in range(3) for r in range(2)]
    write_shard(tmp_path / "shard-1.jsonl", recs[3:])
    write_shard(tmp_path / "shard-0.jsonl", recs[:3])
    out = read_step(tmp_path, {record_key(r) for r in recs})
    assert out == sorted(recs, key=record_key)
    assert [record_key(r) for r in out] == [(0, 0, 0), (0, 1, 0), (1, 0, 0), (1, 1, 0), (2, 0, 0), (2, 1, 0)]
    assert _files(tmp_path) == ["shard-0.jsonl", "shard-1.jsonl"]


def test_write_shard_creates_parent_and_writes_jsonl(tmp_path):
    path = write_shard(tmp_path / "step-3" / "shard-0.jsonl", [_rec(0, 0), _rec(0, 1)])
    assert path == tmp_path / "step-3" / "shard-0.jsonl"
    lines = path.read_text().splitlines()
    assert [json.loads(line) for line in lines] == [_rec(0, 0), _rec(0, 1)]


def test_retried_shard_is_not_duplicated(tmp_path):
    recs = [_rec(0, 0), _rec(0, 1), _rec(1, 0)]
    write_shard(tmp_path / "shard-0.jsonl", recs[:2])
    write_shard(tmp_path / "shard-1.jsonl", recs[2:])
    write_shard(tmp_path / "shard-0.jsonl", recs[:2])  # the retried shard rewrites its own file
    assert read_step(tmp_path, {record_key(r) for r in recs}) == recs
    assert _files(tmp_path) == ["shard-0.jsonl", "shard-1.jsonl"]


def test_missing_record_raises_with_counts(tmp_path):
    write_shard(tmp_path / "shard-0.jsonl", [_rec(0, 0), _rec(0, 1)])
    with pytest.raises(RuntimeError, match=r"1 missing \(e\.g\. \[\(1, 0, 0\)\]\), 0 unexpected, 0 duplicated"):
        read_step(tmp_path, {(0, 0, 0), (0, 1, 0), (1, 0, 0)})


def test_extra_record_raises_with_counts(tmp_path):
    write_shard(tmp_path / "shard-0.jsonl", [_rec(0, 0), _rec(0, 1), _rec(0, 0, v=1)])
    with pytest.raises(RuntimeError, match=r"0 missing .*, 1 unexpected, 0 duplicated"):
        read_step(tmp_path, {(0, 0, 0), (0, 1, 0)})


def test_duplicate_across_two_shards_raises_with_counts(tmp_path):
    write_shard(tmp_path / "shard-0.jsonl", [_rec(0, 0), _rec(0, 1)])
    write_shard(tmp_path / "shard-1.jsonl", [_rec(0, 1), _rec(1, 0)])
    with pytest.raises(RuntimeError, match=r"0 missing .*, 0 unexpected, 1 duplicated"):
        read_step(tmp_path, {(0, 0, 0), (0, 1, 0), (1, 0, 0)})


def test_empty_step_dir_reports_everything_missing(tmp_path):
    with pytest.raises(RuntimeError, match="2 missing"):
        read_step(tmp_path, {(0, 0, 0), (0, 1, 0)})


def test_only_shard_files_are_read(tmp_path):
    write_shard(tmp_path / "shard-0.jsonl", [_rec(0, 0)])
    (tmp_path / ".shard-1.jsonl.123.tmp").write_text(json.dumps(_rec(5, 5)) + "\n")  # a dead writer's leftovers
    (tmp_path / "notes.jsonl").write_text(json.dumps(_rec(6, 6)) + "\n")
    assert read_step(tmp_path, {(0, 0, 0)}) == [_rec(0, 0)]


def test_no_temp_files_left_after_writes(tmp_path):
    for i in range(3):
        write_shard(tmp_path / f"shard-{i}.jsonl", [_rec(i, 0)])
        write_shard(tmp_path / f"shard-{i}.jsonl", [_rec(i, 0)])
    assert _files(tmp_path) == ["shard-0.jsonl", "shard-1.jsonl", "shard-2.jsonl"]


def test_failed_write_keeps_the_previous_shard(tmp_path):
    path = write_shard(tmp_path / "shard-0.jsonl", [_rec(0, 0)])
    with pytest.raises(TypeError):
        write_shard(path, [_rec(0, 0), {"task_index": object()}])
    assert read_step(tmp_path, {(0, 0, 0)}) == [_rec(0, 0)]


def test_failed_write_leaves_no_temp_file(tmp_path):
    path = write_shard(tmp_path / "shard-0.jsonl", [_rec(0, 0)])
    with pytest.raises(TypeError):
        write_shard(path, [{"task_index": object()}])
    assert _files(tmp_path) == ["shard-0.jsonl"]


def test_episode_record_splits_prompt_and_completion():
    tok = default_chat()
    task = toolset_tasks("1", 9, 5)[2]  # population of Kyoto
    ep = new_episode(task, tok)
    prompt = ep.prompt_ids()
    call = '<tool_call>{"name":"lookup","arguments":{"city":"kyoto","field":"population"}}</tool_call>'
    c1, c2 = tok.encode(call) + [tok.eos_id], tok.encode("1463723") + [tok.eos_id]
    ep.add_completion(c1, [-0.5] * len(c1))
    ep.add_completion(c2, [-0.25] * len(c2))
    r = episode_record(ep, task_index=4, rollout_index=1, policy_version=2)
    assert record_key(r) == (4, 1, 2)
    assert r["prompt_ids"] == prompt  # ends with the generation prompt, <|assistant|>
    assert r["prompt_ids"] + r["completion_ids"] == ep.token_ids
    assert len(r["completion_ids"]) == len(r["completion_mask"]) == len(r["logprobs"])
    assert sum(r["completion_mask"]) == len(c1) + len(c2) == r["completion_tokens"]
    assert r["completion_mask"][: len(c1)] == [1] * len(c1)
    assert sorted(set(r["logprobs"])) == [-0.5, -0.25, 0.0]
    assert r["reward"] == 1.0 and r["success"] is True and r["reason"] == "correct"
    assert [m["role"] for m in r["messages"]] == ["assistant", "tool", "assistant"]
    assert r["messages"][1]["content"] == "1463723"
    json.dumps(r)  # serialisable as is


def test_shards_of_an_earlier_worker_count_are_cleared_before_a_rerun(tmp_path):
    from tasks.rl.records import clear_stale_shards

    recs = [_rec(t, r) for t in range(2) for r in range(4)]
    keys = {record_key(r) for r in recs}
    for k in range(4):  # a killed run with 2 workers: 4 shards
        write_shard(tmp_path / f"shard-{k:04d}.jsonl", recs[k::4])
    for k in range(2):  # the resumed run with 1 worker: 2 shards, the same records cut another way
        write_shard(tmp_path / f"shard-{k:04d}.jsonl", recs[k::2])
    with pytest.raises(RuntimeError, match="duplicated"):
        read_step(tmp_path, keys)
    removed = clear_stale_shards(tmp_path, {"shard-0000.jsonl", "shard-0001.jsonl"})
    assert sorted(p.name for p in removed) == ["shard-0002.jsonl", "shard-0003.jsonl"]
    assert read_step(tmp_path, keys) == sorted(recs, key=record_key)
