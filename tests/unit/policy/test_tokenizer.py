"""Character tokenizer (tasks/policy/tokenizer.py)."""
import json

import pytest

from tasks.policy.tokenizer import (ALPHABET, EOS, FILE_NAME, ROLE_TOKENS, SPECIALS, TOOL_CALL_CLOSE,
                                    TOOL_CALL_OPEN, CharTokenizer, render_generation_prompt, render_message)


def test_vocab_size_and_ids_are_stable():
    tok = CharTokenizer()
    assert tok.vocab_size == 105        # 9 specials + newline + 95 printable ASCII
    assert len(SPECIALS) == 9
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
    assert tok.token_to_id["<|system|>"] == 3
    assert tok.token_to_id["</tool_call>"] == 8
    assert tok.token_to_id["\n"] == 9
    assert tok.token_to_id[" "] == 10
    assert tok.token_to_id["~"] == 104


def test_specials_are_single_tokens():
    tok = CharTokenizer()
    for s in SPECIALS:
        assert tok.encode(s) == [tok.token_to_id[s]], s
    assert tok.encode(EOS) == [tok.eos_id]


def test_round_trip_with_specials():
    tok = CharTokenizer()
    text = (f"{ROLE_TOKENS['user']}What is 3<4 and <b>?{EOS}\n{ROLE_TOKENS['assistant']}"
            f'{TOOL_CALL_OPEN}{{"name":"calc","arguments":{{"a":1}}}}{TOOL_CALL_CLOSE}{EOS}')
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    # specials count as one token each, everything else one per character
    n_special = 6
    special_chars = sum(len(s) for s in (ROLE_TOKENS["user"], EOS, ROLE_TOKENS["assistant"], TOOL_CALL_OPEN,
                                         TOOL_CALL_CLOSE, EOS))
    assert len(ids) == len(text) - special_chars + n_special


def test_partial_special_is_plain_characters():
    tok = CharTokenizer()
    ids = tok.encode("<|end")
    assert len(ids) == 5
    assert tok.decode(ids) == "<|end"


def test_decode_skip_special():
    tok = CharTokenizer()
    assert tok.decode(tok.encode(render_message("tool", "42")), skip_special=True) == "42"


def test_unknown_characters_map_to_question_mark():
    tok = CharTokenizer()
    ids = tok.encode("café\tü")
    assert len(ids) == 6
    assert tok.decode(ids) == "caf??" + "?"


def test_decode_ignores_ids_past_the_vocab():
    tok = CharTokenizer()
    assert tok.decode([tok.token_to_id["a"], 105, 4096, -1, tok.token_to_id["b"]]) == "ab"


def test_save_load_round_trip(tmp_path):
    tok = CharTokenizer()
    tok.save(tmp_path)
    data = json.loads((tmp_path / FILE_NAME).read_text())
    assert data["specials"] == SPECIALS and data["alphabet"] == ALPHABET
    loaded = CharTokenizer.load(tmp_path)
    assert loaded.vocab == tok.vocab
    assert loaded.vocab_size == 105
    text = render_generation_prompt([{"role": "user", "content": "hi"}])
    assert loaded.encode(text) == tok.encode(text)


def test_load_missing_file_raises(tmp_path):
    with pytest.raises(FileNotFoundError, match=FILE_NAME):
        CharTokenizer.load(tmp_path)


def test_chat_rendering():
    assert render_message("user", "hi") == "<|user|>hi<|end|>"
    assert render_generation_prompt([{"role": "system", "content": "t"}, {"role": "user", "content": "q"}]) == \
        "<|system|>t<|end|><|user|>q<|end|><|assistant|>"
