"""Served after promotion: `python -m tasks serve` (what `make serve` runs) puts the registry's champion behind
vLLM's OpenAI-compatible server on loopback, and the `openai` client gets parsed tool calls back."""

from __future__ import annotations

import pytest

from tests.services import served

pytestmark = pytest.mark.e2e


@pytest.fixture
def server(airflow_stack, finished_run, tmp_path):
    assert finished_run["status"] == "promoted", finished_run["status"]
    with served(airflow_stack.mlflow_url, tmp_path) as url:
        yield url, tmp_path


def test_the_loops_champion_is_served_after_promotion(server):
    """The champion the REST-triggered run promoted, downloaded from the registry and checked; the e2e
    stack's champion is a 30-step SFT, so it may answer or call: either way a well-formed reply through the
    hermes parser. That a served model's calls come back parsed: tests/integration/test_serve.py."""
    import openai

    from tasks.envs.desk import toolset_tasks

    url, tmp_path = server
    task = toolset_tasks("2", 1, 5)[0]
    tools = [{"type": "function", "function": t["function"]} for t in task.tools]
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    assert [m.id for m in client.models.list()] == ["evergreen-agent"]
    assert (tmp_path / "run" / "serving" / "champion" / "checksums.json").exists()
    reply = client.chat.completions.create(
        model="evergreen-agent",
        messages=[{"role": "user", "content": task.question}],
        tools=tools,
        tool_choice="auto",
        max_tokens=48,
        temperature=0,
    )
    choice = reply.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    assert choice.message.tool_calls or isinstance(choice.message.content, str)
