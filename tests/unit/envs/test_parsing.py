"""Tool-call parsing and schema checks (tasks/envs/base.py)."""
import pytest

from tasks.envs.base import check_arguments, normalise_answer, parse_tool_calls, render_tools

TOOL = {"type": "function", "function": {
    "name": "calc", "description": "Arithmetic. Long details here.",
    "parameters": {"type": "object", "properties": {
        "a": {"type": "integer"}, "b": {"type": "number"}, "op": {"type": "string", "enum": ["+", "-"]},
        "flag": {"type": "boolean"}},
        "required": ["a", "op"]}}}


def test_one_valid_call():
    calls = parse_tool_calls('Let me see. <tool_call>{"name": "calc", "arguments": {"a": 1, "op": "+"}}</tool_call>')
    assert len(calls) == 1
    c = calls[0]
    assert (c.name, c.arguments, c.error) == ("calc", {"a": 1, "op": "+"}, None)


def test_two_calls_in_one_turn():
    text = ('<tool_call>{"name":"calc","arguments":{"a":1,"op":"+"}}</tool_call>\n'
            '<tool_call> {"name":"lookup","arguments":{"city":"oslo"}} </tool_call>')
    calls = parse_tool_calls(text)
    assert [(c.name, c.arguments, c.error) for c in calls] == [
        ("calc", {"a": 1, "op": "+"}, None), ("lookup", {"city": "oslo"}, None)]


def test_missing_arguments_defaults_to_empty_object():
    (c,) = parse_tool_calls('<tool_call>{"name":"ping"}</tool_call>')
    assert (c.name, c.arguments, c.error) == ("ping", {}, None)


def test_broken_json():
    (c,) = parse_tool_calls('<tool_call>{"name": "calc", "arguments": {"a": 1,}</tool_call>')
    assert c.name is None and c.arguments is None
    assert "JSON" in c.error


@pytest.mark.parametrize("body", ['{"arguments": {}}', '{"name": 3}', '["calc", {}]', '"calc"'])
def test_missing_or_non_string_name(body):
    (c,) = parse_tool_calls(f"<tool_call>{body}</tool_call>")
    assert c.name is None and c.arguments is None
    assert c.error == 'tool call must be an object with a string "name"'


@pytest.mark.parametrize("args", ['[1, 2]', '"a=1"', '3', 'null'])
def test_arguments_not_an_object(args):
    (c,) = parse_tool_calls(f'<tool_call>{{"name": "calc", "arguments": {args}}}</tool_call>')
    assert c.name == "calc" and c.arguments is None
    assert c.error == '"arguments" must be an object'


def test_unclosed_block():
    (c,) = parse_tool_calls('<tool_call>{"name": "calc", "arguments": {"a": 1}}')
    assert c.error == "tool call not closed with </tool_call>"


def test_valid_call_then_unclosed_block():
    calls = parse_tool_calls('<tool_call>{"name":"calc"}</tool_call><tool_call>{"name":"calc"}')
    assert [c.error for c in calls] == [None, "tool call not closed with </tool_call>"]


@pytest.mark.parametrize("text", ["", "42", "The answer is {\"name\": \"calc\"}.", "calc(a=1) </tool_call"])
def test_text_without_calls(text):
    assert parse_tool_calls(text) == []


@pytest.mark.parametrize("body", ['{"name":"calc","arguments":{"a":' + "9" * 4400 + "}}", "[" * 5000])
def test_pathological_json_is_reported_not_raised(body):
    (c,) = parse_tool_calls(f"<tool_call>{body}</tool_call>")
    assert c.name is None and "JSON" in c.error


# ---------------------------------------------------------------- check_arguments

def test_valid_arguments():
    assert check_arguments(TOOL, {"a": 1, "op": "+"}) is None
    assert check_arguments(TOOL, {"a": -7, "b": 2.5, "op": "-", "flag": True}) is None
    assert check_arguments(TOOL, {"a": 1, "b": 2, "op": "+"}) is None   # an integer is a number


def test_missing_required():
    assert check_arguments(TOOL, {"a": 1}) == "missing required argument 'op'"


def test_unknown_argument():
    assert check_arguments(TOOL, {"a": 1, "op": "+", "c": 2}) == "unknown argument 'c'"


@pytest.mark.parametrize("args, problem", [
    ({"a": "1", "op": "+"}, "argument 'a' must be integer, got str"),
    ({"a": True, "op": "+"}, "argument 'a' must be integer, got bool"),
    ({"a": 1.0, "op": "+"}, "argument 'a' must be integer, got float"),
    ({"a": 1, "b": False, "op": "+"}, "argument 'b' must be number, got bool"),
    ({"a": 1, "b": "2", "op": "+"}, "argument 'b' must be number, got str"),
    ({"a": 1, "op": 1}, "argument 'op' must be string, got int"),
    ({"a": 1, "op": "+", "flag": 1}, "argument 'flag' must be boolean, got int"),
])
def test_wrong_type(args, problem):
    assert check_arguments(TOOL, args) == problem


def test_enum_violation():
    assert check_arguments(TOOL, {"a": 1, "op": "*"}) == "argument 'op' must be one of ['+', '-']"


def test_tool_without_parameters_accepts_only_no_arguments():
    tool = {"function": {"name": "ping"}}
    assert check_arguments(tool, {}) is None
    assert check_arguments(tool, {"x": 1}) == "unknown argument 'x'"


def test_render_tools_lists_signature_and_first_sentence():
    assert render_tools([TOOL]) == "calc(a:int,b:num,op:str,flag:bool) - Arithmetic"


@pytest.mark.parametrize("raw, norm", [(" 42. ", "42"), ("Norway", "norway"), ("  Peru .", "peru")])
def test_normalise_answer(raw, norm):
    assert normalise_answer(raw) == norm
