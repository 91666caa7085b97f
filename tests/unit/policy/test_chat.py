"""Chat formats (tasks/policy/chat.py): token-in, token-out episodes on every template shipped or built in tests,
and the one-line refusals of a model directory the loop cannot run."""

import json
import random

import pytest

from tasks.envs import new_episode
from tasks.envs.desk import demonstration, generate_tasks, toolset_tasks
from tasks.policy.chat import ChatFormat, ModelFormatError
from tasks.policy.tokenizer import bpe_tokenizer, char_tokenizer, default_template
from tests.families import QWEN_TEMPLATE, environment_text, qwen_tokenizer

# strips <think>...</think> from assistant turns that have a later message: a template that rewrites history
THINK_STRIPPING = default_template().replace(
    '<|assistant|>{{ message.content if message.content is string else "" }}',
    '<|assistant|>{{ (message.content if message.content is string else "").split("</think>")[-1] '
    "if not loop.last else message.content }}",
)


@pytest.fixture(scope="module", params=["default-char", "default-bpe", "qwen2.5-style"])
def chat(request):
    tok = {
        "default-char": char_tokenizer,
        "default-bpe": lambda: bpe_tokenizer(environment_text(), 500),
        "qwen2.5-style": qwen_tokenizer,
    }[request.param]()
    return ChatFormat(tok)


def _played(chat, task, seed=0):
    ep = new_episode(task, chat, max_len=1024)
    for message in demonstration(task, random.Random(seed)):
        ep.add_message(message)
    return ep


def test_running_ids_are_the_templates_rendering_of_the_whole_conversation(chat):
    tasks = [*generate_tasks(12, seed=3), *toolset_tasks("1", 6, 5), *toolset_tasks("2", 6, 5)]
    for i, task in enumerate(tasks):
        ep = _played(chat, task, seed=i)
        whole = chat.render(ep.messages, ep.tools, generation_prompt=False)
        assert whole[: len(ep.token_ids)] == ep.token_ids, task.task_id
        assert chat.decode(whole[len(ep.token_ids) :]).strip() == ""  # at most the template's newline after EOS
        assert ep.template_mismatches == 0
        # the policy's own tokens are exactly its turns: the call and the answer, each ending on the stop token
        own = [t for t, m in zip(ep.token_ids, ep.loss_mask, strict=True) if m]
        assert sum(t in chat.stop_ids for t in own) == ep.turns == 2


def test_a_second_tool_turn_extends_the_same_ids(chat):
    task = toolset_tasks("2", 9, 5)[1]  # 55 km to m, strict v2 service
    ep = new_episode(task, chat, max_len=1024)
    bad = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {
                    "name": "convert_units",
                    "arguments": {"quantity": 55, "source": "kilometers", "target": "m"},
                },
            }
        ],
    }
    ep.add_message(bad)
    assert ep.messages[-1]["content"].startswith("error: unknown unit 'kilometers'")
    for message in demonstration(task, random.Random(0)):
        message = json.loads(json.dumps(message).replace('"kilometers"', '"km"').replace('"meters"', '"m"'))
        ep.add_message(message)
    assert ep.done and ep.score()["success"], ep.score()
    assert chat.render(ep.messages, ep.tools, False)[: len(ep.token_ids)] == ep.token_ids
    assert ep.template_mismatches == 0


def test_a_template_that_rewrites_earlier_turns_is_counted_and_training_keeps_the_generated_ids():
    chat = ChatFormat(char_tokenizer(THINK_STRIPPING))
    task = toolset_tasks("1", 9, 5)[2]  # population of Kyoto
    ep = new_episode(task, chat)
    thought = '<think>kyoto is a city</think><tool_call>{"name":"lookup","arguments":{"city":"kyoto","field":"population"}}</tool_call>'
    generated = chat.encode(thought) + [chat.eos_id]
    ep.add_completion(generated)
    assert ep.messages[-1]["content"] == "1463723" and ep.template_mismatches == 1
    ep.add_completion(chat.encode("1463723") + [chat.eos_id])
    assert ep.score()["success"]
    own = [t for t, m in zip(ep.token_ids, ep.loss_mask, strict=True) if m]
    assert own[: len(generated)] == generated and "<think>kyoto" in chat.decode(ep.token_ids)


