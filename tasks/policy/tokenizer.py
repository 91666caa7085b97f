"""A character-level tokenizer and the chat format the Evergreen agent speaks.

Built locally from a fixed alphabet, so nothing is ever downloaded. Every printable ASCII character
is one token; the chat roles and the tool-call delimiters are single special tokens, which keeps
sequences short for a tiny model and lets engines stop on one token id (`<|end|>`, the EOS).

The tokenizer is saved beside the model weights as `evergreen_tokenizer.json`; engines are given
token ids only (vLLM runs with `skip_tokenizer_init=True`).

Chat format (documented contract, see tasks/envs/base.py for the episode loop):

    <|system|>{rendered tools}<|end|><|user|>{question}<|end|>
    <|assistant|><tool_call>{"name": ..., "arguments": {...}}</tool_call><|end|>
    <|tool|>{tool result}<|end|>
    <|assistant|>{final answer}<|end|>
"""
from __future__ import annotations

import json
from pathlib import Path

PAD, BOS, EOS = "<pad>", "<s>", "<|end|>"
ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>", "tool": "<|tool|>"}
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
SPECIALS = [PAD, BOS, EOS, *ROLE_TOKENS.values(), TOOL_CALL_OPEN, TOOL_CALL_CLOSE]
ALPHABET = "\n" + "".join(chr(c) for c in range(32, 127))
UNKNOWN = "?"  # characters outside the alphabet map here rather than failing the episode
FILE_NAME = "evergreen_tokenizer.json"


class CharTokenizer:
    """Maps text to ids: specials first (longest match), then one id per character."""

    def __init__(self, specials: list[str] | None = None, alphabet: str = ALPHABET):
        self.specials = list(specials or SPECIALS)
        self.alphabet = alphabet
        self.vocab = self.specials + list(alphabet)
        self.token_to_id = {t: i for i, t in enumerate(self.vocab)}
        self.pad_id, self.bos_id, self.eos_id = (self.token_to_id[t] for t in (PAD, BOS, EOS))
        self._specials_by_first = sorted(self.specials, key=len, reverse=True)

    def encode_message(self, role: str, content: str) -> list[int]:
        """Ids of one context message, `render_message` as tokens; the content is data, so text like
        "<|system|>" in a tool result stays plain characters and cannot forge a role."""
        return [self.token_to_id[ROLE_TOKENS[role]], *self.encode(content, specials=False), self.eos_id]

    @property
    def assistant_id(self) -> int:
        """The role token a generation continues from."""
        return self.token_to_id[ROLE_TOKENS["assistant"]]

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode(self, text: str, specials: bool = True) -> list[int]:
        """Token ids; with specials=False, text like "<|end|>" is encoded character by character (data)."""
        ids, i, unk = [], 0, self.token_to_id[UNKNOWN]
        while i < len(text):
            if specials and text[i] == "<":
                special = next((s for s in self._specials_by_first if text.startswith(s, i)), None)
                if special:
                    ids.append(self.token_to_id[special])
                    i += len(special)
                    continue
            ids.append(self.token_to_id.get(text[i], unk))
            i += 1
        return ids

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        out = []
        for i in ids:
            if not 0 <= i < len(self.vocab):
                continue  # ids past the vocab (padded embedding rows) carry no text
            tok = self.vocab[i]
            if skip_special and tok in self.specials:
                continue
            out.append(tok)
        return "".join(out)

    def save(self, directory: str | Path) -> None:
        Path(directory, FILE_NAME).write_text(json.dumps({"specials": self.specials, "alphabet": self.alphabet}))

    @classmethod
    def load(cls, directory: str | Path) -> "CharTokenizer":
        path = Path(directory, FILE_NAME)
        if not path.exists():
            raise FileNotFoundError(f"{path} is missing: the model directory must hold the tokenizer saved by build_model")
        data = json.loads(path.read_text())
        return cls(data["specials"], data["alphabet"])


def render_message(role: str, content: str) -> str:
    return f"{ROLE_TOKENS[role]}{content}{EOS}"


def render_generation_prompt(messages: list[dict]) -> str:
    """All messages so far, then the assistant role token the model continues from."""
    return "".join(render_message(m["role"], m["content"]) for m in messages) + ROLE_TOKENS["assistant"]
