"""The batches of a GRPO run, synchronous and one step ahead (tasks/rl/lookahead.py), with a batch function that
records which thread sampled which step and when."""

import threading
import time

import pytest

from tasks.rl.lookahead import Lookahead


class Batches:
    def __init__(self, seconds: float = 0.0, fail_at: int | None = None) -> None:
        self.calls: list[tuple[int, str]] = []
        self.seconds, self.fail_at = seconds, fail_at

    def __call__(self, step: int) -> list[dict]:
        self.calls.append((step, threading.current_thread().name))
        time.sleep(self.seconds)
        if step == self.fail_at:
            raise ValueError(f"actor lost at step {step}")
        return [{"step": step}]


def test_synchronous_samples_each_step_when_taken():
    b = Batches()
    ahead = Lookahead(b, steps=3, ahead=False)
    assert [ahead.take(s)[0]["step"] for s in range(3)] == [0, 1, 2]
    ahead.settle()
    assert [s for s, _ in b.calls] == [0, 1, 2]
    assert all(name == threading.current_thread().name for _, name in b.calls)


def test_async_samples_the_next_step_while_this_one_updates():
    b = Batches(seconds=0.2)
    ahead = Lookahead(b, steps=3, ahead=True, timeout_s=10)
    assert ahead.take(0) == [{"step": 0}]  # the first batch: sampled now, step 1's started behind it
    t0 = time.time()
    time.sleep(0.2)  # "the update" overlaps step 1's sampling
    ahead.settle()
    assert time.time() - t0 < 0.35
    assert ahead.take(1) == [{"step": 1}] and ahead.take(2) == [{"step": 2}]
    ahead.settle()  # nothing in flight after the last step
    ahead.close()
    assert [s for s, _ in b.calls] == [0, 1, 2]  # each step sampled once
    assert b.calls[0][1] == threading.current_thread().name and b.calls[1][1].startswith("rollouts-ahead")


def test_a_resumed_run_samples_its_first_step_now():
    b = Batches()
    ahead = Lookahead(b, steps=5, ahead=True)
    assert ahead.take(3) == [{"step": 3}] and ahead.take(4) == [{"step": 4}]
    assert [s for s, _ in b.calls] == [3, 4]


def test_a_stuck_batch_fails_with_the_step_instead_of_hanging():
    ahead = Lookahead(Batches(seconds=1.0), steps=3, ahead=True, timeout_s=0.1)
    ahead.take(0)
    with pytest.raises(RuntimeError, match="rollouts of step 2 were still running after 0.1 s"):
        ahead.settle()
    ahead.close()


def test_a_failed_batch_raises_where_the_trainer_waits():
    ahead = Lookahead(Batches(fail_at=1), steps=3, ahead=True)
    ahead.take(0)
    with pytest.raises(ValueError, match="actor lost at step 1"):
        ahead.settle()
