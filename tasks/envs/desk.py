"""The embedded default environment: a desk of deterministic tools (arithmetic, unit conversion, city facts).

Tasks are generated deterministically from a seed, either with the tools of a toolset (a version of the
tool registry, read by tasks.envs.toolset.load_toolset; desk ships `include/tools/registry_v*.json`) or,
for the bootstrap, with random tool and argument names, random argument types and shuffled tool order,
so that the policy learns to *read* the schema in its prompt.

The tool service behind toolset version 1 is lenient about value formats: it accepts an operation as a
word or a symbol ("add" or "+"), a unit as a name or a symbol ("kilometers" or "km"), a city key in
any case. Version 2 renames tools and arguments, retypes the calculator's operands to strings (all
visible in the schema) and, like many real API upgrades, becomes strict about canonical codes: symbols
only, lowercase keys. The schema does not say so; the error messages do. A champion that learned both
formats from v1 traffic therefore loses about half its v2 successes, and RL can win them back by trial
and error while v1 (which accepts both) is unharmed.
"""

from __future__ import annotations

import math
import random
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasks.envs.backends import InProcessSession
from tasks.envs.base import SPLITS, GroundedVerifier, Task, ToolError, hash_split
from tasks.envs.toolset import load_toolset

if TYPE_CHECKING:
    from tasks.envs import Environment
    from tasks.envs.base import Episode

FAMILIES = ("calc", "convert", "lookup")
OPS = {
    "add": ("+", "plus", lambda a, b: a + b),
    "sub": ("-", "minus", lambda a, b: a - b),
    "mul": ("*", "times", lambda a, b: a * b),
}
COMMUTATIVE = ("add", "mul")
UNITS = {  # symbol: (name, dimension, factor to the dimension's base unit)
    "km": ("kilometers", "length", 1000),
    "m": ("meters", "length", 1),
    "cm": ("centimeters", "length", 0.01),
    "kg": ("kilograms", "mass", 1000),
    "g": ("grams", "mass", 1),
    "h": ("hours", "time", 3600),
    "min": ("minutes", "time", 60),
    "s": ("seconds", "time", 1),
    "l": ("liters", "volume", 1000),
    "ml": ("milliliters", "volume", 1),
}
CONVERSIONS = [("km", "m"), ("m", "cm"), ("kg", "g"), ("h", "min"), ("min", "s"), ("l", "ml"), ("h", "s"), ("km", "cm")]
CITIES = {
    "oslo": (709037, "Norway", 23),
    "lima": (10092000, "Peru", 154),
    "rome": (2761632, "Italy", 21),
    "cairo": (10107125, "Egypt", 23),
    "quito": (2800388, "Ecuador", 2850),
    "perth": (2192229, "Australia", 31),
    "dakar": (1438725, "Senegal", 22),
    "hanoi": (8053663, "Vietnam", 19),
    "bern": (134794, "Switzerland", 540),
    "lagos": (15388000, "Nigeria", 41),
    "kyoto": (1463723, "Japan", 50),
    "denver": (715522, "USA", 1609),
}
FIELDS = ("population", "country", "elevation")
STRICT_FROM_VERSION = 2
# Only 36 (city, field) pairs exist, so a split by plain hash may leave a city or a field without any
# training pair (a policy could never learn it) or a split without lookups. This salt is the first whose
# lookup split has every city and every field in train and every field in eval and in dev, at the nominal
# shares (9 eval, 5 dev, 22 train); tests/unit/envs/test_split.py checks it whenever the tables change.
SPLIT_SALT = 173
TOOLSET_DIR = Path(__file__).resolve().parents[2] / "include" / "tools"  # the shipped toolsets, registry_v{N}.json

