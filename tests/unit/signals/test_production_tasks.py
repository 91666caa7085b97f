"""Tasks from production: desk reads its questions back from traces, and the train / eval sets written from
accepted traces share no content (tasks/envs/desk.py task_from_trace, tasks/signals/production_tasks.py).

    PYTHONPATH=. .venv/bin/python -m pytest -q tests/unit/signals/test_production_tasks.py

Traces come from the real simulator (scripted policy, toolset v1 then v2) plus hand-made contract rows
for the cases it never writes (a question desk cannot verify, a broken line, a repeated trace id, the
same content asked in another phrasing). ~30 s, most of it the simulator.
"""

import gzip
import json
import random
import re
from datetime import UTC, datetime, timedelta

import pytest

from tasks.data.validation import BatchValidationError, Validator
from tasks.envs import Environment, get_env
from tasks.envs.desk import CITIES, FIELDS, OPS, UNITS, generate_tasks, open_session, task_content, verify
from tasks.envs.desk_traces import parse_question
from tasks.envs.toolset import load_toolset
from tasks.signals.production_tasks import content_of, tasks_from_traces
from tasks.signals.simulate import simulate_traces

DESK = get_env("desk")
V1, V2 = load_toolset("1", "desk"), load_toolset("2", "desk")
OP_WORDS = {word for _, word, _ in OPS.values()}
START = datetime(2026, 12, 1, tzinfo=UTC)


def trace(trace_id: str, question: str, answer: str = "42") -> dict:
    """A contract row as production writes it (the answer is the policy's, possibly wrong)."""
    return {
        "trace_id": trace_id,
        "timestamp": "2026-12-01T10:00:00Z",
        "workload": "calc",
        "model": {"name": "agent", "version": "1"},
        "tools": [],
        "messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}],
        "outcome": {"success": False, "tool_errors": 0, "prompt_tokens": 10, "completion_tokens": 2},
    }


def shape(question: str) -> str:
    """The template of a generated question: numbers, operators, units, cities and fields abstracted."""
    names = {name for name, _, _ in UNITS.values()}
    kinds = [
        (str.isdigit, "N"),
        (OP_WORDS.__contains__, "OP"),
        (UNITS.__contains__, "SYM"),
        (names.__contains__, "UNIT"),
        (lambda w: w.lower() in CITIES, "CITY"),
        (FIELDS.__contains__, "FIELD"),
    ]
    words = re.findall(r"[A-Za-z]+|\d+|[^\sA-Za-z\d]", question)
    return " ".join(next((label for test, label in kinds if test(w)), w) for w in words)


def no_hook_env() -> Environment:
    """An environment without task_from_trace (loaded by module:factory in a test)."""
    return Environment("nohook", generate_tasks, open_session, verify)


# ---------------------------------------------------------------- desk reads its questions back


@pytest.mark.parametrize("toolset", [V1, V2], ids=["v1", "v2"])
def test_every_generated_question_round_trips(toolset):
    """Every phrasing the generator uses gives back its solution, answer, tools and strictness."""
    shapes = set()
    for t in generate_tasks(900, 11, toolset):
        got = DESK.task_from_trace(trace(f"t{t.task_id}", t.question), toolset)
        assert got is not None, t.question
        assert task_content(got) == task_content(t) and got.data["solution"] == t.data["solution"], t.question
        assert got.expected == t.expected and got.tools == t.tools and got.family == t.family
        assert got.data["bindings"] == t.data["bindings"] and got.data["strict"] == t.data["strict"]
        assert got.task_id == f"desk-prod-t{t.task_id}" and got.question == t.question
        shapes.add(shape(t.question))
    # calc: 3 templates; convert: 2 templates x (unit names, symbols); lookup: 2 templates
    assert len(shapes) == 9, sorted(shapes)


@pytest.mark.parametrize(
    "question, family, values, expected",
    [
        ("What is 12 plus 30?", "calc", [12, 30, "add"], "42"),
        ("Compute 7 minus 9.", "calc", [7, 9, "sub"], "-2"),
        ("6 times 7 = ?", "calc", [6, 7, "mul"], "42"),
        ("  what is 6*7 ", "calc", [6, 7, "mul"], "42"),
        ("Convert 3 kilometers to meters.", "convert", [3, "km", "m"], "3000"),
        ("Convert 2.5 h to min", "convert", [2.5, "h", "min"], "150"),
        ("How many milliliters is 4 liters?", "convert", [4, "l", "ml"], "4000"),
        ("How many s is 2 min?", "convert", [2, "min", "s"], "120"),
        ("What is the population of Oslo?", "lookup", ["oslo", "population"], "709037"),
        ("Denver: elevation?", "lookup", ["denver", "elevation"], "1609"),
    ],
)
def test_phrasings_parse_and_answers_are_recomputed(question, family, values, expected):
    assert parse_question(question) == (family, values)
    task = DESK.task_from_trace(trace("abc", question, answer="wrong"), V2)
    assert task.expected == expected and task.data["strict"] and task.tools[0]["x-evergreen-handler"] == family


