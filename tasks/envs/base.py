"""The environment interface (NeMo Gym-like): tasks, tool-call parsing, schema checks, episodes, verifier.

A Task is a question, the tools offered (OpenAI function-tool schemas), the tool service that answers
calls, and the verifier's data. An Episode is the multi-turn loop, kept as a state machine so that any
generation backend can drive many episodes at once:

    ep = Episode(task, tokenizer, service)      # service: the task's ToolService
    while not ep.done:
        ids = ep.prompt_ids()                    # everything so far + <|assistant|>
        ep.add_completion(completion_ids, logprobs)   # parse -> check -> execute -> tool message

The model's tool-call format is `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`; a turn
without a tool call is the final answer. Malformed output never raises: it earns a tool error message
(so the model may retry), a lower format/validity score and a reason.

Reward = 0.1 * format + 0.1 * call_validity + 0.8 * correct, each in [0, 1]. A call is valid when it
fits its schema *and* the service answers it (a refusal or a tool failure is not). An answer is correct
only when it matches the expected value *and* a grounding call returned it: a successful call whose
arguments solve the task, as the tool service judges (`ToolService.solves`). A policy must not learn to
answer from memory after a failed call (the table behind a tool changes in production; memory does not),
nor to echo a guessed answer through a tool (x + 0, x * 1, a km -> km conversion, another city's
matching value): those return the right value without solving anything.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from tasks.policy.tokenizer import EOS, TOOL_CALL_CLOSE, TOOL_CALL_OPEN, CharTokenizer

REWARD_WEIGHTS = {"format": 0.1, "call_validity": 0.1, "correct": 0.8}
_CALL_RE = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)(" + re.escape(TOOL_CALL_CLOSE) + r"|$)", re.S)
_JSON_TYPES = {"integer": int, "number": (int, float), "string": str, "boolean": bool, "object": dict, "array": list}
TYPE_ABBREV = {"integer": "int", "number": "num", "string": "str", "boolean": "bool", "object": "obj", "array": "list"}


@dataclass
class Task:
    """One environment task; JSON-serialisable so it travels to Ray actors and into storage."""

    task_id: str
    env: str
    family: str
    question: str
    tools: list[dict]
    expected: str
    service: dict  # what answers the calls: {"name": env service, "version": ..., "bindings": {...}}

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: dict) -> "Task":
        return cls(**d)


class ToolError(Exception):
    """Raised by a tool service for a call it refuses; the message is shown to the model."""


class ToolService(Protocol):
    """What answers an episode's schema-valid calls: a result string, or ToolError for a refusal.

    `solves(name, arguments)` says whether a call's arguments are the task's own question (not merely a
    call that returns the expected value); only the environment knows its tasks' solutions. A service
    without `solves` grounds nothing, so its episodes never count as correct."""

    def __call__(self, name: str, arguments: dict) -> str: ...

    def solves(self, name: str, arguments: dict) -> bool: ...


@dataclass
class ParsedCall:
    name: str | None
    arguments: dict | None
    error: str | None  # why the block could not be read as a call


def parse_tool_calls(text: str) -> list[ParsedCall]:
    """Every `<tool_call>` block in a completion, each parsed or with the reason it failed."""
    calls = []
    for m in _CALL_RE.finditer(text):
        body, closed = m.group(1).strip(), bool(m.group(2))
        if not closed:
            calls.append(ParsedCall(None, None, "tool call not closed with </tool_call>"))
            continue
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as e:
            calls.append(ParsedCall(None, None, f"tool call is not valid JSON ({e.msg} at char {e.pos})"))
            continue
        except (ValueError, RecursionError) as e:  # e.g. a 5000-digit integer, or [[[[... nested too deep
            calls.append(ParsedCall(None, None, f"tool call is not valid JSON ({type(e).__name__})"))
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            calls.append(ParsedCall(None, None, 'tool call must be an object with a string "name"'))
            continue
        args = obj.get("arguments", {})
        if not isinstance(args, dict):
            calls.append(ParsedCall(obj["name"], None, '"arguments" must be an object'))
            continue
        calls.append(ParsedCall(obj["name"], args, None))
    return calls


def check_arguments(tool: dict, arguments: dict) -> str | None:
    """None when `arguments` fit the tool's JSON schema (required, no extras, types, enums); else why not."""
    params = tool["function"].get("parameters", {})
    props = params.get("properties", {})
    for req in params.get("required", []):
        if req not in arguments:
            return f"missing required argument '{req}'"
    for name, value in arguments.items():
        if name not in props:
            return f"unknown argument '{name}'"
        spec = props[name]
        py_type = _JSON_TYPES.get(spec.get("type", "string"), object)
        # bool is an int in Python but not in JSON schema
        if not isinstance(value, py_type) or (isinstance(value, bool) and spec.get("type") != "boolean"):
            return f"argument '{name}' must be {spec.get('type')}, got {type(value).__name__}"
        if "enum" in spec and value not in spec["enum"]:
            return f"argument '{name}' must be one of {spec['enum']}"
    return None


def render_tools(tools: list[dict]) -> str:
    """The compact tool listing shown in the system prompt: `name(arg:type,...) - first sentence`."""
    lines = []
    for t in tools:
        fn = t["function"]
        props = fn.get("parameters", {}).get("properties", {})
        args = ",".join(f"{k}:{TYPE_ABBREV.get(v.get('type', 'string'), 'str')}" for k, v in props.items())
        desc = fn.get("description", "").split(".")[0]
        lines.append(f"{fn['name']}({args}) - {desc}")
    return "\n".join(lines)


def normalise_answer(text: str) -> str:
    return text.strip().strip(".").strip().lower()