_NAME_WORDS = [
    "get",
    "run",
    "do",
    "calc",
    "compute",
    "convert",
    "lookup",
    "find",
    "query",
    "tool",
    "fn",
    "api",
    "read",
    "eval",
    "math",
    "unit",
    "city",
    "data",
    "fetch",
    "apply",
    "info",
    "table",
    "op",
    "util",
]
_ARG_WORDS = [
    "a",
    "b",
    "x",
    "y",
    "n",
    "m",
    "lhs",
    "rhs",
    "left",
    "right",
    "first",
    "second",
    "value",
    "qty",
    "amount",
    "num",
    "src",
    "dst",
    "source",
    "target",
    "from_u",
    "to_u",
    "unit",
    "key",
    "name",
    "city",
    "field",
    "attr",
    "kind",
    "what",
    "op",
    "mode",
    "action",
    "item",
    "id",
    "p",
    "q",
    "arg",
]
_DESCRIPTIONS = {
    "calc": ["Arithmetic", "Math", "Calculator"],
    "convert": ["Unit conversion", "Units", "Convert units"],
    "lookup": ["City facts", "City lookup", "City table"],
}


def _tool_bindings(tools: list[dict]) -> dict:
    """How each offered tool maps onto a desk handler: handler name and argument names in role order."""
    out = {}
    for t in tools:
        handler = t.get("x-evergreen-handler")
        if handler not in FAMILIES:
            raise ValueError(
                f"tool {t['function']['name']!r} has x-evergreen-handler={handler!r}; use one of {FAMILIES}"
            )
        out[t["function"]["name"]] = {"handler": handler, "args": list(t["function"]["parameters"]["properties"])}
    return out


class DeskService:
    """Executes desk tool calls; `strict` is the toolset-v2 behaviour (canonical codes only).

    `family` and `solution` (the generator's canonical values) let `solves` tell a call that solves the
    task from one that only returns the right value (an echo such as answer + 0 or km -> km)."""

    def __init__(self, bindings: dict, strict: bool, family: str | None = None, solution: list | None = None):
        self.bindings, self.strict, self.family, self.solution = bindings, strict, family, solution

    def __call__(self, name: str, arguments: dict) -> str:
        return getattr(self, "_" + self.bindings[name]["handler"])(*self.canonical(name, arguments))

    def canonical(self, name: str, arguments: dict) -> list:
        """The call's values in role order as the service reads them (op key, unit symbol, city key,
        numbers); raises ToolError for a value it refuses."""
        binding = self.bindings[name]
        values = [arguments[a] for a in binding["args"]]
        if binding["handler"] == "calc":
            op = self._op(values[2])
            return [self._int(values[0]), self._int(values[1]), op]
        if binding["handler"] == "convert":
            s, d = self._unit(values[1]), self._unit(values[2])
            if UNITS[s][1] != UNITS[d][1]:
                raise ToolError(f"cannot convert {UNITS[s][1]} ({s}) to {UNITS[d][1]} ({d})")
            return [self._number(values[0]), s, d]
        return [self._city(values[0]), self._field(values[1])]

    def solves(self, name: str, arguments: dict) -> bool:
        """Whether the call's canonical values are the task's solution (add and mul in either order)."""
        if self.solution is None or self.bindings.get(name, {}).get("handler") != self.family:
            return False
        try:
            got = self.canonical(name, arguments)
        except (ToolError, KeyError):
            return False
        want = list(self.solution)
        return got == want or (self.family == "calc" and want[2] in COMMUTATIVE and got == [want[1], want[0], want[2]])

    @staticmethod
    def _int(v: Any) -> int:
        try:
            return int(str(v).strip())
        except ValueError:
            raise ToolError(f"'{v}' is not an integer") from None

    @staticmethod
    def _number(v: Any) -> int | float:
        try:
            x = float(v)
        except (TypeError, ValueError):
            raise ToolError(f"'{v}' is not a number") from None
        except OverflowError:  # an integer of hundreds of digits
            x = math.inf
        if not math.isfinite(x):
            raise ToolError(f"'{str(v)[:20]}' is not a finite number")
        return int(x) if x.is_integer() and abs(x) < 2**53 else x

    def _op(self, op: Any) -> str:
        op = str(op).strip()
        key = next((k for k, (sym, _, _) in OPS.items() if op == sym or (not self.strict and op.lower() == k)), None)
        if key is None:
            allowed = " ".join(s for s, _, _ in OPS.values())
            raise ToolError(
                f"operator '{op}' is not supported; use one of {allowed}"
                if self.strict
                else f"op '{op}' is not supported; use add, sub or mul"
            )
        return key

    def _unit(self, u: str) -> str:
        u = str(u).strip()
        if u in UNITS:
            return u
        by_name = {name: sym for sym, (name, _, _) in UNITS.items()}
        if not self.strict and u.lower() in by_name:
            return by_name[u.lower()]
        raise ToolError(
            f"unknown unit '{u}'; units are symbols such as km, kg, min" if self.strict else f"unknown unit '{u}'"
        )

    def _city(self, city: Any) -> str:
        key = str(city).strip()
        if not self.strict:
            key = key.lower()
        if key not in CITIES:
            hint = f"; keys are lowercase, e.g. '{key.lower()}'" if self.strict and key.lower() in CITIES else ""
            raise ToolError(f"no city '{city}'{hint}")
        return key

    @staticmethod
    def _field(fieldname: Any) -> str:
        if fieldname not in FIELDS:
            raise ToolError(f"unknown field '{fieldname}'; fields: {', '.join(FIELDS)}")
        return fieldname

    # handlers take canonical values
    @staticmethod
    def _calc(a: int, b: int, op: str) -> str:
        return str(OPS[op][2](a, b))

    @staticmethod
    def _convert(value: int | float, s: str, d: str) -> str:
        out = value * UNITS[s][2] / UNITS[d][2]
        if not math.isfinite(out):
            raise ToolError(f"{value} {s} in {d} is out of range")
        return str(int(round(out))) if abs(out - round(out)) < 1e-9 else f"{out:g}"

    @staticmethod
    def _lookup(city: str, fieldname: str) -> str:
        return str(CITIES[city][FIELDS.index(fieldname)])