@pytest.mark.parametrize(
    "question",
    [
        "Tell me a joke.",
        "What is 3 divided by 4?",
        "Convert 5 km to kg.",
        "Convert 5 km to km.",
        "How many furlongs is 3 km?",
        "What is the mood of Oslo?",
        "Paris: population?",
        "What is 3 plus?",
        "",
    ],
)
def test_unparsable_questions_give_none(question):
    assert DESK.task_from_trace(trace("x", question), V2) is None


def test_no_user_message_or_missing_tool_gives_none():
    row = trace("x", "What is 1 plus 2?")
    assert DESK.task_from_trace({**row, "messages": [{"role": "assistant", "content": "3"}]}, V2) is None
    no_calc = {"version": "2", "tools": [t for t in V2["tools"] if t["x-evergreen-handler"] != "calc"]}
    assert DESK.task_from_trace(row, no_calc) is None
    assert DESK.task_from_trace(row, V1).data["strict"] is False


# ---------------------------------------------------------------- train / eval from accepted traces

EXTRA = [
    trace("zz-dup-a", "What is 3 plus 4?"),
    trace("zz-dup-b", "Compute 4 plus 3."),  # one content
    trace("zz-dup-c", "  what is 3 + 4 "),
    trace("zz-joke", "Tell me a joke."),
    {**trace("zz-nouser", "x"), "messages": [{"role": "system", "content": "hi"}]},
]


@pytest.fixture(scope="module")
def lines(tmp_path_factory):
    """All input lines: ~240 simulated traces (v1, then v2 from day 2) and the hand-made rows."""
    sim = tmp_path_factory.mktemp("sim")
    simulate_traces(
        sim, START, START + timedelta(days=2), 240, [(START, "1"), (START + timedelta(days=1), "2")], seed=5
    )
    out = [
        line for f in sorted(sim.rglob("*.jsonl.gz")) for line in gzip.decompress(f.read_bytes()).decode().splitlines()
    ]
    return out + [json.dumps(r) for r in EXTRA] + ["{broken", out[0]]  # out[0] again: a repeated trace id


@pytest.fixture(scope="module")
def validator():
    return Validator()


def write_parts(dir_, lines, n_parts=3):
    (dir_ / "accepted").mkdir(parents=True)
    for i in range(n_parts):
        (dir_ / "accepted" / f"part-{i:05d}.jsonl").write_text("".join(line + "\n" for line in lines[i::n_parts]))
    (dir_ / "quarantine").mkdir()
    (dir_ / "quarantine" / "part-00000.jsonl").write_text('{"reason": "not a trace"}\n')  # never read
    return dir_


@pytest.fixture(scope="module")
def built(tmp_path_factory, lines, validator):
    root = tmp_path_factory.mktemp("prod")
    summary = tasks_from_traces(write_parts(root / "ingest", lines), "desk", "2", root / "out", validator=validator)
    return summary, root / "out"


def read(out, split):
    from tasks.envs.base import Task

    return [Task.from_dict(json.loads(line)) for line in (out / f"{split}.jsonl").read_text().splitlines()]


def test_no_eval_task_appears_in_training(built):
    _, out = built
    train, held_out = read(out, "train"), read(out, "eval")
    assert train and held_out
    assert not {task_content(t) for t in train} & {task_content(t) for t in held_out}  # desk's content
    assert not {content_of(t) for t in train} & {content_of(t) for t in held_out}
    norm = lambda ts: {" ".join(t.question.lower().split()) for t in ts}  # noqa: E731
    assert not norm(train) & norm(held_out) and not {t.task_id for t in train} & {t.task_id for t in held_out}


def test_production_train_holds_no_content_the_environment_keeps_for_its_gate(built):
    from tasks.envs.desk import split_of

    _, out = built
    train, held_out = read(out, "train"), read(out, "eval")
    assert {split_of(t.family, t.data["solution"]) for t in train} == {"train"}
    assert {split_of(t.family, t.data["solution"]) for t in held_out} >= {"eval", "dev"}  # desk's held-out: eval


def test_duplicates_removed_and_tasks_on_the_new_toolset(built):
    summary, out = built
    tasks = read(out, "train") + read(out, "eval")
    assert len({task_content(t) for t in tasks}) == len(tasks) and summary["duplicates"] >= 2
    # the three phrasings of 3 + 4 are one task, kept from the smallest trace id
    seven = [t for t in tasks if task_content(t) == ("calc", 3, 4, "add")]
    assert [t.task_id for t in seven] == ["desk-prod-zz-dup-a"] and seven[0].expected == "7"
    v2_names = {t["function"]["name"] for t in V2["tools"]}
    assert all(t.data["strict"] and {x["function"]["name"] for x in t.tools} <= v2_names for t in tasks)


