"""grpo_step on a tiny model: micro-batching is exact, zero-signal groups are skipped, the update moves
probability towards the better sample of a group."""

from __future__ import annotations

import copy

import pytest
import torch

from tasks.config import load_settings
from tasks.net import free_port
from tasks.policy.model import build_model
from tasks.rl.update import grpo_step


def _records(tok, n_groups=3, group=4):
    recs = []
    g = torch.Generator().manual_seed(0)
    for t in range(n_groups):
        for r in range(group):
            n_p, n_c = 60 + 10 * t, 5 + r
            comp = torch.randint(9, len(tok.tokenizer), (n_c,), generator=g).tolist()
            mask = [1] * (n_c - 2) + [0, 0]
            engine = (-3 * torch.rand(n_c, generator=g)).tolist()
            recs.append(
                {
                    "task_index": t,
                    "rollout_index": r,
                    "policy_version": 0,
                    "reward": float(r % 2),
                    "success": bool(r % 2),
                    "completion_tokens": n_c,
                    "prompt_ids": torch.randint(9, len(tok.tokenizer), (n_p,), generator=g).tolist(),
                    "completion_ids": comp,
                    "completion_mask": mask,
                    "logprobs": [lp if m else 0.0 for lp, m in zip(engine, mask, strict=True)],
                }
            )
    return recs


def _settings(**grpo):
    return load_settings(
        environ={},
        overrides={
            "model": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64},
            "grpo": {"lr": 1e-2, **grpo},
        },
    )


def test_micro_batches_give_the_same_update_as_one_batch():
    s_one, s_many = _settings(micro_batch_tokens=100_000), _settings(micro_batch_tokens=512)
    model, tok = build_model(s_one.model)
    other = copy.deepcopy(model)
    recs = _records(tok)
    m1 = grpo_step(model, torch.optim.SGD(model.parameters(), lr=0.1), recs, s_one, tok.pad_id)
    m2 = grpo_step(other, torch.optim.SGD(other.parameters(), lr=0.1), recs, s_many, tok.pad_id)
    assert m2["micro_batches"] > m1["micro_batches"] == 1
    assert abs(m1["loss"] - m2["loss"]) < 1e-6 and m1["trained_tokens"] == m2["trained_tokens"]
    for p, q in zip(model.parameters(), other.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6)


def test_groups_without_signal_are_not_in_the_policy_gradient():
    s = _settings()
    model, tok = build_model(s.model)
    recs = _records(tok)
    for r in recs:
        if r["task_index"] == 0:
            r["reward"] = 1.0  # group 0: all equal, no advantage
    m = grpo_step(model, torch.optim.AdamW(model.parameters(), lr=1e-2), recs, s, tok.pad_id)
    assert m["episodes_trained"] == 8 and m["episodes"] == 12


def test_update_raises_logprob_of_rewarded_samples():
    s = _settings()
    model, tok = build_model(s.model)
    recs = _records(tok, n_groups=1, group=2)

    def seq_logp(r):
        from tasks.rl.grpo import pad_batch, sequence_token_logprobs

        ids, attn, mask = pad_batch(
            [r["prompt_ids"] + r["completion_ids"]], [[0] * len(r["prompt_ids"]) + r["completion_mask"]], tok.pad_id
        )
        with torch.no_grad():
            return float((sequence_token_logprobs(model, ids, attn) * mask).sum())

    before = [seq_logp(r) for r in recs]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(5):
        grpo_step(model, opt, recs, s, tok.pad_id)
    after = [seq_logp(r) for r in recs]
    assert after[1] > before[1] and after[0] < before[0]  # reward 1 vs reward 0


