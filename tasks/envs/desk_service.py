"""desk's tool service: its tables (operations, units, cities) and DeskService, which executes a call.

    from tasks.envs.desk_service import DeskService, convention_of, tool_bindings
    service = DeskService(tool_bindings(toolset["tools"]), convention_of(toolset))
    service("calculate", {"x": "3", "y": "4", "operator": "+"})      # "7"

How strict a toolset's service is about value formats is its *convention*, declared by the toolset document
(`x-evergreen-values`) or, for the shipped toolsets without it, by its version: "any" (v1: an operation as a
word or a symbol, a unit as a name or a symbol, a city key in any case), "symbols" (v2 and v3: "+", "km",
"oslo" only), "names" (v4: "add", "kilometers", "Oslo" only). The schema never says which; the service's
error messages do. That is what makes a change of convention a breaking tool change that reading the
schema cannot fix and trial and error can.
"""

from __future__ import annotations

import math
from typing import Any

from tasks.envs.base import ToolError

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

CONVENTIONS = ("any", "symbols", "names")


def convention_of(toolset: dict, unnumbered: str = "symbols") -> str:
    """The value convention of a toolset's service: its `x-evergreen-values`, else "any" for version 1,
    "symbols" for a later version, and `unnumbered` for a version that is no number (a served or hand-made
    toolset: tasks take it as strict; the example servers, which serve what they are given, as lenient)."""
    declared = toolset.get("x-evergreen-values")
    if declared is not None:
        if declared not in CONVENTIONS:
            raise ValueError(f"toolset x-evergreen-values={declared!r}: use one of {CONVENTIONS}")
        return declared
    version = str(toolset.get("version"))
    if not version.isdigit():
        return unnumbered
    return "symbols" if int(version) >= STRICT_FROM_VERSION else "any"


def task_convention(data: dict, default: str = "any") -> str:
    """The convention a task's data names; a task written before conventions only says `strict` (v2's
    symbols, else v1's any); `default` where it says neither (the resources server's own)."""
    if data.get("convention"):
        return data["convention"]
    if data.get("strict") is not None:
        return "symbols" if data["strict"] else "any"
    return default


def tool_bindings(tools: list[dict]) -> dict:
    """How each offered tool maps onto a desk handler: handler name and the required arguments in role order
    (optional parameters, which a non-breaking change may add, are accepted and ignored)."""
    out = {}
    for t in tools:
        handler = t.get("x-evergreen-handler")
        if handler not in FAMILIES:
            raise ValueError(
                f"tool {t['function']['name']!r} has x-evergreen-handler={handler!r}; use one of {FAMILIES}"
            )
        params = t["function"]["parameters"]
        required = set(params.get("required", params["properties"]))
        out[t["function"]["name"]] = {"handler": handler, "args": [a for a in params["properties"] if a in required]}
    return out


class DeskService:
    """Executes desk tool calls under a value `convention` (module docstring): "any", "symbols" or "names".

    `family` and `solution` (the generator's canonical values) let `solves` tell a call that solves the
    task from one that only returns the right value (an echo such as answer + 0 or km -> km)."""

    def __init__(
        self, bindings: dict, convention: str = "any", family: str | None = None, solution: list | None = None
    ) -> None:
        if convention not in CONVENTIONS:
            raise ValueError(f"convention={convention!r}: use one of {CONVENTIONS}")
        self.bindings, self.convention, self.family, self.solution = bindings, convention, family, solution

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
        by_symbol = {sym: key for key, (sym, _, _) in OPS.items()}
        if self.convention != "names" and op in by_symbol:
            return by_symbol[op]
        word = op if self.convention == "names" else op.lower()
        if self.convention != "symbols" and word in OPS:
            return word
        if self.convention == "any":
            raise ToolError(f"op '{op}' is not supported; use add, sub or mul")
        allowed = " ".join(by_symbol if self.convention == "symbols" else OPS)
        raise ToolError(f"operator '{op}' is not supported; use one of {allowed}")

    def _unit(self, u: str) -> str:
        u = str(u).strip()
        by_name = {name: sym for sym, (name, _, _) in UNITS.items()}
        if self.convention != "names" and u in UNITS:
            return u
        if self.convention != "symbols" and (u if self.convention == "names" else u.lower()) in by_name:
            return by_name[u if self.convention == "names" else u.lower()]
        hint = {
            "any": "",
            "symbols": "; units are symbols such as km, kg, min",
            "names": "; units are names such as kilometers, kilograms, minutes",
        }[self.convention]
        raise ToolError(f"unknown unit '{u}'{hint}")

    def _city(self, city: Any) -> str:
        given = str(city).strip()
        key = (
            given.lower()
            if self.convention == "any" or (self.convention == "names" and given == given.title())
            else given
        )
        if key not in CITIES or (self.convention == "names" and given != given.title()):
            hint = ""
            if self.convention == "symbols" and given.lower() in CITIES:
                hint = f"; keys are lowercase, e.g. '{given.lower()}'"
            elif self.convention == "names" and given.lower() in CITIES:
                hint = f"; names are capitalised, e.g. '{given.title()}'"
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
