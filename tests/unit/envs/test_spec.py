"""Environments declared in YAML (tasks/envs/spec.py): what a spec may say, and its errors."""

import json

import pytest

from tasks.config import SettingsError, load_settings
from tasks.envs import get_env
from tasks.envs.spec import split_of


def _spec(tmp_path, text: str) -> str:
    path = tmp_path / "env.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    "text, says",
    [
        ("name: x\nbase: desk\n", "tools: Field required"),
        ("name: x\nbase: desk\ntools: {kind: mcp}\n", "needs exactly one of tools.server or tools.servers"),
        ("name: x\ntools: {kind: mcp, server: http://h/mcp}\n", "exactly one of base"),
        ("name: x\ntasks: t.jsonl\ntools: {kind: mcp, server: http://h/mcp}\n", "needs verifier"),
        ("name: x\nbase: desk\ntools: {kind: grpc, server: h}\n", "tools.kind"),
        (
            "name: x\nbase: desk\nverifier: no.such:thing\ntools: {kind: in_process}\n",
            "verifier 'no.such:thing' cannot load",
        ),
    ],
)
def test_a_bad_spec_fails_at_settings_load_naming_the_field(tmp_path, text, says):
    with pytest.raises(SettingsError, match=says):
        load_settings(overrides={"env": {"name": _spec(tmp_path, text)}})


def test_a_spec_over_a_base_keeps_its_tasks_verifier_and_production_hook(tmp_path):
    env = get_env(_spec(tmp_path, "name: mine\nbase: desk\ntools: {kind: in_process}\n"))
    tasks = env.generate_tasks(3, 0, env.load_toolset("2"), split="train")
    assert {t.env for t in tasks} == {env.name} and {t.data["toolset"] for t in tasks} == {"2"}
    assert env.demonstration is not None and env.task_from_trace is not None
    trace = {"trace_id": "t1", "messages": [{"role": "user", "content": "What is 3 plus 4?"}]}
    task = env.task_from_trace(trace, env.load_toolset("2"))
    assert task.env == env.name and task.expected == "7" and task.data["toolset"] == "2"


def test_a_spec_with_a_task_file_splits_it_by_task_id(tmp_path):
    rows = [
        {
            "task_id": f"q{i}",
            "env": "x",
            "family": "echo",
            "question": f"Echo {i}",
            "tools": [],
            "expected": str(i),
            "data": {},
        }
        for i in range(200)
    ]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = get_env(
        _spec(
            tmp_path,
            "name: echo\ntasks: tasks.jsonl\nverifier: tasks.envs.desk:verify\n"
            "tools: {kind: resources, server: http://127.0.0.1:9}\n",
        )
    )
    for split in ("train", "eval"):
        drawn = env.generate_tasks(50, 1, split=split)
        assert len(drawn) == 50 and {split_of(t.task_id) for t in drawn} == {split}
        assert {t.env for t in drawn} == {env.name}