def test_summary_counts_reconcile(built, lines):
    summary, out = built
    assert summary["traces"] == len(lines) == summary["mapped"] + summary["unverifiable"]
    assert summary["mapped"] == summary["train"] + summary["eval"] + summary["duplicates"]
    assert summary["unverifiable_by_reason"] == {
        "bad_json": 1,
        "no_user_message": 1,
        "not_verifiable": 1,
        "repeated_trace_id": 1,
    }
    assert (
        summary["validation"]["success"] and json.loads((out / "summary.json").read_text())["train"] == summary["train"]
    )
    # desk holds out 40 % of contents (dev + eval), and eval_share 0.25 of the rest: about 0.55 in all
    assert 0.4 < summary["eval"] / (summary["train"] + summary["eval"]) < 0.7


def test_split_is_stable_and_independent_of_row_order(built, lines, tmp_path, validator):
    _, out = built
    shuffled = list(lines)
    random.Random(1).shuffle(shuffled)
    (tmp_path / "one.jsonl").write_text("".join(line + "\n" for line in shuffled))
    again = tasks_from_traces(tmp_path / "one.jsonl", "desk", V2, tmp_path / "out", validator=validator)
    for split in ("train", "eval"):
        assert (tmp_path / "out" / f"{split}.jsonl").read_bytes() == (out / f"{split}.jsonl").read_bytes()
    assert again["unverifiable_by_reason"] == built[0]["unverifiable_by_reason"]
    # an earlier window, a subset of the traces: what it held out is not trained on with the full set
    first = write_parts(tmp_path / "first", lines[:120], n_parts=1)
    tasks_from_traces(first, "desk", V2, tmp_path / "first_out", validator=validator)
    train_all = {task_content(t) for t in read(out, "train")}
    assert not {task_content(t) for t in read(tmp_path / "first_out", "eval")} & train_all


def test_failed_suite_raises_after_writing(lines, tmp_path, validator):
    (tmp_path / "in.jsonl").write_text("".join(line + "\n" for line in lines))
    with pytest.raises(BatchValidationError, match="family is not one of the environment's workloads"):
        tasks_from_traces(tmp_path / "in.jsonl", "desk", V2, tmp_path / "out", workloads=["calc"], validator=validator)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert not summary["validation"]["success"] and (tmp_path / "out" / "eval.jsonl").exists()


def test_environment_without_the_hook_is_a_clear_error(tmp_path):
    (tmp_path / "in.jsonl").write_text(json.dumps(trace("a", "What is 1 plus 2?")) + "\n")
    with pytest.raises(ValueError, match="no task_from_trace"):
        tasks_from_traces(tmp_path / "in.jsonl", f"{__name__}:no_hook_env", V2, tmp_path / "out")
    with pytest.raises(FileNotFoundError):
        tasks_from_traces(tmp_path / "missing", "desk", V2, tmp_path / "out")


# ---------------------------------------------------------------- GRPO's batches draw from them


def training_settings(out, share: float, **grpo):
    from tasks.config import load_settings

    return load_settings(
        environ={},
        overrides={
            "env": {"target_toolset": "2", "champion_toolset": "1"},
            "grpo": {
                "tasks_per_step": 16,
                "guard_share": 0.25,
                "production_share": share,
                "production_tasks": str(out / "train.jsonl"),
                **grpo,
            },
        },
    )


def test_training_batches_take_their_share_from_production_and_never_its_held_out_content(built):
    from tasks.envs.desk import split_of
    from tasks.rl.train import training_tasks

    _, out = built
    production = {t.task_id for t in read(out, "train")}
    held_out = {content_of(t) for t in read(out, "eval")}
    s = training_settings(out, 0.5)
    for step in range(6):
        batch = training_tasks(s, step)
        target, guard = batch[:12], batch[12:]
        assert sum(t.task_id in production for t in target) == 6  # round(0.5 * 12)
        assert not any(t.task_id in production for t in guard)
        # no task of the batch (production or generated) carries production's held-out content,
        # nor the environment's own held-out content (the gate's)
        assert not {content_of(t) for t in batch} & held_out, step
        assert {split_of(t.family, t.data["solution"]) for t in batch} == {"train"}
    assert [t.task_id for t in training_tasks(s, 3)] == [t.task_id for t in training_tasks(s, 3)]  # deterministic


def test_without_a_share_the_batches_are_the_generated_ones(built):
    from tasks.rl.train import training_tasks

    _, out = built
    plain = training_tasks(training_settings(out, 0.0), 2)
    unset = training_tasks(training_settings(out, 0.5, production_tasks=None), 2)
    assert [t.task_id for t in plain] == [t.task_id for t in unset]
    assert not any(t.task_id.startswith("desk-prod-") for t in plain)


def test_a_missing_production_file_says_what_to_set(tmp_path):
    from tasks.rl.train import training_tasks

    with pytest.raises(FileNotFoundError, match="production_share=0"):
        training_tasks(training_settings(tmp_path / "nowhere", 0.5), 0)
