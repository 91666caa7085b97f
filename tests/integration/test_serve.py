"""`python -m tasks serve` (what `make serve` runs): the registry's champion behind vLLM's OpenAI-compatible
server on loopback, and the `openai` client gets the model's call back as parsed `tool_calls`.

The champion here is a small model taught one call (tests/taught.py), so that greedy decoding makes it
deterministically; the loop's own champion after a REST-triggered promotion: tests/e2e/test_serve.py."""

from __future__ import annotations

import json

import pytest

from tests.services import register_champion, served

pytestmark = pytest.mark.integration


def test_the_registry_champion_is_served_with_parsed_tool_calls(mlflow_server, tmp_path):
    import openai

    from tests.taught import taught_model

    model_dir, task, taught = taught_model(tmp_path / "taught")
    register_champion(mlflow_server.uri, "evergreen-serve", model_dir, run_key="serve-1")
    with served(mlflow_server.uri, tmp_path, "promotion.model_name=evergreen-serve") as url:
        assert (tmp_path / "run" / "serving" / "champion" / "checksums.json").exists()  # downloaded, checked
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
        tools = [{"type": "function", "function": t["function"]} for t in task.tools]
        reply = client.chat.completions.create(
            model="evergreen-agent",
            messages=[{"role": "user", "content": task.question}],
            tools=tools,
            tool_choice="auto",
            max_tokens=64,
            temperature=0,
        )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.function.name == taught["name"]
    assert json.loads(call.function.arguments) == taught["arguments"]
