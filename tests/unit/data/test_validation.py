"""The GX wrapper (tasks/data/validation.py) against every suite in include/gx/.

    python -m pytest -q tests/unit/data/test_validation.py -p no:cacheprovider

For each suite: a good frame passes; every expectation can fail, alone, on a frame built to break it, and
then it is listed with its meta reason, its observed value and its threshold (parameters filled in), and
row expectations give the failing rows' indices; raise_for_failure names expectation, observed value and
threshold; $PARAMETER thresholds follow the parameters given; data docs are written when asked; an unknown
suite name lists the known ones.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pandas as pd
import pytest

from tasks.data.validation import SUITE_DIR, BatchValidationError, Validator, load_suite_spec
from tasks.signals.rows import FLAT_COLUMNS

SUITES = ("traces", "traces_window", "traces_workloads", "rollouts", "eval_results", "production_tasks")
G = 4  # rollouts per task


@pytest.fixture(scope="module")
def validator():
    return Validator()  # no data docs: the docs test makes its own


# ---- good frames, one per suite, and their parameters ------------------------------------------------


def traces_frame() -> pd.DataFrame:
    rows = [
        ("t-0", "calc", 1_000.0, 50, 10, 0, 1, 120.0, 1.0, 1),
        ("t-1", "convert", 2_000.0, 60, 12, 1, 2, np.nan, 0.0, 2),
        ("t-2", "lookup", 3_000.0, 0, 0, 0, 0, 0.0, np.nan, 1),
        ("t-3", "calc", 4_000.0, 70, 9, 2, 2, 80.0, 0.5, 1),
    ]
    return pd.DataFrame(rows, columns=list(FLAT_COLUMNS))


def window_frame() -> pd.DataFrame:
    return pd.DataFrame([{"rows_read": 100, "rows_accepted": 95, "rows_quarantined": 5, "quarantined_share": 0.05}])


def workloads_frame() -> pd.DataFrame:
    return pd.DataFrame({"workload": ["calc", "convert", "lookup"]}, dtype=object)


def rollouts_frame() -> pd.DataFrame:
    rows = []
    for task in range(3):
        for r in range(G):
            n = 5 + task + r
            rows.append(
                {
                    "task_index": task,
                    "rollout_index": r,
                    "policy_version": 7,
                    "reward": (r % 2) * 1.0,
                    "completion_tokens": n,
                    "max_logprob": -0.01 * (r + 1),
                    "n_completion_ids": n,
                    "n_logprobs": n,
                }
            )
    return pd.DataFrame(rows)


def eval_frame() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "task_id": ["calc-0", "calc-1", "convert-0", "lookup-0"],
            "family": ["calc", "calc", "convert", "lookup"],
            "greedy_success": [1.0, 0.0, 1.0, 1.0],
            "sampled_success": [0.75, 0.0, 1.0, 0.5],
            "sampled_reward": [0.8, 0.1, np.nan, 0.5],
        }
    )


def production_frame() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "task_id": ["p-0", "p-1", "p-2", "p-3"],
            "question": ["What is 3 plus 4?", "Convert 2 km to m.", "Oslo: country?", "7 times 6 = ?"],
            "expected": ["7", "2000", "Norway", "42"],
            "family": ["calc", "convert", "lookup", "calc"],
            "split": ["train", "train", "eval", "eval"],
            "content": [
                '["calc",3,4,"add"]',
                '["convert",2,"km","m"]',
                '["lookup","oslo","country"]',
                '["calc",6,7,"mul"]',
            ],
        }
    )


WORKLOADS = ["calc", "convert", "lookup"]
GOOD = {
    "traces": (traces_frame, {"window_start": 1_000.0, "future_limit": 4_000.0}),
    "traces_window": (window_frame, {"max_quarantine_share": 0.1}),
    "traces_workloads": (workloads_frame, {"required_workloads": ["calc", "convert", "lookup"]}),
    "rollouts": (rollouts_frame, {"max_rollout_index": G - 1}),
    "eval_results": (eval_frame, {"min_tasks": 4}),
    "production_tasks": (
        production_frame,
        {"min_tasks": 4, "workloads": WORKLOADS, "required_splits": ["train", "eval"]},
    ),
}


def good(suite):
    make, params = GOOD[suite]
    return make(), dict(params)


def setter(**cells):
    """A mutation: {column: {row: value}}."""

    def f(df):
        for column, by_row in cells.items():
            if df[column].dtype != object and any(v is None or isinstance(v, str) for v in by_row.values()):
                df[column] = df[column].astype(object)
            for row, value in by_row.items():
                df.loc[row, column] = value
        return df

    return f


def set_params(**p):
    return lambda params: {**params, **p}


# (suite, expectation type, column key, mutation, params change, failing rows (None: table-level),
#  observed value, threshold)
NULL = object()  # observed: a null (None or NaN)
CASES = [
    ("traces", "expect_column_values_to_not_be_null", "trace_id", setter(trace_id={1: None}), None, [1], NULL, {}),
    ("traces", "expect_column_values_to_not_be_null", "workload", setter(workload={2: None}), None, [2], NULL, {}),
    ("traces", "expect_column_values_to_not_be_null", "ts", setter(ts={0: np.nan}), None, [0], NULL, {}),
    (
        "traces",
        "expect_column_values_to_be_between",
        "ts",
        setter(ts={3: 4_000.5}),
        None,
        [3],
        4_000.5,
        {"max_value": 4_000.0},
    ),
    (
        "traces",
        "expect_column_values_to_be_between",
        "ts",
        setter(ts={1: 999.0}),
        None,
        [1],
        999.0,
        {"min_value": 1_000.0},
    ),
    (
        "traces",
        "expect_column_values_to_be_between",
        "prompt_tokens",
        setter(prompt_tokens={2: -1}),
        None,
        [2],
        -1,
        {"min_value": 0},
    ),
    (
        "traces",
        "expect_column_values_to_be_between",
        "completion_tokens",
        setter(completion_tokens={0: -7}),
        None,
        [0],
        -7,
        {"min_value": 0},
    ),
    (
        "traces",
        "expect_column_values_to_be_between",
        "tool_errors",
        setter(tool_errors={2: -1}),
        None,
        [2],
        -1,
        {"min_value": 0},
    ),
    (
        "traces",
        "expect_column_pair_values_a_to_be_greater_than_b",
        "tool_calls,tool_errors",
        setter(tool_errors={0: 2}),
        None,
        [0],
        [1, 2],
        {"or_equal": True},
    ),
    (
        "traces",
        "expect_column_values_to_be_between",
        "latency_ms",
        setter(latency_ms={3: -0.5}),
        None,
        [3],
        -0.5,
        {"min_value": 0},
    ),
    (
        "traces",
        "expect_column_values_to_be_between",
        "reward",
        setter(reward={1: 1.01}),
        None,
        [1],
        1.01,
        {"min_value": 0, "max_value": 1},
    ),
    (
        "traces",
        "expect_column_values_to_be_between",
        "n_user_messages",
        setter(n_user_messages={3: 0}),
        None,
        [3],
        0,
        {"min_value": 1},
    ),
    (
        "traces_window",
        "expect_column_values_to_be_between",
        "rows_read",
        setter(rows_read={0: 0}),
        None,
        [0],
        0,
        {"min_value": 1},
    ),
    (
        "traces_window",
        "expect_column_values_to_be_between",
        "rows_accepted",
        setter(rows_accepted={0: 0}),
        None,
        [0],
        0,
        {"min_value": 1},
    ),
    (
        "traces_window",
        "expect_column_values_to_be_between",
        "quarantined_share",
        setter(quarantined_share={0: 0.25}),
        None,
        [0],
        0.25,
        {"max_value": 0.1},
    ),
    (
        "traces_workloads",
        "expect_column_distinct_values_to_contain_set",
        "workload",
        lambda df: df[df.workload != "convert"].reset_index(drop=True),
        None,
        None,
        {"missing": ["convert"]},
        {"value_set": ["calc", "convert", "lookup"]},
    ),
    (
        "rollouts",
        "expect_compound_columns_to_be_unique",
        "task_index,rollout_index,policy_version",
        setter(rollout_index={5: 0}),
        None,
        [4, 5],
        {"task_index": 1, "rollout_index": 0, "policy_version": 7},
        {},
    ),
    (
        "rollouts",
        "expect_column_values_to_be_between",
        "task_index",
        setter(task_index={7: -1}),
        None,
        [7],
        -1,
        {"min_value": 0},
    ),
    (
        "rollouts",
        "expect_column_values_to_be_between",
        "rollout_index",
        setter(rollout_index={11: G}),
        None,
        [11],
        G,
        {"min_value": 0, "max_value": G - 1},
    ),
    (
        "rollouts",
        "expect_column_values_to_be_between",
        "policy_version",
        setter(policy_version={2: -1}),
        None,
        [2],
        -1,
        {"min_value": 0},
    ),
    (
        "rollouts",
        "expect_column_values_to_be_between",
        "reward",
        setter(reward={6: 1.5}),
        None,
        [6],
        1.5,
        {"min_value": 0, "max_value": 1},
    ),
    (
        "rollouts",
        "expect_column_values_to_be_between",
        "completion_tokens",
        setter(completion_tokens={9: 0}),
        None,
        [9],
        0,
        {"min_value": 1},
    ),
    (
        "rollouts",
        "expect_column_values_to_be_between",
        "max_logprob",
        setter(max_logprob={3: 0.2}),
        None,
        [3],
        0.2,
        {"max_value": 0},
    ),
    (
        "rollouts",
        "expect_column_pair_values_to_be_equal",
        "n_completion_ids,n_logprobs",
        setter(n_logprobs={8: 3}),
        None,
        [8],
        [7, 3],
        {},
    ),
    (
        "eval_results",
        "expect_table_row_count_to_be_between",
        "table",
        lambda df: df,
        set_params(min_tasks=5),
        None,
        4,
        {"min_value": 5},
    ),
    (
        "eval_results",
        "expect_column_values_to_be_unique",
        "task_id",
        setter(task_id={3: "calc-1"}),
        None,
        [1, 3],
        "calc-1",
        {},
    ),
    ("eval_results", "expect_column_values_to_not_be_null", "task_id", setter(task_id={2: None}), None, [2], NULL, {}),
    (
        "eval_results",
        "expect_column_values_to_be_in_set",
        "greedy_success",
        setter(greedy_success={1: 0.5}),
        None,
        [1],
        0.5,
        {"value_set": [0.0, 1.0]},
    ),
    (
        "eval_results",
        "expect_column_values_to_not_be_null",
        "sampled_success",
        setter(sampled_success={3: np.nan}),
        None,
        [3],
        NULL,
        {},
    ),
    (
        "eval_results",
        "expect_column_values_to_be_between",
        "sampled_success",
        setter(sampled_success={0: 1.25}),
        None,
        [0],
        1.25,
        {"min_value": 0, "max_value": 1},
    ),
    (
        "eval_results",
        "expect_column_values_to_be_between",
        "sampled_reward",
        setter(sampled_reward={1: -0.1}),
        None,
        [1],
        -0.1,
        {"min_value": 0, "max_value": 1},
    ),
    (
        "production_tasks",
        "expect_table_row_count_to_be_between",
        "table",
        lambda df: df,
        set_params(min_tasks=5),
        None,
        4,
        {"min_value": 5},
    ),
    (
        "production_tasks",
        "expect_column_values_to_not_be_null",
        "task_id",
        setter(task_id={1: None}),
        None,
        [1],
        NULL,
        {},
    ),
    (
        "production_tasks",
        "expect_column_values_to_be_unique",
        "task_id",
        setter(task_id={3: "p-1"}),
        None,
        [1, 3],
        "p-1",
        {},
    ),
    (
        "production_tasks",
        "expect_column_values_to_not_be_null",
        "question",
        setter(question={2: None}),
        None,
        [2],
        NULL,
        {},
    ),
    (
        "production_tasks",
        "expect_column_values_to_not_be_null",
        "expected",
        setter(expected={0: None}),
        None,
        [0],
        NULL,
        {},
    ),
    (
        "production_tasks",
        "expect_column_value_lengths_to_be_between",
        "expected",
        setter(expected={3: ""}),
        None,
        [3],
        "",
        {"min_value": 1},
    ),
    (
        "production_tasks",
        "expect_column_values_to_be_in_set",
        "family",
        setter(family={2: "sing"}),
        None,
        [2],
        "sing",
        {"value_set": WORKLOADS},
    ),
    (
        "production_tasks",
        "expect_column_values_to_be_in_set",
        "split",
        setter(split={1: "test"}),
        None,
        [1],
        "test",
        {"value_set": ["train", "eval"]},
    ),
    (
        "production_tasks",
        "expect_column_distinct_values_to_contain_set",
        "split",
        setter(split={2: "train", 3: "train"}),
        None,
        None,
        {"missing": ["eval"]},
        {"value_set": ["train", "eval"]},
    ),
    (
        "production_tasks",
        "expect_column_values_to_be_unique",
        "content",
        setter(content={3: '["calc",3,4,"add"]'}),
        None,
        [0, 3],
        '["calc",3,4,"add"]',
        {},
    ),
]
CASE_IDS = [
    f"{c[0]}-{c[1].removeprefix('expect_')}-{c[2]}-{'max' if 'max_value' in c[7] and 'min_value' not in c[7] else 'min' if 'min_value' in c[7] else ''}"
    for c in CASES
]


def _key(expectation: dict) -> tuple:
    kw = expectation["kwargs"]
    column = (
        kw.get("column")
        or (f"{kw['column_A']},{kw['column_B']}" if "column_A" in kw else None)
        or (",".join(kw["column_list"]) if "column_list" in kw else "table")
    )
    bounds = tuple(sorted(k for k in ("min_value", "max_value") if k in kw))
    return expectation["type"], column, bounds


def _case_key(case) -> tuple:
    return case[1], case[2], tuple(sorted(k for k in ("min_value", "max_value") if k in case[7]))


def test_the_cases_break_every_expectation_of_every_suite():
    assert sorted(p.stem for p in SUITE_DIR.glob("*.json")) == sorted(SUITES)
    for suite in SUITES:
        spec = load_suite_spec(suite)
        assert spec["name"] == suite
        assert all(e.get("meta", {}).get("reason") for e in spec["expectations"])
        expected = sorted(_key(e) for e in spec["expectations"])
        assert sorted(_case_key(c) for c in CASES if c[0] == suite) == expected, suite


@pytest.mark.parametrize("suite", SUITES)
def test_a_good_frame_passes(validator, suite):
    frame, params = good(suite)
    result = validator.validate(suite, frame, params)
    assert result.success and result.suite == suite and result.rows == len(frame)
    assert [e.success for e in result.expectations] == [True] * len(load_suite_spec(suite)["expectations"])
    assert result.failed_rows() == {}
    result.raise_for_failure()  # no error
    json.dumps(result.to_dict())


def _reason(suite, expectation, column, threshold) -> str:
    keys = [
        e
        for e in load_suite_spec(suite)["expectations"]
        if _key(e) == (expectation, column, tuple(sorted(k for k in ("min_value", "max_value") if k in threshold)))
    ]
    [e] = keys
    return e["meta"]["reason"]


def _same(observed, expected) -> bool:
    if expected is NULL:
        return observed is None or (isinstance(observed, float) and math.isnan(observed))
    if isinstance(expected, float):
        return observed == pytest.approx(expected)
    return observed == expected


def _bound_text(k, v) -> str:
    """How the message shows a threshold: GX may have turned an int bound into a float."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return re.escape(f"{k}={v}")
    return re.escape(f"{k}=") + f"{re.escape(repr(float(v)))}|{re.escape(k)}={re.escape(repr(v))}"


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_each_expectation_fails_alone_with_its_reason_observed_value_threshold_and_rows(validator, case):
    suite, expectation, column, mutate, change, rows, observed, threshold = case
    frame, params = good(suite)
    frame = mutate(frame.copy())
    if change:
        params = change(params)
    result = validator.validate(suite, frame, params)
    assert not result.success
    failed = [e for e in result.expectations if not e.success]
    assert [(e.expectation, e.column or "table") for e in failed] == [(expectation, column)], [
        e.message for e in failed
    ]
    [e] = failed
    reason = _reason(suite, expectation, column, threshold)
    assert e.reason == reason
    assert _same(e.observed, observed), (e.observed, observed)
    for k, v in threshold.items():
        assert k in e.threshold and (e.threshold[k] == v or e.threshold[k] == pytest.approx(v)), e.threshold
    if rows is None:  # a table-level expectation: no row to blame
        assert e.unexpected_index == [] and result.failed_rows() == {}
    else:
        assert sorted(e.unexpected_index) == rows and e.unexpected_count == len(rows)
        assert result.failed_rows() == {i: reason for i in rows}

    with pytest.raises(BatchValidationError) as info:
        result.raise_for_failure()
    err = info.value
    msg = str(err)
    assert err.suite == suite and msg.startswith(f"suite {suite!r} failed: ")
    assert f"{expectation}({column}; " in msg and f"({reason})" in msg
    assert f"observed {e.observed!r}" in msg
    for k, v in threshold.items():
        assert re.search(_bound_text(k, v), msg), (k, v, msg)
    [failure] = err.failures
    assert failure["message"] == e.message and failure["expectation"] == expectation