def test_guard_kl_weight_applies_to_guard_tasks_only():
    # 3 tasks per step, a third of them guard: task_index 2 is the guard task
    base = {"tasks_per_step": 3, "guard_share": 1 / 3, "kl_coef": 0.0}
    model, tok = build_model(_settings().model)
    ref = copy.deepcopy(model)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn_like(p))  # a reference the policy is measurably away from
    recs = _records(tok)
    sgd = lambda m: torch.optim.SGD(m.parameters(), lr=0.0)  # noqa: E731 - the loss is what is compared

    def loss(records, **grpo):
        m = copy.deepcopy(model)
        return grpo_step(m, sgd(m), records, _settings(**base, **grpo), tok.pad_id, ref_model=ref)["loss"]

    without_guard = [r for r in recs if r["task_index"] != 2]
    assert loss(recs, guard_kl_coef=2.0) > loss(recs) + 1e-4  # the guard's KL enters the loss
    assert abs(loss(without_guard, guard_kl_coef=2.0) - loss(without_guard)) < 1e-7  # and nothing else's


def test_demonstration_term_joins_the_update_with_its_weight():
    from tasks.policy.sft import demonstration_batch

    model, tok = build_model(_settings().model)
    recs = _records(tok)
    demos = demonstration_batch("desk", tok, 4, seed=5, max_len=512)

    def updated(with_demos=True, **grpo):
        m = copy.deepcopy(model)
        metrics = grpo_step(
            m,
            torch.optim.SGD(m.parameters(), lr=0.1),
            recs,
            _settings(max_grad_norm=1e9, **grpo),
            tok.pad_id,
            demos=demos if with_demos else None,
        )
        return m, metrics

    plain, m0 = updated(with_demos=False, demo_coef=1.0)
    off, m_off = updated(demo_coef=0.0)
    mixed, m_mix = updated(demo_coef=1.0)
    assert "demo_nll" not in m0 and "demo_nll" not in m_off and m_mix["demo_nll"] > 0
    # where the update's time went: each phase that ran, and only those (no reference model here)
    phases = {k for k in m_mix if k.startswith("update_") and k.endswith("_s")}
    assert phases == {f"update_{p}_s" for p in ("batch", "logprobs", "forward", "backward", "demos", "optimizer")}
    assert all(m_mix[k] > 0 for k in phases) and "update_demos_s" not in m_off
    assert all(torch.equal(p, q) for p, q in zip(plain.parameters(), off.parameters(), strict=True))
    # SGD: the mixed update is the plain one plus lr * the demonstrations' gradient
    moved = sum(float((p - q).abs().sum()) for p, q in zip(mixed.parameters(), plain.parameters(), strict=True))
    assert moved > 1e-3


DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")),
]


@pytest.mark.parametrize("device", DEVICES)
def test_update_runs_where_the_model_lives(device):
    """The GPU trainer's path (grpo.gpus_per_train_worker > 0): batches, KL reference and demonstrations
    follow the model's device, and the result equals the CPU update."""
    from tasks.policy.sft import demonstration_batch

    s = _settings(kl_coef=0.1, demo_coef=0.5)
    model, tok = build_model(s.model)
    ref = copy.deepcopy(model)
    recs, demos = _records(tok), demonstration_batch("desk", tok, 4, seed=5, max_len=512)
    cpu_model = copy.deepcopy(model)
    on_device = model.to(device)
    m_dev = grpo_step(
        on_device,
        torch.optim.SGD(on_device.parameters(), lr=0.1),
        recs,
        s,
        tok.pad_id,
        ref_model=copy.deepcopy(ref).to(device),
        demos=demos,
    )
    m_cpu = grpo_step(
        cpu_model, torch.optim.SGD(cpu_model.parameters(), lr=0.1), recs, s, tok.pad_id, ref_model=ref, demos=demos
    )
    assert all(p.device.type == device for p in on_device.parameters())
    assert abs(m_dev["loss"] - m_cpu["loss"]) < 1e-4 and abs(m_dev["demo_nll"] - m_cpu["demo_nll"]) < 1e-4
    for p, q in zip(on_device.parameters(), cpu_model.parameters(), strict=True):
        assert torch.allclose(p.cpu(), q, atol=1e-4)