def make_service(task: Task) -> DeskService:
    return DeskService(
        task.data["bindings"], strict=task.data["strict"], family=task.family, solution=task.data.get("solution")
    )


def open_session(task: Task) -> InProcessSession:
    """desk's tools run in process (include/tools/ also serves them over MCP and HTTP)."""
    return InProcessSession(make_service(task), (ToolError,))


def verify(episode: Episode) -> dict:
    """The grounded reward (tasks.envs.base.GroundedVerifier) with desk's judgement of a solving call."""
    return GroundedVerifier(make_service(episode.task).solves)(episode)


def environment() -> Environment:
    """The entry point (pyproject.toml, group evergreen.environments): desk as an Environment."""
    from tasks.envs import Environment

    return Environment(
        "desk", generate_tasks, open_session, verify, demonstration, TOOLSET_DIR, task_from_trace=task_from_trace
    )


# ---------------------------------------------------------------- splits


def content_key(family: str, values: list) -> tuple:
    """What a task asks, independent of wording and tools; a + b and b + a are one content."""
    if family == "calc" and values[2] in COMMUTATIVE:
        return (family, *sorted(values[:2]), values[2])
    return (family, *values)


def split_of(family: str, values: list) -> str:
    """The split a content belongs to: a stable hash (sha256, not hash(): that is salted per process)."""
    return hash_split(f"{SPLIT_SALT}|{'|'.join(map(str, content_key(family, values)))}")


def task_content(task: Task) -> tuple:
    return content_key(task.family, task.data["solution"])


# ---------------------------------------------------------------- task generation


