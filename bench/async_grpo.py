"""Synchronous against asynchronous GRPO (`grpo.async`, one step off), side by side in one run: seconds per step
and the v2 gain after the same steps. Prints one JSON line.

    python bench/async_grpo.py                                   # bootstraps a champion, 10 steps each
    python bench/async_grpo.py --init runs/local/champion --set grpo.steps=20

Both arms start from the same champion with the same settings and seeds (bench/lora.py's `arm`: `python -m
tasks train`, then `python -m tasks eval --against` the champion on both toolsets); the async arm adds
`grpo.async.max_staleness=1`. A step's seconds are its rollout wait, update, wait for the batch sampling ahead,
and weight sync (metrics.jsonl); the async arm's rollout wait is near zero when the overlap works.
"""

from __future__ import annotations

import json
import sys

from lora import arm, arms_parser, starting_point


def main(argv: list[str] | None = None) -> int:
    args = arms_parser(__doc__, "async").parse_args(argv)
    out, champion = starting_point(args)
    sync = arm(args, "sync", [], champion, out)
    ahead = arm(args, "async", ["grpo.async.max_staleness=1"], champion, out)
    ratio = round(sync["step_s"] / ahead["step_s"], 3) if ahead["step_s"] else None
    print(json.dumps({"bench": "async_grpo", "sync": sync, "async": ahead, "steps_per_s_async_over_sync": ratio}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