def test_one_minibatch_update_equals_the_update_with_a_separate_old_pass():
    """minibatches=1 takes the "old" log-probabilities from the training forward itself (detached): the
    same step as computing them in a no-grad pass first, one forward cheaper."""
    from tasks.rl.grpo import clipped_policy_loss, group_advantages, pad_batch, sequence_token_logprobs

    s = _settings(micro_batch_tokens=100_000, max_grad_norm=1e9)
    model, tok = build_model(s.model)
    reference = copy.deepcopy(model)
    recs = _records(tok)
    grpo_step(model, torch.optim.SGD(model.parameters(), lr=0.1), recs, s, tok.pad_id)

    adv = group_advantages([r["reward"] for r in recs], [r["task_index"] for r in recs])
    keep = [i for i, a in enumerate(adv) if abs(a) > 1e-8]
    ids, attn, mask = pad_batch(
        [recs[i]["prompt_ids"] + recs[i]["completion_ids"] for i in keep],
        [[0] * len(recs[i]["prompt_ids"]) + recs[i]["completion_mask"] for i in keep],
        tok.pad_id,
    )
    with torch.no_grad():
        old = sequence_token_logprobs(reference, ids, attn)
    loss, _ = clipped_policy_loss(
        sequence_token_logprobs(reference, ids, attn),
        old,
        torch.tensor([adv[i] for i in keep]),
        mask,
        s.grpo.eps_low,
        s.grpo.eps_high,
    )
    loss.backward()
    with torch.no_grad():
        for p in reference.parameters():
            p -= 0.1 * p.grad
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6)


def test_kl_holds_a_saturated_guard_group():
    """A guard group the policy solves every time has zero advantage; its KL still enters the loss (on the
    old code the whole group was dropped: a loss of about 5e-9 with guard_kl_coef=5)."""
    base = {"tasks_per_step": 3, "guard_share": 1 / 3, "kl_coef": 0.0, "guard_kl_coef": 5.0}
    model, tok = build_model(_settings().model)
    ref = copy.deepcopy(model)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn_like(p))
    guard = [r for r in _records(tok) if r["task_index"] == 2]
    for r in guard:
        r["reward"], r["success"] = 1.0, True
    m = copy.deepcopy(model)
    metrics = grpo_step(m, torch.optim.SGD(m.parameters(), lr=0.1), guard, _settings(**base), tok.pad_id, ref_model=ref)
    assert metrics["episodes_trained"] == 0 and metrics["episodes_in_loss"] == 4
    assert metrics["loss"] > 1e-3 and metrics["kl"] > 1e-3
    assert metrics["trained_tokens"] == sum(sum(r["completion_mask"]) for r in guard)
    moved = sum(float((p - q).abs().sum()) for p, q in zip(m.parameters(), model.parameters(), strict=True))
    assert moved > 1e-4  # towards the reference


def test_update_logs_kl_ratio_and_engine_gap_token_weighted():
    s = _settings(kl_coef=0.1)
    model, tok = build_model(s.model)
    recs = _records(tok)
    m = grpo_step(
        copy.deepcopy(model),
        torch.optim.SGD(model.parameters(), lr=0.0),
        recs,
        s,
        tok.pad_id,
        ref_model=copy.deepcopy(model),
    )
    assert m["kl"] == pytest.approx(0.0, abs=1e-9)  # the reference is the policy itself
    assert m["ratio_mean"] == pytest.approx(1.0)
    assert m["clip_low_fraction"] is None and m["clip_high_fraction"] is None  # inert at one step per batch
    # the engine's log-probabilities were random: the gap is what the trainer's differ from them, token-weighted
    from tasks.rl.grpo import pad_batch, sequence_token_logprobs

    diffs = []
    for r in recs:
        ids, attn, mask = pad_batch(
            [r["prompt_ids"] + r["completion_ids"]], [[0] * len(r["prompt_ids"]) + r["completion_mask"]], tok.pad_id
        )
        with torch.no_grad():
            logp = sequence_token_logprobs(model, ids, attn)[0]
        engine = torch.tensor([0.0] * len(r["prompt_ids"]) + r["logprobs"])[1:]
        diffs += [abs(float(a - b)) for a, b, k in zip(logp, engine, mask[0], strict=True) if k]
    assert m["engine_logp_gap_mean"] == pytest.approx(sum(diffs) / len(diffs), rel=1e-4)
    assert m["engine_logp_gap_max"] == pytest.approx(max(diffs), rel=1e-4)
    s2 = _settings(minibatches=2)
    m2 = grpo_step(copy.deepcopy(model), torch.optim.SGD(model.parameters(), lr=0.0), recs, s2, tok.pad_id)
    assert m2["clip_low_fraction"] == 0.0 and m2["clip_high_fraction"] == 0.0


