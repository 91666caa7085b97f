"""The rollout batches of a GRPO run, sampled one step ahead in asynchronous mode (`grpo.async`).

    batches = Lookahead(batch, steps=g.steps, ahead=g.async_ is not None, timeout_s=900)
    records = batches.take(step)   # this step's records; in async mode the next step's batch starts sampling
    ...update...
    batches.settle()               # before the weight sync: the batch in flight keeps the weights it started with
    batches.close()

Synchronous (the default): `take` samples the step's batch and returns it. Asynchronous, one step off (NeMo RL's,
verl's, prime-rl's and AReaL's mode): step t+1's batch samples on the engines, at the weights step t trains
from, while step t updates; the trainer syncs the new weights only once that batch is done, so every record is
exactly one version stale and no engine changes weights mid-episode. Where this departs from those systems: no
in-flight weight update (vLLM's abort-and-resume of running requests); the wait before a sync has a timeout
that fails the job with the step named instead of hanging on a stuck batch.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout


class Lookahead:
    def __init__(self, batch: Callable[[int], list[dict]], steps: int, ahead: bool, timeout_s: float = 900) -> None:
        self.batch, self.steps, self.timeout_s = batch, steps, timeout_s
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="rollouts-ahead") if ahead else None
        self.next: Future | None = None
        self.next_step = -1

    def take(self, step: int) -> list[dict]:
        """The records of `step` (sampled ahead when they were); in async mode, starts step + 1's batch."""
        records = self.next.result() if self.next is not None and self.next_step == step else self.batch(step)
        self.next = None
        if self.pool is not None and step + 1 < self.steps:
            self.next, self.next_step = self.pool.submit(self.batch, step + 1), step + 1
        return records

    def settle(self) -> None:
        """Wait for the batch in flight (its error raised here); RuntimeError past the timeout."""
        if self.next is None:
            return
        try:
            self.next.result(timeout=self.timeout_s)
        except FutureTimeout:
            raise RuntimeError(
                f"grpo.async: the rollouts of step {self.next_step + 1} were still running after "
                f"{self.timeout_s:g} s, so the next weights could not be sent; check the rollout actors "
                "(Ray dashboard), or raise grpo.async.timeout_s"
            ) from None

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
