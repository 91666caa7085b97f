"""The environment interface (NeMo Gym-like): tasks, schema checks, episodes, verifier.

A Task is a question, the tools offered (OpenAI function-tool schemas) and the environment's own data
for it (what its tool backend and verifier need). An Episode is the multi-turn loop, kept as a state
machine so that any generation backend can drive many episodes at once:

    ep = Episode(task, chat, session, verifier)  # chat: the model's ChatFormat; session: a tool backend's
                                                 # (tasks.envs.backends); verifier: the environment's
    while not ep.done:
        ids = ep.prompt_ids()                    # everything so far + the template's generation prompt
        ep.add_completion(completion_ids, logprobs)   # parse -> check -> execute -> tool message

Prompts come from the model's chat template (the tools passed as `tools=`) and calls are read by the
model's vLLM tool parser (tasks/policy/chat.py); a turn without a call attempt is the final answer.
Malformed output never raises: it earns a tool error message (so the model may retry), a lower
format/validity score and a reason.

The reward is the environment's (`Environment.verify`). `GroundedVerifier`, which desk uses, gives
0.1 * format + 0.1 * call_validity + 0.8 * correct, each in [0, 1]. A call is valid when it fits its schema
*and* the backend answers it (a refusal or a tool failure is not). An answer is correct only when it
matches the expected value *and* a grounding call returned it: a successful call whose arguments solve
the task, as the environment judges (`solves(name, arguments)`). A policy must not learn to
answer from memory after a failed call (the table behind a tool changes in production; memory does not),
nor to echo a guessed answer through a tool (x + 0, x * 1, a km -> km conversion, another city's
matching value): those return the right value without solving anything.
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from tasks.envs.backends import InProcessSession, ToolResult, ToolSession
from tasks.policy.chat import ChatFormat, ParsedTurn

log = logging.getLogger(__name__)

REWARD_WEIGHTS = {"format": 0.1, "call_validity": 0.1, "correct": 0.8}
_JSON_TYPES: dict[str, type | tuple[type, ...]] = {
    "integer": int,
    "number": (int, float),
    "string": str,
    "boolean": bool,
    "object": dict,
    "array": list,
}


@dataclass
class Task:
    """One environment task; JSON-serialisable so it travels to Ray actors and into storage."""

    task_id: str
    env: str
    family: str
    question: str
    tools: list[dict]
    expected: str
    data: dict  # the environment's own: what its backend and verifier need (desk: bindings, strictness, solution)

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: dict) -> Task:
        if "service" in d:  # written before the field's rename (stored rollouts and datasets)
            d = {("data" if k == "service" else k): v for k, v in d.items()}
        return cls(**d)


class ToolError(Exception):
    """Raised by a tool service for a call it refuses; the message is shown to the model."""


class ToolService(Protocol):
    """An in-process tool service: a result string, or ToolError for a refusal. Episodes reach it
    through an InProcessSession (tasks.envs.backends); a bare service handed to Episode is wrapped so,
    and its `solves`, if it has one, grounds the GroundedVerifier's answers."""

    def __call__(self, name: str, arguments: dict) -> str: ...

    def solves(self, name: str, arguments: dict) -> bool: ...


Verifier = Callable[["Episode"], dict]  # an ended episode -> {"reward", "components", "reason", "success", ...}


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


SPLITS = (("eval", 0.25), ("dev", 0.15), ("train", 0.60))  # task content kept apart: the gate's, dev, training


def hash_split(key: str, shares: tuple[tuple[str, float], ...] = SPLITS) -> str:
    """The split `key` falls in: its sha256 (not hash(): that is salted per process) read as a fraction of
    [0, 1), cut by the (name, share) pairs in order. The same key lands in the same split on every machine."""
    u, edge = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64, 0.0
    for name, share in shares:
        edge += share
        if u < edge:
            return name
    return shares[-1][0]


def normalise_answer(text: str) -> str:
    return text.strip().strip(".").strip().lower()