def test_qwen_style_calls_are_read_by_hermes():
    chat = ChatFormat(qwen_tokenizer())
    task = toolset_tasks("1", 9, 5)[0]
    text = '<tool_call>\n{"name": "calculator", "arguments": {"a": 18, "b": 24, "op": "*"}}\n</tool_call>'
    ep = new_episode(task, chat)
    ep.add_completion(chat.encode(text) + [chat.eos_id])
    assert ep.messages[-1]["content"] == "432" and ep.template_mismatches == 0
    assert chat.decode(ep.token_ids).endswith(
        "<|im_end|>\n<|im_start|>user\n<tool_response>\n432\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


# ---------------------------------------------------------------- bad input: one line naming the field


def _saved(tmp_path, tok):
    tok.save_pretrained(tmp_path)
    return tmp_path


def test_a_directory_without_a_tokenizer(tmp_path):
    with pytest.raises(ModelFormatError, match="has no tokenizer.*model.name_or_path"):
        ChatFormat.load(tmp_path)


def test_a_tokenizer_without_a_chat_template(tmp_path):
    tok = char_tokenizer()
    tok.chat_template = None
    (tmp_path / "chat_template.jinja").unlink(missing_ok=True)
    _saved(tmp_path, tok)
    (tmp_path / "chat_template.jinja").unlink(missing_ok=True)
    with pytest.raises(ModelFormatError, match="no chat template"):
        ChatFormat.load(tmp_path)


def test_a_template_that_ignores_tools(tmp_path):
    tok = char_tokenizer("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endfor %}")
    with pytest.raises(ModelFormatError, match="ignores `tools`"):
        ChatFormat.load(_saved(tmp_path, tok))


def test_an_unknown_tool_call_parser(tmp_path):
    with pytest.raises(ModelFormatError, match=r"model.tool_call_parser='hermes2' is not one of vLLM's.*llama3_json"):
        ChatFormat.load(_saved(tmp_path, char_tokenizer()), "hermes2")


def test_a_parser_whose_call_token_the_tokenizer_lacks(tmp_path):
    with pytest.raises(ModelFormatError, match=r"model.tool_call_parser='llama3_json' cannot read"):
        ChatFormat.load(_saved(tmp_path, char_tokenizer()), "llama3_json")


def test_qwen_template_passes_the_checks(tmp_path):
    chat = ChatFormat.load(_saved(tmp_path, qwen_tokenizer()))
    assert chat.tokenizer.chat_template == QWEN_TEMPLATE
    assert chat.eos_id == chat.tokenizer.convert_tokens_to_ids("<|im_end|>")


# ---------------------------------------------------------------- what the engines can run


def test_an_architecture_vllm_does_not_run_and_a_cpu_head_size_it_lacks():
    from tasks.policy.model import check_engine_support

    llama = {"architectures": ["LlamaForCausalLM"], "hidden_size": 128, "num_attention_heads": 4}
    check_engine_support(llama)
    with pytest.raises(ModelFormatError, match=r"architecture \['MyOwnForCausalLM'\] is not one vLLM"):
        check_engine_support(llama | {"architectures": ["MyOwnForCausalLM"]})
    with pytest.raises(ModelFormatError, match="head size 16 .*model.hidden_size or model.num_heads"):
        check_engine_support(llama | {"hidden_size": 64})


def test_a_missing_registry_alias_names_the_uri(tmp_path, monkeypatch):
    from tasks.policy.model import resolve_model_dir

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    with pytest.raises(FileNotFoundError, match="models:/nobody@champion is not in the MLflow registry"):
        resolve_model_dir("models:/nobody@champion", tmp_path / "dl")
