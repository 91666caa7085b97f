"""Tool-call parsing by vLLM's parser (tasks/policy/chat.py) and schema checks (tasks/envs/base.py)."""

import pytest

from tasks.envs.base import check_arguments, normalise_answer
from tasks.policy.chat import ChatFormat
from tasks.policy.tokenizer import char_tokenizer

TOOL = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "Arithmetic. Long details here.",
        "parameters": {
            "type": "object",
            "properties": {
                "a": {"type": "integer"},
                "b": {"type": "number"},
                "op": {"type": "string", "enum": ["+", "-"]},
                "flag": {"type": "boolean"},
            },
            "required": ["a", "op"],
        },
    },
}


CHAT = ChatFormat(char_tokenizer())  # the default: vLLM's hermes parser


def parse(text):
    return CHAT.parse(text)


def test_one_valid_call():
    turn = parse('Let me see. <tool_call>{"name": "calc", "arguments": {"a": 1, "op": "+"}}</tool_call>')
    assert turn.attempted and turn.content.strip() == "Let me see."
    (c,) = turn.calls
    assert (c.name, c.arguments, c.error) == ("calc", {"a": 1, "op": "+"}, None)


def test_two_calls_in_one_turn():
    text = (
        '<tool_call>{"name":"calc","arguments":{"a":1,"op":"+"}}</tool_call>\n'
        '<tool_call> {"name":"lookup","arguments":{"city":"oslo"}} </tool_call>'
    )
    assert [(c.name, c.arguments, c.error) for c in parse(text).calls] == [
        ("calc", {"a": 1, "op": "+"}, None),
        ("lookup", {"city": "oslo"}, None),
    ]


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>{"name": "calc", "arguments": {"a": 1,}</tool_call>',  # broken JSON
        '<tool_call>{"name":"ping"}</tool_call>',  # hermes needs "arguments"
        '<tool_call>{"arguments": {}}</tool_call>',  # no name
        '<tool_call>["calc", {}]</tool_call>',
        '<tool_call>{"name":"calc","arguments":{}}</tool_call><tool_call>{"name":',  # one bad block spoils the turn
        "432</tool_call>",  # a stray closing tag
        '<tool_call>{"name":"calc","arguments":{"a":' + "9" * 4400 + "}}</tool_call>",  # int too long for json
        "<tool_call>" + "[" * 5000 + "</tool_call>",  # nested too deep
    ],
)
def test_malformed_calls_are_one_error_never_an_exception(text):
    turn = parse(text)
    assert turn.attempted
    (c,) = turn.calls
    assert c.name is None and c.error == "the hermes tool parser could not read the call"


@pytest.mark.parametrize("args", ["[1, 2]", '"a=1"', "3"])
def test_arguments_not_an_object(args):
    (c,) = parse(f'<tool_call>{{"name": "calc", "arguments": {args}}}</tool_call>').calls
    assert c.name == "calc" and c.arguments is None
    assert c.error in ('"arguments" must be an object', '"arguments" is not valid JSON (JSONDecodeError)')


def test_an_unclosed_call_at_the_end_of_a_turn_is_read():
    # hermes reads `<tool_call>{...}` up to the end of the turn (the turn ended on the stop token)
    (c,) = parse('<tool_call>{"name": "calc", "arguments": {"a": 1}}').calls
    assert (c.name, c.arguments, c.error) == ("calc", {"a": 1}, None)


@pytest.mark.parametrize("text", ["", "42", 'The answer is {"name": "calc"}.', "calc(a=1) </tool_call"])
def test_text_without_calls(text):
    turn = parse(text)
    assert not turn.attempted and turn.calls == [] and turn.content == text


# ---------------------------------------------------------------- check_arguments


def test_valid_arguments():
    assert check_arguments(TOOL, {"a": 1, "op": "+"}) is None
    assert check_arguments(TOOL, {"a": -7, "b": 2.5, "op": "-", "flag": True}) is None
    assert check_arguments(TOOL, {"a": 1, "b": 2, "op": "+"}) is None  # an integer is a number


def test_missing_required():
    assert check_arguments(TOOL, {"a": 1}) == "missing required argument 'op'"


def test_unknown_argument():
    assert check_arguments(TOOL, {"a": 1, "op": "+", "c": 2}) == "unknown argument 'c'"


@pytest.mark.parametrize(
    "args, problem",
    [
        ({"a": "1", "op": "+"}, "argument 'a' must be integer, got str"),
        ({"a": True, "op": "+"}, "argument 'a' must be integer, got bool"),
        ({"a": 1.0, "op": "+"}, "argument 'a' must be integer, got float"),
        ({"a": 1, "b": False, "op": "+"}, "argument 'b' must be number, got bool"),
        ({"a": 1, "b": "2", "op": "+"}, "argument 'b' must be number, got str"),
        ({"a": 1, "op": 1}, "argument 'op' must be string, got int"),
        ({"a": 1, "op": "+", "flag": 1}, "argument 'flag' must be boolean, got int"),
    ],
)
def test_wrong_type(args, problem):
    assert check_arguments(TOOL, args) == problem


def test_enum_violation():
    assert check_arguments(TOOL, {"a": 1, "op": "*"}) == "argument 'op' must be one of ['+', '-']"


def test_tool_without_parameters_accepts_only_no_arguments():
    tool = {"function": {"name": "ping"}}
    assert check_arguments(tool, {}) is None
    assert check_arguments(tool, {"x": 1}) == "unknown argument 'x'"


def test_default_template_lists_signature_and_first_sentence():
    text = CHAT.tokenizer.apply_chat_template([{"role": "user", "content": "q"}], tools=[TOOL], tokenize=False)
    assert text == "<|system|>calc(a:int,b:num,op:str,flag:bool) - Arithmetic<|end|><|user|>q<|end|>"


@pytest.mark.parametrize("raw, norm", [(" 42. ", "42"), ("Norway", "norway"), ("  Peru .", "peru")])
def test_normalise_answer(raw, norm):
    assert normalise_answer(raw) == norm