@pytest.mark.parametrize(
    "case",
    [
        c
        for c in CASES
        if c[1]
        in (
            "expect_column_pair_values_a_to_be_greater_than_b",
            "expect_column_pair_values_to_be_equal",
            "expect_compound_columns_to_be_unique",
        )
    ],
    ids=lambda c: f"{c[0]}-{c[2]}",
)
def test_a_failure_serialises_to_plain_json(validator, case):
    """BUG for the column-pair expectations: `_plain` (documented 'Numpy scalars and sets ->
    JSON-serialisable values') leaves the numpy scalars inside the observed pair, so
    ExpectationOutcome.to_dict() / BatchValidationError.failures cannot go through json.dumps, and the
    message reads 'observed [np.int64(1), np.int64(2)]' instead of 'observed [1, 2]'."""
    suite, expectation, column, mutate, change, rows, observed, threshold = case
    frame, params = good(suite)
    result = validator.validate(suite, mutate(frame.copy()), params)
    [e] = [e for e in result.expectations if not e.success]
    assert json.loads(json.dumps(e.to_dict()))["observed"] == observed
    assert f"observed {observed!r}" in e.message


def test_a_row_failing_several_expectations_gets_every_reason(validator):
    frame, params = good("traces")
    frame.loc[2, "prompt_tokens"] = -3
    frame.loc[2, "reward"] = 7.0
    frame.loc[0, "n_user_messages"] = 0
    result = validator.validate("traces", frame, params)
    assert result.failed_rows() == {2: "prompt_tokens < 0; reward outside [0, 1]", 0: "no user message"}
    assert (
        sorted(e.expectation for e in result.expectations if not e.success)
        == ["expect_column_values_to_be_between"] * 3
    )
    with pytest.raises(BatchValidationError) as info:
        result.raise_for_failure()
    assert len(info.value.failures) == 3 and str(info.value).count("; expect_") == 2


