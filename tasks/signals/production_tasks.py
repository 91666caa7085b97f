"""Tasks from production: accepted traces -> training and held-out eval tasks the environment can verify.

    from tasks.envs.toolset import load_toolset
    from tasks.signals.production_tasks import tasks_from_traces
    summary = tasks_from_traces("runs/x/ingest", "desk", load_toolset("2", "desk"), "runs/x/production_tasks")
    # or: python -m tasks.signals.production_tasks runs/x/ingest runs/x/production_tasks --env desk --toolset 2

Input: ingest's output directory (its `accepted/part-*.jsonl` are read), a directory of JSONL parts
(`*.jsonl`, `*.jsonl.gz`, e.g. the simulator's date partitions), or one file. Each trace goes through the
environment's `task_from_trace(trace, toolset)` (tasks/envs/__init__.py): the user's question on the *new*
toolset's tools, with the answer the environment recomputes (never the trace's: that came from the policy
being improved). What it cannot verify is dropped and counted by reason.

Content and split (why not per trace): production repeats itself, and the same question asked twice must
not be trained on and evaluated on. Tasks are deduplicated by content: `data["content"]` where the
environment gives one (desk: content_key, so "What is 3 plus 4?" and "Compute 4 plus 3." are one content),
else family + normalised question + normalised expected. Each content keeps the task of its smallest
trace id, and its split is a sha256 of the content key: the same content lands in the same split in every
run, window and row order, so a content that is held out here is never trained on later either. A
content the environment itself holds out of training (`data["held_out"]`: desk's dev and eval splits,
which the gate asks) always goes to eval, so production train never carries the gate's questions.

Output under OUT: train.jsonl and eval.jsonl (Task.to_dict rows, by task_id), summary.json (counts, which
reconcile: traces == mapped + unverifiable, mapped == train + eval + duplicates; and the GX result). Both
files are read back and checked with the suite include/gx/production_tasks.json; a failure raises
BatchValidationError after everything is written, so that the files can be inspected.
"""

from __future__ import annotations

import gzip
import json
import logging
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasks.envs.base import Task, hash_split, normalise_answer
from tasks.storage import write_atomic

if TYPE_CHECKING:
    from tasks.data.validation import SuiteOutcome, Validator
    from tasks.envs import Environment

log = logging.getLogger(__name__)
SUITE = "production_tasks"
SPLIT_SALT = "production-tasks-1"  # changing it reshuffles every content between train and eval: don't
N_WORKLOAD_PROBE = 64  # tasks drawn to learn which families an environment has on a toolset


def trace_files(accepted: str | Path) -> list[Path]:
    """The JSONL files to read: a file; ingest's accepted/ parts; else every *.jsonl(.gz) below a directory."""
    path = Path(accepted)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such file or directory of accepted traces")
    if (path / "accepted").is_dir():  # ingest's output: its quarantine/ holds no traces
        path = path / "accepted"
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith((".jsonl", ".jsonl.gz")))
    if not files:
        raise FileNotFoundError(f"{path}: no *.jsonl or *.jsonl.gz files (ingest writes accepted/part-*.jsonl)")
    return files