def test_truncated_importance_sampling_changes_the_update_only_when_on():
    model, tok = build_model(_settings().model)
    recs = _records(tok)

    def updated(**grpo):
        m = copy.deepcopy(model)
        grpo_step(m, torch.optim.SGD(m.parameters(), lr=0.1), recs, _settings(max_grad_norm=1e9, **grpo), tok.pad_id)
        return torch.cat([p.detach().flatten() for p in m.parameters()])

    plain, capped = updated(), updated(engine_is_cap=2.0)
    assert not torch.allclose(plain, capped)
    # engine log-probabilities equal to the trainer's make every weight 1: the same update as without
    from tasks.rl.grpo import pad_batch, sequence_token_logprobs

    for r in recs:
        ids, attn, _ = pad_batch(
            [r["prompt_ids"] + r["completion_ids"]], [[0] * len(r["prompt_ids"]) + r["completion_mask"]], tok.pad_id
        )
        with torch.no_grad():
            logp = sequence_token_logprobs(model, ids, attn)[0].tolist()[len(r["prompt_ids"]) - 1 :]
        r["logprobs"] = [lp if k else 0.0 for lp, k in zip(logp, r["completion_mask"], strict=True)]
    assert torch.allclose(updated(), updated(engine_is_cap=2.0), atol=1e-6)


def test_resume_drops_metric_lines_of_steps_trained_again(tmp_path):
    import json

    from tasks.rl.metrics import keep_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "trained_tokens": 10}) + "\n" for s in [1, 2, 3]))
    assert keep_metrics(path, 2) == 1
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2]
    assert keep_metrics(path, 2) == 0 and keep_metrics(tmp_path / "absent.jsonl", 0) == 0


def _worker_update(rank, world, port, out_dir, demos_seed):
    """One rank of a gloo group: the same model, records and settings, its share of the update."""
    import torch.distributed as dist

    from tasks.policy.sft import demonstration_batch

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        s = _settings(kl_coef=0.1, demo_coef=0.5, micro_batch_tokens=512, num_train_workers=world)
        model, tok = build_model(s.model)
        ref = copy.deepcopy(model)
        with torch.no_grad():
            for p in ref.parameters():
                p.add_(0.02 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
        recs = _records(tok, n_groups=5, group=4)
        recs[0]["reward"] = recs[1]["reward"] = recs[2]["reward"] = recs[3]["reward"] = 1.0  # one saturated group
        demos = demonstration_batch("desk", tok, 5, seed=demos_seed, max_len=512)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        metrics = [
            grpo_step(model, opt, recs, s, tok.pad_id, ref_model=ref, demos=demos, rank=rank, world=world)
            for _ in range(2)
        ]
        if rank == 0:
            torch.save(
                {"params": [p.detach().clone() for p in model.parameters()], "metrics": metrics},
                f"{out_dir}/world{world}.pt",
            )
    finally:
        dist.destroy_process_group()


def test_two_gloo_workers_make_the_same_update_as_one(tmp_path):
    """Whole groups per rank, global token means, one all-reduce per optimizer step: 2 workers (gloo, CPU)
    give one worker's update to float tolerance (on the old code each rank saw half of every group)."""
    import torch.multiprocessing as mp

    for world in (1, 2):
        mp.spawn(_worker_update, args=(world, free_port(), str(tmp_path), 5), nprocs=world, join=True)
    one, two = torch.load(tmp_path / "world1.pt"), torch.load(tmp_path / "world2.pt")
    for p, q in zip(one["params"], two["params"], strict=True):
        assert torch.allclose(p, q, atol=1e-5), float((p - q).abs().max())
    for a, b in zip(one["metrics"], two["metrics"], strict=True):
        for key in ("loss", "grad_norm", "kl", "trained_tokens", "demo_nll", "engine_logp_gap_mean", "engine_k3"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key
