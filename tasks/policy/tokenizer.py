"""The embedded default model's tokenizer: a standard `PreTrainedTokenizerFast`, built locally.

Nothing is downloaded. The tokenizer is built with the `tokenizers` library and saved into the model
directory (`tokenizer.json`, `tokenizer_config.json`, `chat_template.jinja`), so the default model loads
like any Hugging Face checkpoint: `AutoTokenizer.from_pretrained(model_dir)`.

- `char_tokenizer()`: one token per printable ASCII character plus single-token role and tool-call
  markers (a BPE model with no merges). Its ids are the ones the project's earlier private tokenizer
  used, so the default recipe's token sequences did not change with the move to a standard format.
- `bpe_tokenizer(texts, vocab_size)`: the same markers and alphabet plus byte-pair merges learnt from
  `texts` (the environment's own text): shorter sequences for the same conversations.

Both carry `templates/evergreen.jinja`, a chat template that renders the episode's OpenAI tools compactly
and calls as `<tool_call>{json}</tool_call>`, which vLLM's `hermes` tool parser reads.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

    from tasks.config_sections import ModelSettings
    from tasks.policy.chat import ChatFormat

PAD, BOS, EOS = "<pad>", "<s>", "<|end|>"
ROLES = ["<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"]
CALL_MARKERS = ["<tool_call>", "</tool_call>"]  # plain added tokens, as in Qwen2.5: text, not control
ALPHABET = "\n" + "".join(chr(c) for c in range(32, 127))
UNKNOWN = "?"  # characters outside the alphabet map here rather than failing the episode
TEMPLATE_FILE = Path(__file__).with_name("templates") / "evergreen.jinja"


@lru_cache(maxsize=1)
def default_template() -> str:
    return TEMPLATE_FILE.read_text()


def _markers() -> list[str]:
    return [PAD, BOS, EOS, *ROLES, *CALL_MARKERS]


def _wrap(backend: Any, template: str | None) -> PreTrainedTokenizerFast:
    """The `tokenizers` object as a transformers tokenizer with its specials and chat template."""
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in [PAD, BOS, EOS, *ROLES]])
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in CALL_MARKERS])
    # the unknown character is the backend model's (`?`, an ordinary character), not a special token
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token=PAD, bos_token=BOS, eos_token=EOS)
    tokenizer.chat_template = template or default_template()
    return tokenizer


def char_tokenizer(template: str | None = None) -> PreTrainedTokenizerFast:
    """Markers first (ids 0-8: pad, bos, eos, the four roles, the two call markers), then one id per character."""
    from tokenizers import Tokenizer, decoders, models

    vocab = {t: i for i, t in enumerate(_markers() + list(ALPHABET))}
    # no pre-tokenizer and no merges: the whole text is one "word" split into its characters
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNKNOWN))
    backend.decoder = decoders.Fuse()  # join tokens without the spaces a BPE decoder would put between them
    return _wrap(backend, template)


def bpe_tokenizer(texts: Iterable[str], vocab_size: int, template: str | None = None) -> PreTrainedTokenizerFast:
    """The character vocabulary plus merges learnt from `texts` up to `vocab_size` entries."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    backend = Tokenizer(models.BPE(unk_token=UNKNOWN))
    # words, and each other character alone, so that merges stay inside words and numbers
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"\w+|\W"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=_markers(),
        initial_alphabet=list(ALPHABET),
        limit_alphabet=len(ALPHABET),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    return _wrap(backend, template)


def environment_text(env_name: str | None, n: int = 600, seed: int = 7) -> list[str]:
    """Training-split demonstrations of an environment, played through the episode loop on the character
    tokenizer and decoded: what a BPE for the embedded default learns its merges from (the text its
    sequences will be made of)."""
    import random

    from tasks.config_sections import EnvSettings
    from tasks.envs import get_env, new_episode

    env, chat = get_env(env_name or EnvSettings.model_fields["name"].default), default_chat()
    if env.demonstration is None:
        raise ValueError(
            f"model.tokenizer=bpe learns from demonstrations; environment {env.name!r} has none: "
            f"use model.tokenizer=char or a model with its own tokenizer (model.name_or_path)"
        )
    rng = random.Random(seed)
    texts = []
    for task in env.generate_tasks(n, seed, split="train"):
        ep = new_episode(task, chat)
        for message in env.demonstration(task, rng):
            ep.add_message(message)
        texts.append(chat.decode(ep.token_ids))
    return texts


def default_tokenizer(model_settings: ModelSettings, env_name: str | None = None) -> PreTrainedTokenizerFast:
    """The embedded default's tokenizer as `model.tokenizer` chooses it."""
    if model_settings.tokenizer == "bpe":
        return bpe_tokenizer(environment_text(env_name), model_settings.bpe_vocab_size)
    return char_tokenizer()


def default_chat(tool_call_parser: str = "hermes") -> ChatFormat:
    """The embedded default's ChatFormat (the character tokenizer and its template)."""
    from tasks.policy.chat import ChatFormat

    return ChatFormat(char_tokenizer(), tool_call_parser)
