"""A second model family for tests: a tiny Qwen2 with a BPE tokenizer trained here and a Qwen2.5-style template.

Nothing is downloaded: the tokenizer is trained on the desk environment's own text, the weights are random.
The template follows Qwen2.5's tool-calling template (`<|im_start|>`/`<|im_end|>`, the tools as JSON inside
`<tools>`, calls as `<tool_call>\\n{json}\\n</tool_call>`, tool results grouped into a user turn inside
`<tool_response>`), with a shorter default system line. vLLM's `hermes` parser reads its calls.
"""

from __future__ import annotations

from pathlib import Path

QWEN_TEMPLATE = r"""{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}
{{- "\n\n# Tools\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
{%- for tool in tools %}{{- "\n" }}{{- tool | tojson }}{%- endfor %}
{{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}{%- endif %}
{%- endif %}
{%- for message in messages %}
{%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
{%- elif message.role == "assistant" %}
{{- '<|im_start|>' + message.role }}
{%- if message.content %}{{- '\n' + message.content }}{%- endif %}
{%- for tool_call in message.tool_calls %}
{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '\n<tool_call>\n{"name": "' }}{{- tool_call.name }}{{- '", "arguments": ' }}
{%- if tool_call.arguments is string %}{{- tool_call.arguments }}{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}
{{- '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif message.role == "tool" %}
{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\n<tool_response>\n' }}{{- message.content }}{{- '\n</tool_response>' }}
{%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}{{- '<|im_end|>\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
"""

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TAGS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]  # plain added tokens, as in Qwen2.5


def environment_text(n: int = 300) -> list[str]:
    """What the BPE trains on: the desk tasks' questions, tools and demonstrations, rendered by the template."""
    import json
    import random

    from tasks.envs.desk import demonstration, generate_tasks

    texts = []
    for task in generate_tasks(n, seed=11):
        texts.append(task.question)
        texts.append(json.dumps({"type": "function", "function": task.tools[0]["function"]}))
        for m in demonstration(task, random.Random(0)):
            texts.append(json.dumps(m.get("tool_calls") or m["content"]))
    return texts


def qwen_tokenizer(vocab_size: int = 600):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator(environment_text(), trainer=trainer)
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAGS])
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = QWEN_TEMPLATE
    return tok


def build_qwen(directory: str | Path, seed: int = 0) -> Path:
    """A tiny Qwen2ForCausalLM (hidden 64 = 2 heads of 32, a head size vLLM's CPU attention has) saved with
    its tokenizer and template: a standard checkpoint directory, as a team would bring one."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tok = qwen_tokenizer()
    eos, pad = tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    cfg = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        eos_token_id=eos,
        pad_token_id=pad,
        bos_token_id=None,
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg)
    model.generation_config = GenerationConfig(eos_token_id=[eos, pad], pad_token_id=pad)
    directory = Path(directory)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory
