"""GX checks of the loop's own data: rollout records of a GRPO step, and per-task eval tables.

    from tasks.data.checks import check_rollouts, check_eval_table
    check_rollouts(records, group_size=8, docs_dir="runs/x/gx_docs").raise_for_failure()
    check_eval_table(result.table, min_tasks=150).raise_for_failure()

Each returns a SuiteOutcome (tasks.data.validation); the suites are include/gx/rollouts.json and
include/gx/eval_results.json. The frames are built here, so the suites see flat columns.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tasks.data.validation import SuiteOutcome, Validator

if TYPE_CHECKING:
    import pandas as pd


def rollout_frame(records: list[dict]) -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame(
        {
            "task_index": [r["task_index"] for r in records],
            "rollout_index": [r["rollout_index"] for r in records],
            "policy_version": [r["policy_version"] for r in records],
            "reward": [r["reward"] for r in records],
            "completion_tokens": [r["completion_tokens"] for r in records],
            # tool-result tokens carry logprob 0.0 (masked out); the sampled ones must be <= 0
            "max_logprob": [
                max((lp for lp, m in zip(r["logprobs"], r["completion_mask"], strict=False) if m), default=0.0)
                for r in records
            ],
            "n_completion_ids": [len(r["completion_ids"]) for r in records],
            "n_logprobs": [len(r["logprobs"]) for r in records],
        }
    )


def check_rollouts(
    records: list[dict], group_size: int, docs_dir: str | Path | None = None, validator: Validator | None = None
) -> SuiteOutcome:
    validator = validator or Validator(docs_dir)
    return validator.validate(
        "rollouts", rollout_frame(records), {"max_rollout_index": group_size - 1}, docs=docs_dir is not None
    )


def check_eval_table(
    table: list[dict], min_tasks: int, docs_dir: str | Path | None = None, validator: Validator | None = None
) -> SuiteOutcome:
    import pandas as pd

    columns = ("task_id", "family", "greedy_success", "sampled_success", "sampled_reward")
    frame = pd.DataFrame({c: [row.get(c) for row in table] for c in columns})
    validator = validator or Validator(docs_dir)
    return validator.validate("eval_results", frame, {"min_tasks": min_tasks}, docs=docs_dir is not None)
