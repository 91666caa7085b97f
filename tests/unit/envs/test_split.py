"""Held-out means held out: eval and dev task content is disjoint from training content by construction
(tasks/envs/desk.py split_of, generate_tasks(split=...), and the callers that draw eval and training tasks)."""

import dataclasses
import json
from collections import Counter

import pytest

from tasks.config import load_settings
from tasks.envs import desk, get_env
from tasks.envs.desk import CITIES, CONVERSIONS, FAMILIES, FIELDS, OPS, generate_tasks, split_of, task_content
from tasks.envs.toolset import load_toolset

SETTINGS = load_settings()
TOOLSETS = ("1", "2")
GRPO_STEPS = range(60)
BOOTSTRAP_STEPS = range(300)


def contents(tasks) -> set:
    return {task_content(t) for t in tasks}


def eval_contents(settings, tmp_path) -> set:
    """What the DAG's build_tasks writes and the CLI's eval_tasks draws, for the shipped toolsets."""
    from tasks.rundir import RunDir
    from tasks.stages.rollouts import build_tasks, eval_tasks

    rd, out = RunDir(tmp_path, "dag", "run"), set()
    for reg in TOOLSETS:
        build_tasks(settings, rd, reg)
        written = [
            desk.Task.from_dict(json.loads(line))
            for line in (rd.path / "tasks" / f"eval_v{reg}.jsonl").read_text().splitlines()
        ]
        assert [t.to_dict() for t in written] == [t.to_dict() for t in eval_tasks(settings, reg)]
        assert len(written) == settings.eval.num_tasks
        out |= contents(written)
    return out


def training_contents(split) -> set:
    """GRPO steps' tasks (target + guard, as training_tasks seeds them), GRPO's PPO-ptx demonstrations and
    the bootstrap's demonstrations, all drawn from `split` (None: today's draw, any content)."""
    g, b, env = SETTINGS.grpo, SETTINGS.bootstrap, SETTINGS.env
    n_guard = round(g.tasks_per_step * g.guard_share)
    target, guard = load_toolset(env.target_toolset), load_toolset(env.champion_toolset)
    out = set()
    for step in GRPO_STEPS:
        seed = 1_000_000 + g.seed * 10_000 + step
        out |= contents(generate_tasks(g.tasks_per_step - n_guard, seed, target, split=split))
        out |= contents(generate_tasks(n_guard, seed + 500_000, guard, split=split))
        out |= contents(generate_tasks(g.demo_batch, 3_000_000 + g.seed * 10_000 + step, guard, split=split))
    for step in BOOTSTRAP_STEPS:
        out |= contents(generate_tasks(b.batch_size, b.seed * 1_000_003 + step, None, split=split))
    return out


@pytest.fixture(scope="module")
def train():
    return training_contents("train")


def test_the_shipped_sizes_are_what_the_tests_assume():
    g = SETTINGS.grpo
    assert (SETTINGS.eval.num_tasks, SETTINGS.eval.seed, SETTINGS.eval.split) == (150, 1000, "eval")
    assert (g.seed, g.tasks_per_step, round(g.tasks_per_step * g.guard_share)) == (7, 16, 8)


def test_lookup_pairs_cover_every_split_and_train_covers_every_city_and_field():
    split = {(c, f): split_of("lookup", [c, f]) for c in CITIES for f in FIELDS}
    assert Counter(split.values()) == {"eval": 9, "dev": 5, "train": 22}
    assert {c for (c, _), s in split.items() if s == "train"} == set(CITIES)
    for name in ("train", "dev", "eval"):
        assert {f for (_, f), s in split.items() if s == name} == set(FIELDS), name


