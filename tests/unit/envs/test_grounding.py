"""Grounded rewards (tasks/envs/base.py Episode.score, tasks/envs/desk.py DeskService.solves).

A right answer counts only when a successful call that *solves the task* returned it; a call the service
refuses (or fails on) is not a valid call."""

import json

import pytest

from tasks.envs import new_episode
from tasks.envs.base import Episode
from tasks.envs.desk import make_service, toolset_tasks
from tasks.policy.tokenizer import default_chat

TOK = default_chat()
V1 = toolset_tasks("1", 9, 5)
V2 = toolset_tasks("2", 9, 5)
# V1[0] 18 times 24 -> 432   V1[1] 55 km to m -> 55000   V1[3] 49 plus 62 -> 111   V1[5] elevation of Oslo -> 23
# V1[6] 37 minus 25 -> 12    V2[0] as V1[0], v2 tools    V2[1] as V1[1]            V2[5] as V1[5]


def call(tool_name, /, **arguments):
    return (
        "<tool_call>" + json.dumps({"name": tool_name, "arguments": arguments}, separators=(",", ":")) + "</tool_call>"
    )


def play(task, *texts, service=None):
    ep = Episode(task, TOK, service) if service else new_episode(task, TOK)
    for text in texts:
        ep.add_completion(TOK.encode(text) + [TOK.eos_id])
    return ep


def test_the_fixture_tasks_are_what_the_tests_assume():
    assert [(t.expected, t.data["solution"]) for t in (V1[0], V1[1], V1[3], V1[5], V1[6])] == [
        ("432", [18, 24, "mul"]),
        ("55000", [55, "km", "m"]),
        ("111", [49, 62, "add"]),
        ("23", ["oslo", "elevation"]),
        ("12", [37, 25, "sub"]),
    ]
    assert V2[0].data["solution"] == V1[0].data["solution"] and V2[5].expected == "23"


@pytest.mark.parametrize(
    "task, echo",
    [
        (V1[0], call("calculator", a=432, b=0, op="+")),  # answer + 0
        (V1[0], call("calculator", a=0, b=432, op="add")),  # 0 + answer
        (V1[0], call("calculator", a=432, b=1, op="*")),  # answer * 1
        (V1[0], call("calculator", a=432, b=0, op="-")),  # answer - 0
        (V2[0], call("calculate", x="432", y="1", operator="*")),  # v2 tools, answer * 1
        (V1[3], call("calculator", a=111, b=0, op="add")),
        (V1[1], call("convert", value=55000, from_unit="m", to_unit="m")),  # same-unit conversion
        (V1[1], call("convert", value=55000, from_unit="meters", to_unit="m")),
        (V2[1], call("convert_units", quantity=55000, source="m", target="m")),
        (V1[5], call("lookup", city="cairo", field="elevation")),  # Cairo's elevation is Oslo's: 23
        (V2[5], call("city_facts", name="cairo", attribute="elevation")),
    ],
    ids=[
        "x+0",
        "0+x",
        "x*1",
        "x-0",
        "v2-x*1",
        "add-x+0",
        "m-to-m",
        "meters-to-m",
        "v2-m-to-m",
        "other-city",
        "v2-other-city",
    ],
)
def test_an_echo_of_the_answer_through_a_tool_is_not_grounding(task, echo):
    ep = play(task, echo)
    assert ep.messages[-1]["content"] == task.expected  # the tool did return the value
    ep.add_completion(TOK.encode(task.expected) + [TOK.eos_id])
    s = ep.score()
    assert not s["success"] and s["components"] == {"format": 1.0, "call_validity": 1.0, "correct": 0.0}
    assert s["reward"] == pytest.approx(0.2) and "echoed" in s["reason"]


