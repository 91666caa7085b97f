"""The embedded default's tokenizers (tasks/policy/tokenizer.py): standard, saved and loaded like any checkpoint's."""

import pytest
from transformers import AutoTokenizer

from tasks.envs.desk import generate_tasks
from tasks.policy.tokenizer import ALPHABET, CALL_MARKERS, EOS, ROLES, bpe_tokenizer, char_tokenizer

CONVERSATION = [
    {"role": "user", "content": "What is 3<4 and <b>?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "calc", "arguments": {"a": 1}}}],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "7"},
    {"role": "assistant", "content": "7"},
]


def test_char_ids_are_the_fixed_alphabet():
    tok = char_tokenizer()
    assert len(tok) == 105  # 9 markers + newline + 95 printable ASCII
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    assert tok.convert_tokens_to_ids(["<|system|>", "</tool_call>", "\n", " ", "~"]) == [3, 8, 9, 10, 104]
    assert tok.encode("<|end|>", add_special_tokens=False) == [2]
    for marker in [*ROLES, *CALL_MARKERS]:
        assert len(tok.encode(marker, add_special_tokens=False)) == 1, marker


def test_char_round_trip_is_exact_and_unknown_characters_become_question_marks():
    tok = char_tokenizer()
    text = 'x<|assistant|><tool_call>{"name":"calc","arguments":{"a":1}}</tool_call>' + EOS + "\n  <|end"
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    assert len(ids) == len(text) - sum(len(m) - 1 for m in ("<|assistant|>", *CALL_MARKERS, EOS))
    assert tok.decode(tok.encode("café", add_special_tokens=False)) == "caf?"


def test_saved_directory_loads_with_autotokenizer_and_its_template(tmp_path):
    tok = char_tokenizer()
    tok.save_pretrained(tmp_path)
    assert (tmp_path / "tokenizer.json").exists() and (tmp_path / "chat_template.jinja").exists()
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    kwargs = {"tools": None, "tokenize": True, "return_dict": False}
    assert loaded.apply_chat_template(CONVERSATION, **kwargs) == tok.apply_chat_template(CONVERSATION, **kwargs)
    text = loaded.apply_chat_template(CONVERSATION, tokenize=False)
    assert text == (
        '<|user|>What is 3<4 and <b>?<|end|><|assistant|><tool_call>{"name":"calc","arguments":{"a":1}}'
        "</tool_call><|end|><|tool|>7<|end|><|assistant|>7<|end|>"
    )


def test_template_rejects_an_unknown_role():
    with pytest.raises(Exception, match="unknown role"):
        char_tokenizer().apply_chat_template([{"role": "narrator", "content": "x"}], tokenize=False)


def test_bpe_learns_merges_from_the_environment_text_and_shortens_sequences():
    texts = [t.question for t in generate_tasks(300, seed=0)]
    bpe, char = bpe_tokenizer(texts, vocab_size=400), char_tokenizer()
    assert len(bpe) > len(char)
    assert bpe.convert_tokens_to_ids(["<pad>", "<s>", EOS]) == [0, 1, 2]
    sample = generate_tasks(20, seed=9)
    n_bpe = sum(len(bpe.encode(t.question, add_special_tokens=False)) for t in sample)
    n_char = sum(len(char.encode(t.question, add_special_tokens=False)) for t in sample)
    assert n_bpe < 0.7 * n_char
    for t in sample:
        assert bpe.decode(bpe.encode(t.question, add_special_tokens=False)) == t.question
    assert set(ALPHABET) <= set("".join(bpe.convert_ids_to_tokens(list(range(len(bpe))))))


def test_the_bpe_default_halves_the_demonstrations_and_keeps_them_exact():
    import random

    from tasks.config import ModelSettings
    from tasks.envs import new_episode
    from tasks.envs.desk import demonstration, toolset_tasks
    from tasks.policy.model import build_model

    lengths = {}
    for kind in ("char", "bpe"):
        _, chat = build_model(
            ModelSettings(tokenizer=kind, hidden_size=32, num_layers=1, num_heads=1, intermediate_size=32)
        )
        lengths[kind] = 0
        for task in toolset_tasks("1", 12, 5):
            ep = new_episode(task, chat)
            for message in demonstration(task, random.Random(0)):
                ep.add_message(message)
            assert ep.score()["success"] and ep.template_mismatches == 0
            lengths[kind] += len(ep.token_ids)
    assert lengths["bpe"] < 0.6 * lengths["char"]
