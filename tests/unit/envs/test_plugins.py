"""Environments as plugins (tasks/envs/__init__.py): found by entry point or module:factory, their own
verifier, errors at settings load; the core names no environment."""

import io
import tokenize
from pathlib import Path

import pytest

from tasks.config import SettingsError, load_settings
from tasks.envs import Environment, get_env, new_episode
from tasks.envs.backends import InProcessSession
from tasks.envs.base import Task, ToolError
from tasks.policy.tokenizer import default_chat

ROOT = Path(__file__).resolve().parents[3]
CORE = ["tasks", "dags", "operators", "plugins", "hooks", "triggers"]
OWN = {"tasks/envs/desk.py", "tasks/envs/desk_traces.py"}  # desk and its trace parser
ALLOWED = {("tasks/config_sections.py", "'desk'"), ("tasks/config_sections.py", '"desk"')}  # env.name's default


def _echo_tasks(n, seed, toolset=None, split=None):
    tool = {
        "type": "function",
        "function": {
            "name": "echo",
            "description": "Returns its text.",
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
        },
    }
    return [
        Task(
            f"echo-{seed}-{i}",
            __name__ + ":echo_environment",
            "echo",
            f"Echo w{i}.",
            [tool],
            f"w{i}",
            {"word": f"w{i}"},
        )
        for i in range(n)
    ]


def _echo(name, arguments):
    if arguments["text"] == "":
        raise ToolError("nothing to echo")
    return arguments["text"]


def _verify(episode):
    said = episode.answer == episode.task.data["word"]
    return {"reward": float(said), "components": {"said": float(said)}, "reason": "echo", "success": said}


def echo_environment():
    return Environment("echo", _echo_tasks, lambda task: InProcessSession(_echo, (ToolError,)), _verify)


def test_an_environment_by_module_and_factory_runs_episodes_with_its_own_verifier():
    env = get_env(__name__ + ":echo_environment")
    assert env.name == "echo" and env.demonstration is None
    chat = default_chat()
    ep = new_episode(env.generate_tasks(1, 0)[0], chat)
    ep.add_completion(
        chat.tokenizer.encode('<tool_call>{"name":"echo","arguments":{"text":"w0"}}</tool_call>') + [chat.eos_id]
    )
    assert ep.messages[-1]["content"] == "w0"
    ep.add_completion(chat.tokenizer.encode("w0") + [chat.eos_id])
    assert ep.score() == {"reward": 1.0, "components": {"said": 1.0}, "reason": "echo", "success": True}


def test_the_embedded_default_is_found_by_its_entry_point():
    env = get_env("desk")
    assert env.name == "desk" and env.demonstration is not None and env.toolset_dir.is_dir()


@pytest.mark.parametrize(
    "name, says",
    [
        ("nope", "no environment of that name"),
        ("no_such_module:factory", "cannot load no_such_module:factory"),
        ("tasks.envs:PYPROJECT", "gave PosixPath"),  # an attribute that is not an Environment
    ],
)
def test_an_environment_that_cannot_load_fails_at_settings_load_naming_what_to_fix(name, says):
    with pytest.raises(SettingsError, match=says) as err:
        load_settings(overrides={"env": {"name": name}})
    assert "env.name" in str(err.value)


def test_the_bootstrap_refuses_an_environment_without_demonstrations():
    from tasks.policy.sft import demonstration_batch

    with pytest.raises(ValueError, match="no demonstrations"):
        demonstration_batch(__name__ + ":echo_environment", default_chat(), 2, seed=0, max_len=512)


def test_the_core_names_no_environment():
    """Only desk's own module and the env.name default may say `desk` in code (comments aside)."""
    found = []
    for top in CORE:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            if rel in OWN:
                continue
            for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
                named = tok.type == tokenize.NAME and tok.string == "desk"
                text = tok.string.strip("'\"") if tok.type == tokenize.STRING else ""
                literal = text == "desk" or text.startswith("tasks.envs.desk")  # not a docstring's mention
                if (named or literal) and (rel, tok.string) not in ALLOWED:
                    found.append(f"{rel}:{tok.start[0]} {tok.string[:60]}")
    assert not found, found
