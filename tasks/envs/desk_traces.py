"""Reading a desk question back from a production trace: the user's text -> (family, canonical values).

    from tasks.envs.desk_traces import parse_question
    parse_question("What is 12 plus 30?")             # ("calc", [12, 30, "add"])
    parse_question("How many m is 3 km?")             # ("convert", [3, "km", "m"])
    parse_question("Oslo: population?")               # ("lookup", ["oslo", "population"])
    parse_question("Tell me a joke.")                 # None

The patterns cover every phrasing desk's generator uses (tasks/envs/desk.py `_question_and_values`),
with the slack real users add: any case, extra spaces, missing final punctuation, an operator symbol
for its word. Values come out in the form the generator's `solution` has (op key, unit symbol,
lowercase city key, int where the number is whole), so desk.content_key treats a production question
and a generated one alike. desk.task_from_trace builds the task from them; the answer is recomputed by
DeskService, never read from the trace.
"""

from __future__ import annotations

import re

from tasks.envs.desk import CITIES, FIELDS, OPS, UNITS, DeskService, ToolError

_OP_WORDS = {word: key for key, (_, word, _) in OPS.items()} | {sym: key for key, (sym, _, _) in OPS.items()}
_UNIT_NAMES = {name: sym for sym, (name, _, _) in UNITS.items()} | {sym: sym for sym in UNITS}
_INT, _NUM, _WORD = r"(-?\d+)", r"(-?\d+(?:\.\d+)?)", r"([a-z]+)"
_OP = r"\s*(plus|minus|times|[-+*])\s*"
_END = r"\s*[.?!]?"

# (family, pattern, order of the captured groups in the solution's roles); matched on the lowercased,
# whitespace-normalised question, in full
_PATTERNS = [
    ("calc", rf"(?:what is |compute )?{_INT}{_OP}{_INT}(?:\s*=\s*\??)?{_END}", (0, 2, 1)),
    ("convert", rf"convert {_NUM} {_WORD} (?:to|in|into) {_WORD}{_END}", (0, 1, 2)),
    ("convert", rf"how many {_WORD} (?:is|are|in) {_NUM} {_WORD}{_END}", (1, 2, 0)),
    ("lookup", rf"what is the {_WORD} of ([a-z][a-z .'-]*?){_END}", (1, 0)),
    ("lookup", rf"([a-z][a-z .'-]*?)\s*:\s*{_WORD}{_END}", (0, 1)),
]
_COMPILED = [(family, re.compile(pattern), order) for family, pattern, order in _PATTERNS]


def _canonical(family: str, raw: list[str]) -> list | None:
    """Raw captures in role order -> the generator's canonical values; None for anything desk lacks."""
    try:
        if family == "calc":
            return [DeskService._int(raw[0]), DeskService._int(raw[1]), _OP_WORDS[raw[2]]]
        if family == "convert":
            src, dst = _UNIT_NAMES[raw[1]], _UNIT_NAMES[raw[2]]
            # another dimension cannot be converted, and km -> km has its answer in the question
            if UNITS[src][1] != UNITS[dst][1] or src == dst:
                return None
            return [DeskService._number(raw[0]), src, dst]
        city, field = raw[0].strip(), raw[1]
        return [city, field] if city in CITIES and field in FIELDS else None
    except (KeyError, ToolError):
        return None


def parse_question(text: str) -> tuple[str, list] | None:
    """(family, canonical values in role order) of a desk question, or None when it is not one."""
    q = " ".join(str(text).lower().split())
    for family, pattern, order in _COMPILED:
        m = pattern.fullmatch(q)
        if m:
            values = _canonical(family, [m.groups()[i] for i in order])
            if values is not None:
                return family, values
    return None


def first_user_text(trace: dict) -> str | None:
    """The text of the trace's first user message: the question the agent was asked."""
    for m in trace.get("messages") or []:
        if isinstance(m, dict) and m.get("role") == "user":
            content = m.get("content")
            return content if isinstance(content, str) and content.strip() else None
    return None
