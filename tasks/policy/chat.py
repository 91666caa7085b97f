"""A model's own chat format: its tokenizer, its chat template (tools included) and its tool-call parser.

    chat = ChatFormat.load(model_dir, tool_call_parser="hermes")
    ids = chat.prompt(messages, tools)                    # template(messages, tools=tools) + generation prompt
    turn = chat.parse(chat.decode(completion_ids))        # vLLM's tool parser: content, calls, malformed?
    ids, matched = chat.extend(running, messages, tools)  # the ids a new tool message adds to `running`

Episodes stay on token ids: a turn's generated ids are kept as generated, and a tool message is appended
as the ids the template gives for it (the rendering of the whole conversation, past the running ids).
`matched` is False when the template's rendering does not start with the running ids (the policy wrote
a call in a form the template would render differently, or the template rewrites earlier turns); the
ids appended are then the template's rendering of the new messages alone, and the loss still sees the
ids the policy generated.

Tool calls are read by vLLM's own parsers (`vllm.tool_parsers`), the ones `vllm serve
--tool-call-parser` uses, so that training, evals, the simulator and serving agree on what a call is.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

PROBE_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "evergreen_probe_tool",
        "description": "Checks that the template renders tools.",
        "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
    },
}


class ModelFormatError(ValueError):
    """A model directory the loop cannot run: the message names the setting or file to change."""


@dataclass
class ParsedCall:
    name: str | None
    arguments: dict | None
    error: str | None  # why the call could not be read


@dataclass
class ParsedTurn:
    content: str  # text outside the calls (the whole text of a final answer)
    calls: list[ParsedCall]  # one ParsedCall with an error when the turn's calls could not be parsed
    attempted: bool  # the turn tried to call a tool (its calls, or a malformed attempt)


def tool_parser_names() -> list[str]:
    from vllm.tool_parsers import ToolParserManager

    return sorted(ToolParserManager.list_registered())


def tool_parser(name: str, tokenizer: PreTrainedTokenizerBase) -> Any:
    """An instance of vLLM's tool parser `name` for `tokenizer`; ModelFormatError naming the setting when
    the name is unknown or the parser cannot work with this tokenizer (a missing call token)."""
    from vllm.tool_parsers import ToolParserManager

    try:
        cls = ToolParserManager.get_tool_parser(name)
    except KeyError:
        raise ModelFormatError(
            f"model.tool_call_parser={name!r} is not one of vLLM's tool parsers ({', '.join(tool_parser_names())})"
        ) from None
    try:
        parser = cls(tokenizer)
    except Exception as e:
        raise ModelFormatError(
            f"model.tool_call_parser={name!r} cannot read this tokenizer's calls "
            f"({type(e).__name__}: {e}); pick the parser of the model's chat template"
        ) from None
    # a malformed call is an ordinary outcome of RL, answered with a tool error; the parsers log each one
    # with a traceback at ERROR. A filter, not a level: vLLM's logging config resets its loggers' levels.
    parser_log = logging.getLogger(cls.__module__)
    if _drop_parse_errors not in parser_log.filters:
        parser_log.addFilter(_drop_parse_errors)
    return parser


def _drop_parse_errors(record: logging.LogRecord) -> bool:
    return record.exc_info is None


def _call_markers(parser: Any) -> list[str]:
    return [
        m
        for m in (getattr(parser, a, None) for a in ("tool_call_start_token", "tool_call_end_token", "bot_token"))
        if isinstance(m, str) and m
    ]


class ChatFormat:
    """What an episode needs of a model: template rendering to ids, decoding, and tool-call parsing."""

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, tool_call_parser: str = "hermes", stop_ids: list[int] | None = None
    ) -> None:
        self.tokenizer = tokenizer
        self.parser_name = tool_call_parser
        ids = [tokenizer.eos_token_id, *(stop_ids or [])]
        self.stop_ids = frozenset(i for i in ids if i is not None)
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_id
        # control tokens (roles, EOS, ...): all_special_ids lists only the named ones (bos, eos, pad, unk)
        self.special_ids = frozenset(tokenizer.all_special_ids) | frozenset(
            i for i, t in tokenizer.added_tokens_decoder.items() if t.special
        )

    @classmethod
    def load(
        cls,
        model_dir: str | Path,
        tool_call_parser: str = "hermes",
        revision: str | None = None,
        trust_remote_code: bool = False,
    ) -> ChatFormat:
        """The format of a model directory; ModelFormatError when the loop cannot run it."""
        from transformers import AutoTokenizer, GenerationConfig

        model_dir = Path(model_dir)
        if not any((model_dir / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
            raise ModelFormatError(
                f"{model_dir} has no tokenizer (tokenizer.json or tokenizer_config.json): "
                "model.name_or_path must be a directory saved with its tokenizer"
            )
        tokenizer = AutoTokenizer.from_pretrained(model_dir, revision=revision, trust_remote_code=trust_remote_code)
        stop = []
        if (model_dir / "generation_config.json").exists():
            eos = GenerationConfig.from_pretrained(model_dir).eos_token_id
            stop = [eos] if isinstance(eos, int) else list(eos or [])
        chat = cls(tokenizer, tool_call_parser, stop)
        chat.check(model_dir)
        return chat

    def check(self, where: str | Path = "the model") -> None:
        """Refuse, before any compute, a template that is missing or ignores tools, and an unusable parser."""
        if not self.tokenizer.chat_template:
            raise ModelFormatError(
                f"{where} has no chat template (chat_template.jinja or tokenizer_config.json "
                "chat_template): model.name_or_path must be a chat model"
            )
        rendered = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": "hi"}], tools=[PROBE_TOOL], add_generation_prompt=True, tokenize=False
        )
        if PROBE_TOOL["function"]["name"] not in rendered:
            raise ModelFormatError(
                f"the chat template of {where} ignores `tools`: the policy would never see "
                "the tools it must call; use a tool-calling chat template"
            )
        if not self.stop_ids:
            raise ModelFormatError(f"{where} has no EOS token: set eos_token in tokenizer_config.json")
        self.parser  # noqa: B018 - raises ModelFormatError for an unknown or unusable parser

    @cached_property
    def parser(self) -> Any:
        return tool_parser(self.parser_name, self.tokenizer)

    def render(self, messages: list[dict], tools: list[dict] | None, generation_prompt: bool) -> list[int]:
        return self.tokenizer.apply_chat_template(
            messages, tools=tools or None, add_generation_prompt=generation_prompt, tokenize=True, return_dict=False
        )

    def prompt(self, messages: list[dict], tools: list[dict] | None) -> list[int]:
        """The ids a first turn is generated from."""
        return self.render(messages, tools, generation_prompt=True)

    def extend(
        self, running: list[int], messages: list[dict], tools: list[dict] | None, new: int = 1
    ) -> tuple[list[int], bool]:
        """Ids that append the last `new` messages (and the next generation prompt) to `running`, and whether
        the template's rendering of the whole conversation starts with `running`."""
        whole = self.render(messages, tools, generation_prompt=True)
        if whole[: len(running)] == running:
            return whole[len(running) :], True
        # the template renders the conversation differently from the ids the policy ran on: render the new
        # messages after only the turn they answer (and the question), which holds for a template that
        # re-renders calls canonically or rewrites turns before the last one
        k = len(messages) - new
        base = [messages[0], messages[k - 1]] if k >= 2 else messages[:k]
        before = self.render(base, tools, generation_prompt=False)
        after = self.render(base + messages[k:], tools, generation_prompt=True)
        common = next(
            (i for i, (a, b) in enumerate(zip(before, after, strict=False)) if a != b), min(len(before), len(after))
        )
        if common < len(before):
            log.warning(
                "the chat template re-renders the turn before a tool message once the message is added; "
                "appending its rendering from the first changed token"
            )
        return after[common:], False

    def turn_ids(self, messages: list[dict], tools: list[dict] | None, message: dict) -> list[int]:
        """The ids of an assistant `message` (an expert's turn) after `messages`, ending with the stop token
        the policy must learn to emit."""
        before = self.render(messages, tools, generation_prompt=True)
        whole = self.render([*messages, message], tools, generation_prompt=False)
        if whole[: len(before)] != before:
            raise ModelFormatError("the chat template's generation prompt is not a prefix of the assistant turn")
        ids = whole[len(before) :]
        last_stop = max((k for k, t in enumerate(ids) if t in self.stop_ids), default=None)
        if last_stop is None:
            raise ModelFormatError("the chat template ends an assistant turn without an EOS token")
        return ids[: last_stop + 1]

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def parse(self, text: str) -> ParsedTurn:
        """The calls in a turn's text, by the model's tool parser; never raises."""
        failure: str | None
        try:
            info = self.parser.extract_tool_calls(text, None)
        except Exception as e:
            info, failure = None, f"{type(e).__name__}"
        else:
            failure = None
        if info is not None and info.tools_called:
            calls = [self._call(c.function.name, c.function.arguments) for c in info.tool_calls]
            return ParsedTurn(info.content or "", calls, True)
        if any(m in text for m in _call_markers(self.parser)) or failure:
            why = f"the {self.parser_name} tool parser could not read the call" + (f" ({failure})" if failure else "")
            return ParsedTurn(text, [ParsedCall(None, None, why)], True)
        return ParsedTurn(text, [], False)

    @staticmethod
    def _call(name: object, arguments: str | dict) -> ParsedCall:
        if not isinstance(name, str) or not name:
            return ParsedCall(None, None, 'tool call must have a string "name"')
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except (ValueError, RecursionError) as e:
                return ParsedCall(name, None, f'"arguments" is not valid JSON ({type(e).__name__})')
        if not isinstance(arguments, dict):
            return ParsedCall(name, None, '"arguments" must be an object')
        return ParsedCall(name, arguments, None)