def _question_and_values(family: str, rng: random.Random) -> tuple[str, dict]:
    """A question, its canonical argument values (in role order) and the expected answer."""
    if family == "calc":
        key = rng.choice(list(OPS))
        a, b = (rng.randint(2, 99), rng.randint(2, 99)) if key != "mul" else (rng.randint(2, 40), rng.randint(2, 40))
        word = OPS[key][1]
        q = rng.choice([f"What is {a} {word} {b}?", f"Compute {a} {word} {b}.", f"{a} {word} {b} = ?"])
        return q, {"values": [a, b, key], "expected": str(OPS[key][2](a, b))}
    if family == "convert":
        src, dst = rng.choice(CONVERSIONS)
        v = rng.randint(2, 60)
        sname, dname = (UNITS[src][0], UNITS[dst][0]) if rng.random() < 0.5 else (src, dst)
        q = rng.choice([f"Convert {v} {sname} to {dname}.", f"How many {dname} is {v} {sname}?"])
        expected = DeskService._convert(v, src, dst)
        return q, {"values": [v, src, dst], "expected": expected}
    city = rng.choice(list(CITIES))
    fieldname = rng.choice(FIELDS)
    q = rng.choice([f"What is the {fieldname} of {city.title()}?", f"{city.title()}: {fieldname}?"])
    return q, {"values": [city, fieldname], "expected": str(CITIES[city][FIELDS.index(fieldname)])}


def _random_name(rng: random.Random, words: list[str], max_len: int) -> str:
    """A word-like name or, mostly, random letters: a name the model cannot guess must be copied,
    which is what teaches it to read the schema instead of recalling likely names."""
    if rng.random() < 0.3:
        return "_".join(rng.sample(words, rng.choice([1, 2])))
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz_") for _ in range(rng.randint(2, max_len))).strip("_") or "x"


def _random_tools(rng: random.Random) -> list[dict]:
    """Tools with random names, argument names and operand types (bootstrap only).

    Tools keep the toolsets' family order (arithmetic, units, city facts), as the shipped toolsets do.
    """
    tools, used = [], set()
    for family in FAMILIES:
        while (name := _random_name(rng, _NAME_WORDS, 12)) in used:
            pass
        used.add(name)
        n_args = 3 if family in ("calc", "convert") else 2
        args: list[str] = []
        while len(args) < n_args:
            if (a := _random_name(rng, _ARG_WORDS, 7)) not in args:
                args.append(a)
        if family == "calc":
            types = [rng.choice(["integer", "string"])] * 2 + ["string"]
        elif family == "convert":
            types = [rng.choice(["number", "integer", "string"]), "string", "string"]
        else:
            types = ["string", "string"]
        props = {a: {"type": t} for a, t in zip(args, types, strict=True)}
        tools.append(
            {
                "type": "function",
                "x-evergreen-handler": family,
                "function": {
                    "name": name,
                    "description": rng.choice(_DESCRIPTIONS[family]) + ".",
                    "parameters": {"type": "object", "properties": props, "required": args},
                },
            }
        )
    return tools


def generate_tasks(
    n: int,
    seed: int,
    toolset: dict | None = None,
    families: tuple[str, ...] = FAMILIES,
    offer: str = "routed",
    split: str | None = None,
) -> list[Task]:
    """`n` tasks, deterministic in `seed`. With `toolset` (load_toolset's) the tools are its; without, random.

    split ("train", "dev", "eval") redraws each task until its content is in that split; None draws any
    content (production traffic, which knows no splits).

    offer="routed" (default) offers the tools of the task's workload only, as a tool router in front of
    the agent does; offer="all" offers every tool of the toolset. The tiny default model reads one
    schema reliably within a bootstrap budget of minutes; choosing among several is left to bigger ones.
    """
    if offer not in ("routed", "all"):
        raise ValueError(f"offer={offer!r}: use 'routed' (the workload's tools) or 'all'")
    if split is not None and split not in dict(SPLITS):
        raise ValueError(f"split={split!r}: use one of {[name for name, _ in SPLITS]} or None")
    rng = random.Random(seed)
    version = toolset["version"] if toolset else "random"
    out = []
    for i in range(n):
        family = families[i % len(families)]
        question, sol = _question_and_values(family, rng)
        while split is not None and split_of(family, sol["values"]) != split:
            question, sol = _question_and_values(family, rng)
        tools = toolset["tools"] if toolset else _random_tools(rng)
        if offer == "routed":
            tools = [t for t in tools if t.get("x-evergreen-handler") == family]
        strict = toolset is not None and int(toolset["version"]) >= STRICT_FROM_VERSION
        out.append(
            Task(
                task_id=f"desk-r{version}-s{seed}-{i}" if split is None else f"desk-r{version}-{split}-s{seed}-{i}",
                env="desk",
                family=family,
                question=question,
                tools=tools,
                expected=sol["expected"],
                data={
                    "strict": strict,
                    "bindings": _tool_bindings(tools),
                    "solution": sol["values"],
                    "content": list(content_key(family, sol["values"])),
                },
            )
        )
    return out


