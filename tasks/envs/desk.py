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
and error while v1 (which accepts both) is unharmed. Version 3 is a non-breaking change of v2 (an
optional parameter); version 4 breaks again the other way (words, unit names,
capitalised city names: tasks/envs/desk_service.py), which a model that learned v2's symbols fails
almost entirely. The month-long timeline (tasks/timeline) ships them in that order.
"""

from __future__ import annotations

import random
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from tasks.envs.backends import InProcessSession
from tasks.envs.base import SPLITS, GroundedVerifier, Task, ToolError, hash_split
from tasks.envs.desk_service import (  # noqa: F401 (re-exported: the tables and the service are desk's)
    CITIES,
    COMMUTATIVE,
    CONVERSIONS,
    FAMILIES,
    FIELDS,
    OPS,
    STRICT_FROM_VERSION,
    UNITS,
    DeskService,
    convention_of,
    task_convention,
    tool_bindings,
)
from tasks.envs.toolset import load_toolset

if TYPE_CHECKING:
    from tasks.envs import Environment
    from tasks.envs.base import Episode

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


def make_service(task: Task) -> DeskService:
    return DeskService(
        task.data["bindings"], task_convention(task.data), family=task.family, solution=task.data.get("solution")
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
        convention = convention_of(toolset) if toolset is not None else "any"
        out.append(
            Task(
                task_id=f"desk-r{version}-s{seed}-{i}" if split is None else f"desk-r{version}-{split}-s{seed}-{i}",
                env="desk",
                family=family,
                question=question,
                tools=tools,
                expected=sol["expected"],
                data={
                    "strict": convention != "any",
                    "convention": convention,
                    "bindings": tool_bindings(tools),
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
    convention = convention_of(toolset)  # a version that is no number (a served toolset) is strict
    return Task(
        task_id=f"desk-prod-{trace_id}",
        env="desk",
        family=family,
        question=question.strip(),
        tools=tools,
        expected=expected,
        data={
            "strict": convention != "any",
            "convention": convention,
            "bindings": tool_bindings(tools),
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
    any case), as in real v1 traffic where both worked; a strict toolset's are the ones its convention takes.
    """
    tool = next(t for t in task.tools if t["x-evergreen-handler"] == task.family)
    props = tool["function"]["parameters"]["properties"]
    roles = task.data["bindings"][tool["function"]["name"]]["args"]  # the required ones: an optional one is left out
    values = list(task.data["solution"])
    # a lenient toolset's demonstrations mix the formats it accepts; a strict one's use its convention
    convention = task_convention(task.data)

    def form(lenient: list[str], symbol: str, name: str) -> str:
        return {"symbols": symbol, "names": name}.get(convention) or rng.choice(lenient)

    if task.family == "calc":
        key, sym = values[2], OPS[values[2]][0]
        values[2] = form([key, sym], sym, key)
    elif task.family == "convert":
        values[1:] = [form([u, UNITS[u][0]], u, UNITS[u][0]) for u in values[1:]]
    else:
        city = values[0]
        values[0] = form([city, city.title()], city, city.title())
    args = {}
    for name, v in zip(roles, values, strict=True):
        args[name] = str(v) if props[name]["type"] == "string" else v
    name = tool["function"]["name"]
    result = DeskService(task.data["bindings"], "any")(name, args)
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
