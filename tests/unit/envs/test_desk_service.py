"""desk's value conventions (tasks/envs/desk_service.py) and the toolsets the timeline ships: v3 a
non-breaking change of v2, v4 a breaking one the schema does not reveal."""

from __future__ import annotations

import random

import pytest

from tasks.envs.base import ToolError
from tasks.envs.desk import demonstration, make_service, toolset_tasks
from tasks.envs.desk_service import DeskService, convention_of, tool_bindings
from tasks.envs.toolset import load_toolset
from tasks.signals.tooldiff import diff_toolsets


def _service(version: str, family: str) -> tuple[DeskService, str, list[str]]:
    toolset = load_toolset(version, "desk")
    tool = next(t for t in toolset["tools"] if t["x-evergreen-handler"] == family)
    bindings = tool_bindings([tool])
    name = tool["function"]["name"]
    return DeskService(bindings, convention_of(toolset)), name, bindings[name]["args"]


@pytest.mark.parametrize(
    ("version", "accepted", "refused"),
    [
        ("1", ["+", "add", "ADD"], ["plus"]),
        ("2", ["+"], ["add"]),
        ("3", ["+"], ["add"]),
        ("4", ["add"], ["+", "ADD"]),
    ],
)
def test_each_version_takes_its_operators(version, accepted, refused):
    service, name, args = _service(version, "calc")
    for op in accepted:
        assert service(name, dict(zip(args, ["3", "4", op], strict=True))) in ("7", "12")
    for op in refused:
        with pytest.raises(ToolError, match="not supported"):
            service(name, dict(zip(args, ["3", "4", op], strict=True)))


def test_names_convention_wants_unit_names_and_capitalised_cities_and_says_so():
    convert, name, args = _service("4", "convert")
    assert convert(name, dict(zip(args, [3, "kilometers", "meters"], strict=True))) == "3000"
    with pytest.raises(ToolError, match="units are names such as kilometers"):
        convert(name, dict(zip(args, [3, "km", "m"], strict=True)))
    lookup, name, args = _service("4", "lookup")
    assert lookup(name, dict(zip(args, ["Oslo", "country"], strict=True))) == "Norway"
    with pytest.raises(ToolError, match="names are capitalised, e.g. 'Oslo'"):
        lookup(name, dict(zip(args, ["oslo", "country"], strict=True)))


def test_v3_is_a_non_breaking_change_whose_optional_parameter_is_accepted_and_ignored():
    assert not diff_toolsets(load_toolset("2", "desk"), load_toolset("3", "desk")).breaking
    service, name, args = _service("3", "convert")
    assert "precision" not in args  # bindings hold the required roles only
    assert service(name, dict(zip(args, [3, "km", "m"], strict=True)) | {"precision": 2}) == "3000"


def test_v4_breaks_v2_and_v3_and_a_v2_habit_fails_it():
    for old in ("2", "3"):
        assert diff_toolsets(load_toolset(old, "desk"), load_toolset("4", "desk")).breaking
    # v1's mixed habits (a lenient demonstration) solve some v4 tasks, not all; v4's own demonstrations all
    tasks = toolset_tasks("4", 30, 0)
    assert {t.data["convention"] for t in tasks} == {"names"}
    solved_by_habit = 0
    for task in tasks:
        lenient = type(task).from_dict({**task.to_dict(), "data": {**task.data, "convention": "any"}})
        call, _ = demonstration(lenient, random.Random(3))
        own = demonstration(task, random.Random(3))[0]["tool_calls"][0]["function"]
        make_service(task)(own["name"], own["arguments"])  # raises if v4's demonstration were refused
        fn = call["tool_calls"][0]["function"]
        try:
            make_service(task)(fn["name"], fn["arguments"])
            solved_by_habit += 1
        except ToolError:
            pass
    assert 0 < solved_by_habit < len(tasks)


def test_convention_of_reads_the_declaration_then_the_version():
    assert convention_of({"version": "1"}) == "any"
    assert convention_of({"version": "7"}) == "symbols"
    assert convention_of({"version": "served"}) == "symbols"
    assert convention_of({"version": "served"}, unnumbered="any") == "any"
    assert convention_of({"version": "1", "x-evergreen-values": "names"}) == "names"
    with pytest.raises(ValueError, match="use one of"):
        convention_of({"version": "1", "x-evergreen-values": "shouting"})