def task_from_trace(trace: dict, toolset: dict) -> Task | None:
    """A production trace's question as a desk task on `toolset`'s tools (routed to the family's tool, as
    generate_tasks offers them), or None where desk cannot verify it: a first user message that is no desk
    question (tasks.envs.desk_traces.parse_question), or a toolset without the family's tool.

    The solution and the expected answer are recomputed from the question by DeskService's handlers: the
    trace's own answer may be wrong (it came from the policy being improved). data["content"] is
    content_key, which tasks.signals.production_tasks deduplicates and splits by.
    """
    from tasks.envs.desk_traces import first_user_text, parse_question  # it imports this module's tables

    question, trace_id = first_user_text(trace), trace.get("trace_id")
    parsed = parse_question(question) if question and trace_id else None
    if parsed is None:
        return None
    family, values = parsed
    assert question is not None  # parsed from it
    tools = [t for t in toolset["tools"] if t.get("x-evergreen-handler") == family]
    if not tools:
        return None
    try:
        expected = getattr(DeskService, "_" + family)(*values)
    except ToolError:  # e.g. a conversion out of float range
        return None
    version = str(toolset.get("version"))
    # a version that is no number (a served or hand-made toolset) is newer than the lenient v1: strict
    strict = not version.isdigit() or int(version) >= STRICT_FROM_VERSION
    return Task(
        task_id=f"desk-prod-{trace_id}",
        env="desk",
        family=family,
        question=question.strip(),
        tools=tools,
        expected=expected,
        data={
            "strict": strict,
            "bindings": _tool_bindings(tools),
            "solution": values,
            "content": list(content_key(family, values)),
            "trace_id": trace_id,
            "held_out": split_of(family, values) != "train",
        },
    )


def demonstration(task: Task, rng: random.Random) -> list[dict]:
    """An expert transcript for SFT: the assistant turns as OpenAI messages (a call, then the answer),
    which the model's chat template renders.

    Formats that the lenient v1 service accepts are chosen at random (word or symbol, name or symbol,
    any case), as in real v1 traffic where both worked.
    """
    tool = next(t for t in task.tools if t["x-evergreen-handler"] == task.family)
    props = tool["function"]["parameters"]["properties"]
    values = list(task.data["solution"])
    if task.family == "calc":
        values[2] = rng.choice([values[2], OPS[values[2]][0]])
    elif task.family == "convert":
        values[1:] = [rng.choice([u, UNITS[u][0]]) for u in values[1:]]
    else:
        values[0] = rng.choice([values[0], values[0].title()])
    args = {}
    for (name, spec), v in zip(props.items(), values, strict=True):
        args[name] = str(v) if spec["type"] == "string" else v
    name = tool["function"]["name"]
    result = DeskService(task.data["bindings"], strict=False)(name, args)
    call = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": name, "arguments": args}}],
    }
    return [call, {"role": "assistant", "content": result}]


@cache
def toolset_tasks(version: str, n: int, seed: int) -> tuple[Task, ...]:
    """`n` tasks (seed `seed`) with the tools of desk's shipped toolset `version`; cached."""
    return tuple(generate_tasks(n, seed, load_toolset(version, "desk")))