# ---- parameters ----------------------------------------------------------------------------------------


def _failed(validator, suite, frame, params) -> list[str]:
    return [e.message for e in validator.validate(suite, frame, params).expectations if not e.success]


def test_parameters_set_the_thresholds(validator):
    frame, _ = good("traces")
    assert _failed(validator, "traces", frame, {"window_start": 0.0, "future_limit": 4_000.0}) == []
    [msg] = _failed(validator, "traces", frame, {"window_start": 0.0, "future_limit": 3_500.0})
    assert (
        msg == "expect_column_values_to_be_between(ts; max_value=3500.0): observed 4000.0 (timestamp is in the future)"
    )
    [msg] = _failed(validator, "traces", frame, {"window_start": 1_500.0, "future_limit": 9e9})
    assert "(ts; min_value=1500.0): observed 1000.0 (timestamp is before the window)" in msg

    frame = window_frame()
    frame.loc[0, "quarantined_share"] = 0.2
    assert _failed(validator, "traces_window", frame, {"max_quarantine_share": 0.25}) == []
    [msg] = _failed(validator, "traces_window", frame, {"max_quarantine_share": 0.15})
    assert "(quarantined_share; max_value=0.15): observed 0.2 (too many bad rows)" in msg

    frame = rollouts_frame()
    frame.loc[0, "rollout_index"] = G  # a fifth rollout
    assert _failed(validator, "rollouts", frame, {"max_rollout_index": G}) == []
    [msg] = _failed(validator, "rollouts", frame, {"max_rollout_index": G - 2})
    assert re.search(rf"\(rollout_index; min_value=0(\.0)?, max_value={G - 2}(\.0)?\): observed {G} ", msg), msg

    assert _failed(validator, "eval_results", eval_frame(), {"min_tasks": 1}) == []
    [msg] = _failed(validator, "eval_results", eval_frame(), {"min_tasks": 100})
    assert msg == "expect_table_row_count_to_be_between(table; min_value=100): observed 4 (too few eval tasks)"

    assert _failed(validator, "traces_workloads", workloads_frame(), {"required_workloads": []}) == []
    [msg] = _failed(validator, "traces_workloads", workloads_frame(), {"required_workloads": ["calc", "search", "x"]})
    assert "value_set=['calc', 'search', 'x']" in msg and "'search'" in msg.split("observed")[1]
    assert "'x'" in msg.split("observed")[1]