@dataclass
class Episode:
    """The multi-turn loop for one task, driven token by token from outside.

    `messages` is the OpenAI chat conversation (the user's question, then assistant messages with
    `tool_calls` and tool messages with `tool_call_id`); `token_ids` are the ids the policy ran on: the
    template's rendering of the prompt, each turn's ids as generated, each tool message as the template
    renders it (tasks.policy.chat.ChatFormat.extend), ending with the next generation prompt."""

    task: Task
    chat: ChatFormat
    session: ToolSession  # or a bare ToolService, wrapped in __post_init__
    verifier: Verifier | None = None  # None: GroundedVerifier with the service's `solves`, if any
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
    template_mismatches: int = 0  # tool turns where the template would not render the ids the policy generated
    answered: list[tuple[str, dict, str]] = field(default_factory=list)  # (name, arguments, result) of successes
    end_reason: str = ""
    completion_tokens: int = 0
    turn_length: int = 0  # ids of the last assistant turn
    faults: Counter = field(default_factory=Counter)  # tool errors by ToolResult.fault (refused, timeout, ...)

    def __post_init__(self) -> None:
        if not hasattr(self.session, "acall"):  # a bare in-process service (tests, notebooks)
            if self.verifier is None:
                self.verifier = GroundedVerifier(getattr(self.session, "solves", None))
            self.session = InProcessSession(cast("ToolService", self.session), (ToolError,))
        if self.verifier is None:
            self.verifier = GroundedVerifier(None)
        # the environment's own keys (x-evergreen-*) stay out of the prompt
        self.tools = [{"type": "function", "function": t["function"]} for t in self.task.tools]
        self.messages = [{"role": "user", "content": self.task.question}]
        self._append_ids(self.chat.prompt(self.messages, self.tools))

    def _append_ids(self, ids: list[int]) -> None:
        self.token_ids += ids
        self.loss_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)

    def prompt_ids(self) -> list[int]:
        """Token ids the backend continues from: the transcript so far, ending with the generation prompt."""
        return list(self.token_ids)

    def remaining_tokens(self) -> int:
        return min(self.max_tokens_per_turn, self.max_len - len(self.token_ids))

    def add_message(self, message: dict, trained: bool = True) -> None:
        """An expert's assistant turn (a demonstration), as the ids the template gives for it. `trained=False`
        keeps the turn out of the loss: a demonstrated slip the expert then recovers from (tasks.policy.sft)."""
        start = len(self.loss_mask)
        self.add_completion(self.chat.turn_ids(self.messages, self.tools, message))
        if not trained:
            self.loss_mask[start : start + self.turn_length] = [0] * self.turn_length

    def add_completion(self, completion_ids: list[int], logprobs: list[float] | None = None) -> None:
        if self.done:
            raise RuntimeError(f"episode {self.task.task_id} is already done ({self.end_reason})")
        self.token_ids += list(completion_ids)
        self.turn_length = len(completion_ids)
        self.loss_mask += [1] * len(completion_ids)
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(completion_ids)
        self.completion_tokens += len(completion_ids)
        self.turns += 1
        ended = bool(completion_ids) and completion_ids[-1] in self.chat.stop_ids
        body = completion_ids[:-1] if ended else completion_ids
        text = self.chat.decode(body)
        if not ended:
            self.messages.append({"role": "assistant", "content": text})
            return self._finish(f"turn {self.turns} hit the {len(completion_ids)}-token limit without a stop token")
        turn = self.chat.parse(text)
        if not turn.attempted:
            self.messages.append({"role": "assistant", "content": text})
            self.answer = text
            self.n_well_formed_turns += bool(text.strip()) and not any(i in self.chat.special_ids for i in body)
            return self._finish("final answer" if text.strip() else "empty final answer")
        self._run_calls(text, turn)
        if self.turns >= self.max_turns:
            return self._finish(f"no final answer after {self.max_turns} turns")
        if self.remaining_tokens() < 8:
            return self._finish(f"context of {self.max_len} tokens exhausted")

    def _run_calls(self, text: str, turn: ParsedTurn) -> None:
        first_call = self.n_calls + 1  # call ids number the episode's calls: call_1, call_2, ...
        results, well_formed = [], True
        for call in turn.calls:
            self.n_calls += 1
            if call.error:
                well_formed = False
                results.append((call, f"error: {call.error}"))
                continue
            assert call.name is not None and call.arguments is not None  # ParsedCall: set when error is None
            tool = next((t for t in self.task.tools if t["function"]["name"] == call.name), None)
            if tool is None:
                offered = ", ".join(t["function"]["name"] for t in self.task.tools)
                results.append((call, f"error: unknown tool '{call.name}'; offered: {offered}"))
                continue
            problem = check_arguments(tool, call.arguments)
            if problem:
                results.append((call, f"error: {problem}"))
                continue
            answer = self._call(call.name, call.arguments)
            results.append((call, answer.text))
            if answer.is_error:
                self.n_tool_errors += 1
                self.faults[answer.fault or "refused"] += 1
            else:
                self.n_valid_calls += 1
                self.answered.append((call.name, call.arguments, answer.text))
        self.n_well_formed_turns += well_formed
        if well_formed:
            call_ids = [f"call_{first_call + k}" for k in range(len(results))]
            self.messages.append(
                {
                    "role": "assistant",
                    "content": turn.content,
                    "tool_calls": [
                        {"id": i, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                        for i, (c, _) in zip(call_ids, results, strict=True)
                    ],
                }
            )
            answers = [
                {"role": "tool", "tool_call_id": i, "name": c.name, "content": r}
                for i, (c, r) in zip(call_ids, results, strict=True)
            ]
        else:  # the calls could not be read: the raw text, and one error the policy can act on
            self.messages.append({"role": "assistant", "content": text})
            answers = [{"role": "tool", "content": "\n".join(r for _, r in results)}]
        self.messages += answers
        ids, matched = self.chat.extend(self.token_ids, self.messages, self.tools, new=len(answers))
        if not matched:
            self.template_mismatches += 1
            log.debug(
                "episode %s turn %d: the template renders the policy's call differently from the ids it "
                "generated; training keeps the generated ids",
                self.task.task_id,
                self.turns,
            )
        self._append_ids(ids)

    def _call(self, name: str, arguments: dict) -> ToolResult:
        try:
            return self.session.call(name, arguments)
        except Exception as e:  # a backend bug must not end the rollout batch either
            return ToolResult(f"error: tool failed ({type(e).__name__})", is_error=True, fault="tool_failed")

    def _finish(self, reason: str) -> None:
        self.done, self.end_reason = True, reason
        self.session.close()

    def score(self) -> dict[str, Any]:
        """Reward in [0, 1] with its named components and a reason: the environment's verifier's."""
        assert self.verifier is not None  # set in __post_init__
        return self.verifier(self)


@dataclass(frozen=True)
class GroundedVerifier:
    """Reward = 0.1 format + 0.1 call validity + 0.8 correct, where correct needs a grounding call:
    a successful call that returned the expected value and that `solves` the task (the environment
    knows its tasks' solutions; without `solves` nothing grounds and no answer counts as correct)."""

    solves: Callable[[str, dict], bool] | None

    def _grounds(self, episode: Episode, name: str, arguments: dict, result: str) -> bool:
        if self.solves is None or normalise_answer(result) != normalise_answer(episode.task.expected):
            return False
        try:
            return bool(self.solves(name, arguments))
        except Exception:  # a verifier bug grounds nothing and must not end the rollout batch
            return False

    def __call__(self, episode: Episode) -> dict[str, Any]:
        ep = episode
        verdict = grounded_score(
            ep.answer,
            ep.task.expected,
            any(self._grounds(ep, *call) for call in ep.answered),
            fmt=ep.n_well_formed_turns / ep.turns if ep.turns else 0.0,
            validity=ep.n_valid_calls / ep.n_calls if ep.n_calls else 0.0,
            unanswered=ep.end_reason,
        )
        return {**verdict, "turns": ep.turns, "tool_calls": ep.n_calls, "tool_errors": ep.n_tool_errors}


def grounded_score(
    answer: str | None, expected: str | None, grounded: bool, fmt: float, validity: float, unanswered: str
) -> dict[str, Any]:
    """The grounded reward and its reason, from what a verifier saw: the final answer, the expected value,
    whether a successful solving call returned it, and the format and call-validity shares. `unanswered`
    is the reason when there is no answer. The episode's verifier and the resources server's /verify
    (include/tools/desk_resources_server.py) both score with it."""
    matches = answer is not None and expected is not None and normalise_answer(answer) == normalise_answer(expected)
    correct = float(matches and grounded)
    components = {"format": fmt, "call_validity": validity, "correct": correct}
    reward = sum(REWARD_WEIGHTS[k] * v for k, v in components.items())
    if correct:
        reason = "correct"
    elif matches:
        reason = (
            "right value, but no successful call that solves the task returned it "
            "(answered from memory, or echoed through a tool)"
        )
    elif answer is None:
        reason = unanswered
    else:
        reason = f"answer {answer.strip()[:40]!r} != expected {expected!r}"
    return {"reward": round(reward, 6), "components": components, "reason": reason, "success": bool(correct)}