def read_traces(files: list[Path]) -> Iterator[dict | None]:
    """(trace dict or None for a line that is no JSON object) per non-blank line."""
    for f in files:
        with gzip.open(f, "rt", encoding="utf-8") if f.name.endswith(".gz") else f.open(encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    try:
                        row = json.loads(line)
                    except ValueError:
                        row = None
                    yield row if isinstance(row, dict) else None


def content_of(task: Task) -> str:
    """The task's content as a string key: the environment's data["content"], else a generic one."""
    if task.data.get("content") is not None:
        return json.dumps(task.data["content"])
    question = " ".join(task.question.lower().split()).rstrip(" ?.!")
    return json.dumps([task.family, question, normalise_answer(task.expected)])


def split_of_content(content: str, eval_share: float) -> str:
    """'eval' for a share `eval_share` of the content hash space (sha256: hash() is salted per process)."""
    return hash_split(f"{SPLIT_SALT}|{content}", (("eval", eval_share), ("train", 1.0 - eval_share)))


def _map(rows: Iterable[dict | None], env: Environment, toolset: dict) -> tuple[list[Task], Counter, int]:
    """Traces -> tasks; (tasks, unverifiable count by reason, traces read)."""
    tasks: list[Task] = []
    dropped: Counter = Counter()
    seen: set[str] = set()
    n = 0
    task_from_trace = env.task_from_trace
    assert task_from_trace is not None  # tasks_from_traces checks it first
    for trace in rows:
        n += 1
        trace_id = trace.get("trace_id") if trace else None
        if not isinstance(trace_id, str) or not trace_id:
            dropped["bad_json" if trace is None else "no_trace_id"] += 1
            continue
        if trace_id in seen:  # parts of overlapping windows: the task id would repeat
            dropped["repeated_trace_id"] += 1
            continue
        seen.add(trace_id)
        assert trace is not None  # it has a trace id
        if not any(
            isinstance(m, dict)
            and m.get("role") == "user"
            and isinstance(m.get("content"), str)
            and m["content"].strip()
            for m in trace.get("messages") or []
        ):
            dropped["no_user_message"] += 1
            continue
        try:
            task = task_from_trace(trace, toolset)
        except Exception as e:  # one odd trace must not stop the window; the count shows a hook bug
            if not dropped["hook_error"]:
                log.warning("%s.task_from_trace failed on trace %s: %s: %s", env.name, trace_id, type(e).__name__, e)
            dropped["hook_error"] += 1
            continue
        if task is None:
            dropped["not_verifiable"] += 1
        elif not str(task.expected).strip():
            dropped["no_expected_answer"] += 1
        else:
            tasks.append(task)
    return tasks, dropped, n


def _trace_id(task: Task) -> str:
    return str(task.data.get("trace_id") or task.task_id)


def validate_files(
    out: Path, workloads: list[str], required_splits: list[str], min_tasks: int = 1, validator: Validator | None = None
) -> SuiteOutcome:
    """The suite include/gx/production_tasks.json on train.jsonl + eval.jsonl as written (a SuiteOutcome)."""
    import pandas as pd

    from tasks.data.validation import Validator

    rows = []
    for split in ("train", "eval"):
        for line in (out / f"{split}.jsonl").read_text().splitlines():
            if line.strip():
                task = Task.from_dict(json.loads(line))
                rows.append(
                    {
                        "task_id": task.task_id,
                        "family": task.family,
                        "question": task.question,
                        "expected": task.expected,
                        "content": content_of(task),
                        "split": split,
                    }
                )
    columns = ("task_id", "family", "question", "expected", "content", "split")
    frame = pd.DataFrame({c: [r[c] for r in rows] for c in columns})
    params = {"workloads": list(workloads), "required_splits": list(required_splits), "min_tasks": min_tasks}
    return (validator or Validator()).validate(SUITE, frame, params)


def tasks_from_traces(
    accepted: str | Path,
    env_name: str,
    toolset: dict | list | str | Path,
    out_dir: str | Path,
    eval_share: float = 0.25,
    workloads: list[str] | None = None,
    min_tasks: int = 1,
    validator: Validator | None = None,
) -> dict:
    """Write train.jsonl, eval.jsonl and summary.json under `out_dir`; returns the summary.

    toolset: load_toolset's {version, tools} (or anything the environment's load_toolset reads): the tools
    the tasks offer. workloads: the families allowed (default: those the environment generates on
    `toolset`). Raises ValueError for an environment without task_from_trace, and BatchValidationError
    (after writing) when the GX suite fails.
    """
    from tasks.envs import get_env

    if not 0.0 <= eval_share <= 1.0:
        raise ValueError(f"eval_share={eval_share}: a share of the content, in [0, 1]")
    env = get_env(env_name)
    if env.task_from_trace is None:
        raise ValueError(
            f"environment {env.name!r} has no task_from_trace: it cannot turn production traces into "
            f"tasks it verifies; give its Environment a task_from_trace(trace, toolset) (tasks/envs/__init__.py)"
        )
    toolset = env.load_toolset(toolset)
    if workloads is None:
        workloads = sorted({t.family for t in env.generate_tasks(N_WORKLOAD_PROBE, 0, toolset)})

    tasks, dropped, n_traces = _map(read_traces(trace_files(accepted)), env, toolset)
    by_content: dict[str, Task] = {}
    for task in tasks:  # the smallest trace id represents its content: the same pick in any row order
        key = content_of(task)
        if key not in by_content or _trace_id(task) < _trace_id(by_content[key]):
            by_content[key] = task
    splits: dict[str, list[Task]] = {"train": [], "eval": []}
    for key, task in by_content.items():
        # content the environment holds out of training (desk's dev and eval splits: the gate's tasks) stays
        # out of production train too, or a run would train on the questions its gate asks
        held_out = task.data.get("held_out", False)
        splits["eval" if held_out else split_of_content(key, eval_share)].append(task)

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in splits.items():
        rows.sort(key=lambda t: t.task_id)
        write_atomic(out / f"{name}.jsonl", "".join(json.dumps(t.to_dict()) + "\n" for t in rows))
    summary: dict[str, Any] = {
        "env": env.name,
        "toolset": toolset.get("version"),
        "eval_share": eval_share,
        "traces": n_traces,
        "mapped": len(tasks),
        "unverifiable": sum(dropped.values()),
        "unverifiable_by_reason": dict(sorted(dropped.items())),
        "duplicates": len(tasks) - len(by_content),
        "train": len(splits["train"]),
        "eval": len(splits["eval"]),
        "families": {name: dict(sorted(Counter(t.family for t in rows).items())) for name, rows in splits.items()},
    }
    if (
        summary["traces"] != summary["mapped"] + summary["unverifiable"]
        or summary["mapped"] != summary["train"] + summary["eval"] + summary["duplicates"]
    ):
        raise RuntimeError(f"production tasks: counts do not reconcile: {summary}")  # a bug here, not bad data
    required = [s for s, share in (("train", 1 - eval_share), ("eval", eval_share)) if share > 0]
    outcome = validate_files(out, workloads, required, min_tasks, validator)
    summary["validation"] = outcome.to_dict()
    write_atomic(out / "summary.json", json.dumps(summary, indent=1))
    log.info(
        "tasks from production (%s, toolset %s): %d traces -> %d train, %d eval (%d duplicates, unverifiable %s)",
        env.name,
        summary["toolset"],
        n_traces,
        summary["train"],
        summary["eval"],
        summary["duplicates"],
        summary["unverifiable_by_reason"],
    )
    outcome.raise_for_failure()
    return summary


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Training and eval tasks from accepted production traces.")
    parser.add_argument("accepted", help="ingest's output dir, a dir of *.jsonl(.gz) parts, or one file")
    parser.add_argument("out_dir")
    from tasks.config_sections import EnvSettings

    parser.add_argument(
        "--env",
        default=EnvSettings.model_fields["name"].default,
        help="env.name: an entry point, module:factory or a spec (default: env.name's default)",
    )
    parser.add_argument("--toolset", default="2", help="a shipped version or anything load_toolset reads")
    parser.add_argument("--eval-share", type=float, default=0.25)
    a = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    print(
        json.dumps(
            {
                k: v
                for k, v in tasks_from_traces(a.accepted, a.env, a.toolset, a.out_dir, a.eval_share).items()
                if k != "validation"
            },
            indent=1,
        )
    )