@pytest.mark.parametrize(
    "task, text",
    [
        (V1[0], call("calculator", a=18, b=24, op="*")),
        (V1[0], call("calculator", a=24, b=18, op="mul")),  # mul is commutative
        (V1[3], call("calculator", a=62, b=49, op="+")),  # so is add
        (V2[0], call("calculate", x="24", y=" 18", operator="*")),
        (V1[1], call("convert", value=55, from_unit="kilometers", to_unit="meters")),
        (V1[1], call("convert", value=55.0, from_unit="km", to_unit="m")),
        (V1[5], call("lookup", city=" OSLO", field="elevation")),
        (V2[5], call("city_facts", name="oslo", attribute="elevation")),
    ],
    ids=["mul", "mul-swapped", "add-swapped", "v2-mul-swapped", "unit-names", "float-value", "city-case", "v2-lookup"],
)
def test_a_solving_call_in_any_accepted_form_is_grounded(task, text):
    s = play(task, text, task.expected).score()
    assert s["success"] and s["reward"] == 1.0 and s["reason"] == "correct"


def test_one_solving_call_among_echoes_grounds_the_answer():
    ep = play(V1[0], call("calculator", a=432, b=0, op="+") + call("calculator", a=18, b=24, op="*"), "432")
    assert ep.score()["success"]


def test_solves_reads_canonical_values_in_role_order():
    calc, sub = make_service(V1[0]), make_service(V1[6])
    assert calc.canonical("calculator", {"a": "18", "b": 24, "op": "MUL"}) == [18, 24, "mul"]
    assert calc.solves("calculator", {"a": 24, "b": 18, "op": "*"})
    assert sub.solves("calculator", {"a": 37, "b": 25, "op": "minus"}) is False  # v1 takes "sub" or "-" only
    assert sub.solves("calculator", {"a": 37, "b": 25, "op": "sub"})
    assert not sub.solves("calculator", {"a": 25, "b": 37, "op": "-"})  # sub is not commutative
    conv = make_service(V1[1])
    assert conv.canonical("convert", {"value": "55", "from_unit": "kilometers", "to_unit": "m"}) == [55, "km", "m"]
    assert not conv.solves("convert", {"value": 55, "from_unit": "m", "to_unit": "km"})
    assert not conv.solves("convert", {"value": 55, "from_unit": "km", "to_unit": "kg"})  # refused: no error here
    assert not conv.solves("nonexistent", {})
    strict = make_service(V2[5])
    assert strict.solves("city_facts", {"name": "oslo", "attribute": "elevation"})
    assert not strict.solves("city_facts", {"name": "Oslo", "attribute": "elevation"})  # v2 refuses 'Oslo'


def test_a_refused_call_is_not_a_valid_call():
    s = play(V2[5], call("city_facts", name="Oslo", attribute="elevation"), "23").score()
    # schema-valid but refused by the strict service: no validity credit, and no grounding
    assert s["components"] == {"format": 1.0, "call_validity": 0.0, "correct": 0.0}
    assert s["reward"] == pytest.approx(0.1) and s["tool_errors"] == 1


def test_a_retry_after_a_refusal_is_correct_at_half_validity():
    s = play(
        V2[1],
        call("convert_units", quantity=55, source="kilometers", target="m"),
        call("convert_units", quantity=55, source="km", target="m"),
        "55000",
    ).score()
    assert s["success"] and s["components"]["call_validity"] == 0.5
    assert s["reward"] == pytest.approx(0.95)


def test_a_service_without_solves_grounds_nothing():
    def answers_anything(name, arguments):
        return "432"

    s = play(V1[0], call("calculator", a=18, b=24, op="*"), "432", service=answers_anything).score()
    assert not s["success"] and s["components"]["call_validity"] == 1.0


def test_a_failing_solves_grounds_nothing_and_does_not_raise():
    class Buggy:
        def __call__(self, name, arguments):
            return "432"

        def solves(self, name, arguments):
            raise KeyError("bug")

    assert not play(V1[0], call("calculator", a=18, b=24, op="*"), "432", service=Buggy()).score()["success"]