def test_parameters_do_not_leak_between_calls(validator):
    frame = window_frame()
    frame.loc[0, "quarantined_share"] = 0.2
    assert not validator.validate("traces_window", frame, {"max_quarantine_share": 0.1}).success
    assert validator.validate("traces_window", frame, {"max_quarantine_share": 0.3}).success
    assert not validator.validate("traces_window", frame, {"max_quarantine_share": 0.1}).success


def test_a_missing_parameter_is_an_error_naming_it(validator):
    with pytest.raises(Exception, match="max_quarantine_share"):
        validator.validate("traces_window", window_frame(), {})


# ---- data docs, unknown suites -----------------------------------------------------------------------


def test_data_docs_are_written_when_a_docs_dir_is_given(tmp_path):
    docs = tmp_path / "docs"
    v = Validator(docs)
    assert v.docs_index() is None
    frame, params = good("rollouts")
    assert v.validate("rollouts", frame, params, docs=False).success
    assert not (docs / "index.html").exists()  # docs=False: nothing rendered
    frame.loc[1, "reward"] = 3.0
    result = v.validate("rollouts", frame, params, docs=True)
    assert not result.success and result.failed_rows() == {1: "reward outside [0, 1]"}
    assert v.docs_index() == docs / "index.html" and (docs / "index.html").stat().st_size > 0
    pages = list((docs / "validations" / "rollouts").rglob("*.html"))
    assert len(pages) == 1 and "reward" in pages[0].read_text()
    assert (docs / "expectations" / "rollouts.html").is_file()
    assert "rollouts" in (docs / "index.html").read_text()
    # the docs path and the plain path agree on the outcome
    plain = Validator().validate("rollouts", frame, params)
    assert [e.to_dict()["message"] for e in plain.expectations] == [e.message for e in result.expectations]


def test_no_docs_dir_writes_nothing(tmp_path, validator, monkeypatch):
    monkeypatch.chdir(tmp_path)
    frame, params = good("eval_results")
    assert validator.validate("eval_results", frame, params, docs=True).success
    assert validator.docs_index() is None and list(tmp_path.iterdir()) == []


def test_unknown_suite_lists_the_known_ones(validator):
    known = ", ".join(sorted(SUITES))
    with pytest.raises(
        FileNotFoundError, match=re.escape(f"no GX suite 'tracez' in {SUITE_DIR}; known suites: {known}")
    ):
        validator.validate("tracez", window_frame())
    with pytest.raises(FileNotFoundError, match="known suites: eval_results, production_tasks, rollouts, traces"):
        load_suite_spec("nope")