def test_calc_and_convert_content_splits_near_the_nominal_shares():
    calc = [
        [a, b, op]
        for op in OPS
        for a in range(2, 100 if op != "mul" else 41)
        for b in range(2, 100 if op != "mul" else 41)
    ]
    convert = [[v, s, d] for s, d in CONVERSIONS for v in range(2, 61)]
    for family, values, tol in (("calc", calc, 0.02), ("convert", convert, 0.05)):
        share = Counter(split_of(family, v) for v in values)
        for name, nominal in desk.SPLITS:
            assert share[name] / len(values) == pytest.approx(nominal, abs=tol), (family, name)


def test_commutative_operands_are_one_content():
    assert split_of("calc", [18, 24, "add"]) == split_of("calc", [24, 18, "add"])
    assert desk.content_key("calc", [24, 18, "mul"]) == desk.content_key("calc", [18, 24, "mul"])
    assert desk.content_key("calc", [24, 18, "sub"]) != desk.content_key("calc", [18, 24, "sub"])


@pytest.mark.parametrize("split", ["train", "dev", "eval"])
def test_a_split_draws_only_its_content_deterministically_with_every_family(split):
    for toolset in (None, load_toolset("1"), load_toolset("2")):
        tasks = generate_tasks(60, 11, toolset, split=split)
        assert {split_of(t.family, t.data["solution"]) for t in tasks} == {split}
        assert Counter(t.family for t in tasks) == {f: 20 for f in FAMILIES}
        assert [t.to_dict() for t in tasks] == [t.to_dict() for t in generate_tasks(60, 11, toolset, split=split)]
        assert all(f"-{split}-s11-" in t.task_id for t in tasks)
    with pytest.raises(ValueError, match="split='test'"):
        generate_tasks(3, 0, split="test")


def test_no_split_keeps_the_unsplit_draw():
    tasks = generate_tasks(30, 5, load_toolset("1"))
    assert [t.task_id for t in tasks][:2] == ["desk-r1-s5-0", "desk-r1-s5-1"]
    assert {split_of(t.family, t.data["solution"]) for t in tasks} == {"train", "dev", "eval"}


def test_eval_tasks_share_no_content_with_training(train, tmp_path):
    held_out = eval_contents(SETTINGS, tmp_path)
    assert {k[0] for k in held_out} == set(FAMILIES) and len(train) > 2000
    assert not held_out & train
    # the check has teeth: drawn as before (any content, other seeds), eval content repeats training content
    e = SETTINGS.eval
    before = {k for reg in TOOLSETS for k in contents(generate_tasks(e.num_tasks, e.seed, load_toolset(reg)))}
    overlap = Counter(k[0] for k in before & training_contents(None))
    assert set(overlap) == set(FAMILIES) and overlap["lookup"] >= 20, overlap


def test_dev_tasks_are_disjoint_from_training_and_eval(train, tmp_path):
    dev_settings = load_settings(overrides={"eval": {"split": "dev"}})
    dev = eval_contents(dev_settings, tmp_path / "dev")
    assert {k[0] for k in dev} == set(FAMILIES)
    assert not dev & train
    assert not dev & eval_contents(SETTINGS, tmp_path / "eval")


def test_bootstrap_demonstrations_draw_training_content(monkeypatch):
    import tasks.policy.sft as sft
    from tasks.policy.tokenizer import default_chat

    drawn = []

    def recording(*args, **kwargs):
        drawn.extend(tasks := desk.generate_tasks(*args, **kwargs))
        return tasks

    monkeypatch.setattr(sft, "get_env", lambda name: dataclasses.replace(get_env(name), generate_tasks=recording))
    sft.demonstration_batch("desk", default_chat(), 12, seed=3, max_len=512)
    sft.demonstration_batch("desk", default_chat(), 12, seed=4, max_len=512, toolset=load_toolset("1"))
    assert len(drawn) == 24 and {split_of(t.family, t.data["solution"]) for t in drawn} == {"train"}


def test_grpo_training_tasks_draw_training_content():
    from tasks.rl.train import training_tasks

    tasks = [t for step in range(5) for t in training_tasks(SETTINGS, step)]
    assert {split_of(t.family, t.data["solution"]) for t in tasks} == {"train"}
