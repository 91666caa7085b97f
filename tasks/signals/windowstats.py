"""Streamed sufficient statistics of a window of production traces, per workload (the drift tests' input).

    from tasks.signals.windowstats import WindowStats

    ref = WindowStats()
    for t in reference_traces:                  # one call per trace, ~1 µs, memory stays flat
        ref.add(t.workload, success=..., tool_errors=..., prompt_tokens=..., turns=..., tool_calls=...,
                tool_names=[...])
    ref.merge(other_chunk)                      # joins chunks; to_dict() / from_dict() for stats.json

A window keeps, per workload, only counts: traces, successes, traces with a tool error, and histograms
(Counters) of prompt tokens, turns, tool calls and tool names; tasks.signals.drift.compare tests two
windows against each other.

Prompt tokens are bucketed before counting so that a histogram stays small: exact below 256, above it
rounded down to 16 buckets per doubling (256, 272, ..., 496, 512, 544, ..., 1024, 1088, ...), i.e. a
relative bucket width of at most 1/16. At most ~450 distinct keys up to 1M tokens. The KS statistic is
that of the bucketed values (it can only be smaller than the raw one, by at most one bucket's mass).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

_EXACT_BELOW = 256  # prompt tokens below this are counted exactly
_MANTISSA_BITS = 4  # above it: 2**4 = 16 buckets per doubling
_FORMAT_VERSION = 1


def bucket_prompt_tokens(tokens: int) -> int:
    """Lower edge of the prompt-token bucket of `tokens` (exact below 256, 16 buckets per doubling above)."""
    tokens = int(tokens)
    if tokens < _EXACT_BELOW:
        return tokens
    shift = tokens.bit_length() - 1 - _MANTISSA_BITS
    return tokens >> shift << shift


def _int_counter(d: dict, what: str) -> Counter:
    try:
        return Counter({int(k): int(v) for k, v in d.items()})
    except (TypeError, ValueError, AttributeError):
        raise ValueError(f"{what}: expected a mapping of integer values to counts, got {d!r}") from None


@dataclass(slots=True)
class WorkloadStats:
    """Counts of one workload in one window. Histograms are Counters: value -> traces (names -> calls)."""

    n: int = 0
    successes: int = 0
    with_tool_error: int = 0
    prompt_tokens: Counter = field(default_factory=Counter)  # bucketed, see bucket_prompt_tokens
    turns: Counter = field(default_factory=Counter)
    tool_calls: Counter = field(default_factory=Counter)
    tool_names: Counter = field(default_factory=Counter)

    def merge(self, other: WorkloadStats) -> None:
        self.n += other.n
        self.successes += other.successes
        self.with_tool_error += other.with_tool_error
        self.prompt_tokens.update(other.prompt_tokens)
        self.turns.update(other.turns)
        self.tool_calls.update(other.tool_calls)
        self.tool_names.update(other.tool_names)

    def to_dict(self) -> dict:
        # JSON keys are strings; sorted so that equal stats serialise identically
        def hist(c: Counter) -> dict:
            return {str(k): c[k] for k in sorted(c)}

        return {
            "n": self.n,
            "successes": self.successes,
            "with_tool_error": self.with_tool_error,
            "prompt_tokens": hist(self.prompt_tokens),
            "turns": hist(self.turns),
            "tool_calls": hist(self.tool_calls),
            "tool_names": hist(self.tool_names),
        }

    @classmethod
    def from_dict(cls, d: dict) -> WorkloadStats:
        missing = [f.name for f in fields(cls) if f.name not in d]
        if missing:
            raise ValueError(f"workload stats lack {missing}; expected the output of WorkloadStats.to_dict()")
        return cls(
            n=int(d["n"]),
            successes=int(d["successes"]),
            with_tool_error=int(d["with_tool_error"]),
            prompt_tokens=_int_counter(d["prompt_tokens"], "prompt_tokens"),
            turns=_int_counter(d["turns"], "turns"),
            tool_calls=_int_counter(d["tool_calls"], "tool_calls"),
            tool_names=Counter({str(k): int(v) for k, v in d["tool_names"].items()}),
        )


@dataclass(slots=True)
class WindowStats:
    """Per-workload counts of one window of traces; `add` once per trace, `merge` to join chunks."""

    workloads: dict[str, WorkloadStats] = field(default_factory=dict)

    def add(
        self,
        workload: str,
        *,
        success: bool,
        tool_errors: int,
        prompt_tokens: int,
        turns: int,
        tool_calls: int,
        tool_names: Sequence[str],
    ) -> None:
        # Hot path (once per trace): plain attribute and Counter updates only. Checked before any update so
        # a bad trace leaves the stats untouched; `a | b` of ints is negative iff one of them is.
        try:
            bad = (tool_errors | prompt_tokens | turns | tool_calls) < 0 or isinstance(tool_names, str)
        except TypeError:
            # not all ints: JSON Schema's "integer" also admits 512.0, so integral floats are accepted
            values: tuple[float, ...] = (tool_errors, prompt_tokens, turns, tool_calls)
            bad = not all(
                isinstance(v, float) and v.is_integer() and v >= 0 or isinstance(v, int) and v >= 0 for v in values
            ) or isinstance(tool_names, str)
            if not bad:
                tool_errors, prompt_tokens, turns, tool_calls = map(int, values)
        if bad:
            raise ValueError(
                f"trace of workload {workload!r}: tool_errors={tool_errors!r}, prompt_tokens={prompt_tokens!r}, "
                f"turns={turns!r}, tool_calls={tool_calls!r} must be non-negative ints and tool_names a "
                f"list of names (got {tool_names!r}); fix the trace parser"
            )
        w = self.workloads.get(workload)
        if w is None:
            w = self.workloads[workload] = WorkloadStats()
        w.n += 1
        if success:
            w.successes += 1
        if tool_errors:
            w.with_tool_error += 1
        w.prompt_tokens[bucket_prompt_tokens(prompt_tokens) if prompt_tokens >= _EXACT_BELOW else prompt_tokens] += 1
        w.turns[turns] += 1
        w.tool_calls[tool_calls] += 1
        for name in tool_names:
            w.tool_names[name] += 1

    def merge(self, other: WindowStats) -> None:
        for name, stats_ in other.workloads.items():
            mine = self.workloads.get(name)
            if mine is None:
                mine = self.workloads[name] = WorkloadStats()
            mine.merge(stats_)

    def total(self) -> int:
        return sum(w.n for w in self.workloads.values())

    def to_dict(self) -> dict:
        return {
            "version": _FORMAT_VERSION,
            "prompt_token_buckets": f"exact<{_EXACT_BELOW}, {2**_MANTISSA_BITS} per doubling above",
            "workloads": {name: self.workloads[name].to_dict() for name in sorted(self.workloads)},
        }

    @classmethod
    def from_dict(cls, d: dict) -> WindowStats:
        if d.get("version") != _FORMAT_VERSION or "workloads" not in d:
            raise ValueError(
                f"window stats of version {d.get('version')!r}, expected {_FORMAT_VERSION} with "
                "'workloads'; recompute them from the traces with this code"
            )
        return cls({name: WorkloadStats.from_dict(w) for name, w in d["workloads"].items()})