@dataclass
class Episode:
    """The multi-turn loop for one task, driven token by token from outside."""

    task: Task
    tokenizer: CharTokenizer
    service: ToolService
    max_turns: int = 4
    max_tokens_per_turn: int = 96
    max_len: int = 512
    messages: list[dict] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)  # 1 only on tokens the model generated
    logprobs: list[float] = field(default_factory=list)
    done: bool = False
    answer: str | None = None
    turns: int = 0
    n_calls: int = 0
    n_valid_calls: int = 0
    n_tool_errors: int = 0
    n_well_formed_turns: int = 0
    answered: list[tuple[str, dict, str]] = field(default_factory=list)  # (name, arguments, result) of successes
    end_reason: str = ""
    completion_tokens: int = 0

    def __post_init__(self):
        self.messages = [
            {"role": "system", "content": render_tools(self.task.tools)},
            {"role": "user", "content": self.task.question},
        ]
        for m in self.messages:
            self._append_ids(self.tokenizer.encode_message(m["role"], m["content"]))

    def _append_ids(self, ids: list[int]) -> None:
        self.token_ids += ids
        self.loss_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)

    def prompt_ids(self) -> list[int]:
        """Token ids the backend continues from: the transcript so far plus the assistant role token."""
        return self.token_ids + [self.tokenizer.assistant_id]

    def remaining_tokens(self) -> int:
        return min(self.max_tokens_per_turn, self.max_len - len(self.token_ids) - 1)

    def add_completion(self, completion_ids: list[int], logprobs: list[float] | None = None) -> None:
        if self.done:
            raise RuntimeError(f"episode {self.task.task_id} is already done ({self.end_reason})")
        self._append_ids([self.tokenizer.assistant_id])
        self.token_ids += list(completion_ids)
        self.loss_mask += [1] * len(completion_ids)
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(completion_ids)
        self.completion_tokens += len(completion_ids)
        self.turns += 1
        ended = bool(completion_ids) and completion_ids[-1] == self.tokenizer.eos_id
        text = self.tokenizer.decode(completion_ids[:-1] if ended else completion_ids)
        self.messages.append({"role": "assistant", "content": text})
        if not ended:
            return self._finish(f"turn {self.turns} hit the {len(completion_ids)}-token limit without {EOS}")
        if TOOL_CALL_OPEN not in text and TOOL_CALL_CLOSE not in text:
            self.answer = text
            self.n_well_formed_turns += bool(text.strip()) and "<|" not in text
            return self._finish("final answer" if text.strip() else "empty final answer")
        self._run_calls(text)
        if self.turns >= self.max_turns:
            return self._finish(f"no final answer after {self.max_turns} turns")
        if self.remaining_tokens() < 8:
            return self._finish(f"context of {self.max_len} tokens exhausted")

    def _run_calls(self, text: str) -> None:
        calls = parse_tool_calls(text)
        if not calls:  # a stray </tool_call> without an opening tag
            calls = [ParsedCall(None, None, "tool call has no opening <tool_call>")]
        results, well_formed = [], True
        for call in calls:
            self.n_calls += 1
            if call.error:
                well_formed = False
                results.append(f"error: {call.error}")
                continue
            tool = next((t for t in self.task.tools if t["function"]["name"] == call.name), None)
            if tool is None:
                offered = ", ".join(t["function"]["name"] for t in self.task.tools)
                results.append(f"error: unknown tool '{call.name}'; offered: {offered}")
                continue
            problem = check_arguments(tool, call.arguments)
            if problem:
                results.append(f"error: {problem}")
                continue
            try:
                results.append(str(self.service(call.name, call.arguments)))
            except ToolError as e:
                self.n_tool_errors += 1
                results.append(f"error: {e}")
            except Exception as e:  # a tool bug must not end the rollout batch
                self.n_tool_errors += 1
                results.append(f"error: tool failed ({type(e).__name__})")
            else:
                self.n_valid_calls += 1
                self.answered.append((call.name, call.arguments, results[-1]))
        self.n_well_formed_turns += well_formed
        content = "\n".join(results)
        self.messages.append({"role": "tool", "content": content})
        self._append_ids(self.tokenizer.encode_message("tool", content))

    def _finish(self, reason: str) -> None:
        self.done, self.end_reason = True, reason

    def _grounds(self, name: str, arguments: dict, result: str) -> bool:
        solves = getattr(self.service, "solves", None)
        if solves is None or normalise_answer(result) != normalise_answer(self.task.expected):
            return False
        try:
            return bool(solves(name, arguments))
        except Exception:  # a service bug grounds nothing and must not end the rollout batch
            return False

    def score(self) -> dict[str, Any]:
        """Reward in [0, 1] with its named components and a reason."""
        matches = self.answer is not None and normalise_answer(self.answer) == normalise_answer(self.task.expected)
        grounded = any(self._grounds(*call) for call in self.answered)
        correct = float(matches and grounded)
        fmt = self.n_well_formed_turns / self.turns if self.turns else 0.0
        validity = self.n_valid_calls / self.n_calls if self.n_calls else 0.0
        components = {"format": fmt, "call_validity": validity, "correct": correct}
        reward = sum(REWARD_WEIGHTS[k] * v for k, v in components.items())
        if correct:
            reason = "correct"
        elif matches:
            reason = ("right value, but no successful call that solves the task returned it "
                      "(answered from memory, or echoed through a tool)")
        elif self.answer is None:
            reason = self.end_reason
        else:
            reason = f"answer {self.answer.strip()[:40]!r} != expected {self.task.expected!r}"
        return {"reward": round(reward, 6), "components": components, "reason": reason, "success": bool(correct),
                "turns": self.turns, "tool_calls": self.n_calls, "tool_errors": self.n_tool_errors}
