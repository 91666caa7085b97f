"""Read production traces, validate them, quarantine bad rows, and summarise the window for drift tests.

    from tasks.signals.ingest import ingest
    from tasks.signals.traces import Window
    summary = ingest("s3://bucket/traces/", "runs/x/ingest", settings, Window.parse("2026-12-01/2026-12-02"))
    # or: python -m tasks ingest --input PATH --output DIR [--window START/END]

Input: JSONL files (optionally `.gz`) under a local directory or an `s3://` prefix, or one file; files
of date partitions outside the window are not opened (reading: tasks.signals.traces). Everything is
streamed in chunks of `ingest.chunk_rows` rows, so memory does not grow with the input (the duplicate
check keeps 8 bytes per accepted trace id).

Per row (in this order; the first failure is the row's reason): line length, UTF-8, JSON, the trace
schema (`include/schemas/trace.schema.json`: structure, types, RFC 3339 timestamps; tasks.signals.rows),
a trace_id not seen before in this window. Per chunk: the Great Expectations suite `traces` (value
ranges, timestamps not in the future, tool errors <= tool calls, ...); rows it flags are quarantined
with the expectation's reason. Per window: the suites `traces_window` (not empty, share of bad rows)
and `traces_workloads` (required workloads present); a failure raises BatchValidationError after
everything has been written, so that the quarantine and the data docs can be inspected.

Rows whose timestamp lies outside [start, end) but not in the future belong to another window: they
are counted as `rows_outside_window` and left where they are. Blank lines are not rows. Every other
line is either accepted or quarantined: rows_read == rows_accepted + rows_quarantined, checked.

Output under DIR: accepted/part-00000.jsonl (the accepted lines, byte for byte), quarantine/part-00000.jsonl
(`{"source", "line", "reason", "raw" | "raw_base64"}`), stats.json (drift statistics of the accepted
rows), validation.json (every chunk's and the window's expectations with observed values), gx_docs/
(GX data docs: the window suites and the first five chunks, each rendering costs ~0.3 s), summary.json.
"""

from __future__ import annotations

import base64
import json
import logging
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

from tasks import storage
from tasks.signals.rows import FLAT_COLUMNS, RowParser
from tasks.signals.traces import IngestError, Window, numbered_lines, select_files
from tasks.signals.windowstats import WindowStats

if TYPE_CHECKING:
    import ctypes

    from tasks.config_deployment import IngestSettings
    from tasks.data.validation import Validator

log = logging.getLogger(__name__)


def _trim_heap() -> None:
    """Hand freed chunk memory back to the OS (glibc keeps it otherwise, and RSS creeps up ~3 MB a
    chunk from fragmentation although Python's own allocations stay flat)."""
    global _LIBC
    if _LIBC is None:
        import ctypes
        import ctypes.util

        try:
            _LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _LIBC.malloc_trim  # noqa: B018 - absent outside glibc
        except (OSError, AttributeError):
            _LIBC = False
    if _LIBC:
        _LIBC.malloc_trim(0)


_LIBC: ctypes.CDLL | Literal[False] | None = None


class _Seen:
    """Trace ids accepted so far, as a sorted array of 64-bit hashes: 8 bytes per id, checked a chunk
    at a time with numpy. Python's str hash is used: it only has to agree within this process, and a
    collision needs ~4e9 ids."""

    def __init__(self) -> None:
        self._sorted: np.ndarray = np.empty(0, dtype=np.int64)

    def first_occurrences(self, trace_ids: list[str]) -> np.ndarray:
        """Mask of the ids not seen before (in earlier chunks or earlier in this one); remembers them."""
        keys = np.fromiter(map(hash, trace_ids), dtype=np.int64, count=len(trace_ids))
        _, first = np.unique(keys, return_index=True)
        new: np.ndarray = np.zeros(len(keys), dtype=bool)
        new[first] = True
        if self._sorted.size:
            pos = np.searchsorted(self._sorted, keys).clip(max=self._sorted.size - 1)
            new &= self._sorted[pos] != keys
        self._sorted = np.union1d(self._sorted, keys[new])
        return new


class _Writer:
    """Appends lines to DIR/<kind>/part-00000.jsonl through a buffered file."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path, self.rows = path, 0
        self._f = open(path, "wb", buffering=1 << 20)  # noqa: SIM115 (closed by close(): rows stream in)

    def write(self, line: bytes) -> None:
        self._f.write(line)
        self._f.write(b"\n")
        self.rows += 1

    def close(self) -> None:
        self._f.close()


def _quarantine_line(source: str, line_no: int, reason: str, raw: bytes) -> bytes:
    entry: dict = {"source": source, "line": line_no, "reason": reason}
    try:
        entry["raw"] = raw.decode("utf-8")
    except UnicodeDecodeError:  # keep the exact bytes: nothing is lost, even what is not text
        entry["raw_base64"] = base64.b64encode(raw).decode("ascii")
    return json.dumps(entry, ensure_ascii=False).encode("utf-8")


def ingest(
    source: str | Path,
    output_dir: str | Path,
    ingest_settings: IngestSettings,
    window: Window | None = None,
    now: datetime | None = None,
    docs: bool = True,
) -> dict:
    """Stream, validate and split one window of traces; returns the summary (also DIR/summary.json).

    Raises BatchValidationError (after writing everything) when the window fails a batch expectation.
    """
    from tasks.data.validation import Validator

    cfg = ingest_settings
    window = window or Window()
    now = now or datetime.now(UTC)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = select_files(source, window)
    log.info("ingest %s window %s: %d file(s)", source, window, len(files))
    started = time.perf_counter()
    validator = Validator(out / "gx_docs" if docs else None)
    parser = RowParser(cfg.max_line_bytes)
    accepted, quarantined = (
        _Writer(out / "accepted" / "part-00000.jsonl"),
        _Writer(out / "quarantine" / "part-00000.jsonl"),
    )
    stats, seen = WindowStats(), _Seen()
    # an open start is far in the past (not 1970: older rows are rows too); GX needs a number
    params = {
        "window_start": window.start.timestamp() if window.start else -1e15,
        "future_limit": now.timestamp() + cfg.future_tolerance_s,
    }
    start_ts = params["window_start"]
    end_ts = window.end.timestamp() if window.end else float("inf")
    counts = {"rows_read": 0, "rows_outside_window": 0, "blank_lines": 0}
    chunk_reports: list[dict] = []
    chunk: list[tuple[str, int, bytes, tuple]] = []

    def flush_chunk() -> None:
        report = _validate_chunk(
            chunk, seen, validator, params, accepted, quarantined, stats, docs=docs and len(chunk_reports) < 5
        )
        chunk_reports.append(report)
        chunk.clear()
        _trim_heap()
        log.info(
            "ingest: %d rows read, %d accepted, %d quarantined (%.0f rows/s)",
            counts["rows_read"],
            accepted.rows,
            quarantined.rows,
            counts["rows_read"] / max(time.perf_counter() - started, 1e-9),
        )

    try:
        for uri in files:
            for line_no, raw in numbered_lines(uri):
                if not raw.strip():
                    counts["blank_lines"] += 1
                    continue
                trace, row, reason = parser.parse(raw)
                if reason is None:
                    assert row is not None  # a row comes with every valid line
                    ts = row[0][2]
                    if (ts < start_ts or ts >= end_ts) and ts <= params["future_limit"]:
                        counts["rows_outside_window"] += 1
                        continue
                counts["rows_read"] += 1
                if reason is not None:
                    quarantined.write(_quarantine_line(uri, line_no, reason, raw))
                    continue
                assert row is not None
                chunk.append((uri, line_no, raw, row))
                if len(chunk) >= cfg.chunk_rows:
                    flush_chunk()
        if chunk or not chunk_reports:
            flush_chunk()
    finally:
        accepted.close()
        quarantined.close()
    return _finish_window(
        out,
        source,
        window,
        files,
        counts,
        accepted.rows,
        quarantined.rows,
        stats,
        chunk_reports,
        validator,
        cfg,
        time.perf_counter() - started,
        docs,
    )


def _validate_chunk(
    chunk: list[tuple[str, int, bytes, tuple]],
    seen: _Seen,
    validator: Validator,
    params: dict[str, float],
    accepted: _Writer,
    quarantined: _Writer,
    stats: WindowStats,
    docs: bool,
) -> dict:
    """The GX row suite, then duplicates among the rows it passed (a duplicate of a rejected row is
    the first valid one); the rest is accepted and counted into the drift statistics."""
    import pandas as pd

    if not chunk:
        return {"rows": 0, "duplicates": 0, "failed_rows": 0, "expectations": []}
    columns = list(zip(*(row[0] for _, _, _, row in chunk), strict=True))
    frame = pd.DataFrame({name: col for name, col in zip(FLAT_COLUMNS, columns, strict=True)})
    for name in ("latency_ms", "reward"):  # all-None columns would be 'object'; GX compares numbers
        frame[name] = pd.to_numeric(frame[name], errors="coerce")
    result = validator.validate("traces", frame, params, docs=docs)
    failed = result.failed_rows()
    passed = [item for i, item in enumerate(chunk) if i not in failed]
    first = seen.first_occurrences([row[0][0] for _, _, _, row in passed]).tolist()
    add = stats.add
    for i, (uri, line_no, raw, _) in enumerate(chunk):
        if i in failed:
            quarantined.write(_quarantine_line(uri, line_no, f"gx: {failed[i]}", raw))
    duplicates = 0
    for keep, (uri, line_no, raw, (flat, names, turns, success)) in zip(first, passed, strict=True):
        if not keep:
            duplicates += 1
            reason = f"duplicate trace_id {flat[0][:80]!r} (its first valid occurrence is kept)"
            quarantined.write(_quarantine_line(uri, line_no, reason, raw))
            continue
        accepted.write(raw)
        add(
            flat[1],
            success=success,
            tool_errors=flat[5],
            prompt_tokens=flat[3],
            turns=turns,
            tool_calls=flat[6],
            tool_names=names,
        )
    return {
        "rows": len(chunk),
        "duplicates": duplicates,
        "failed_rows": len(failed),
        "expectations": [e.to_dict() for e in result.expectations if not e.success],
    }


def _finish_window(
    out: Path,
    source: str | Path,
    window: Window,
    files: list[str],
    counts: dict[str, int],
    n_accepted: int,
    n_quarantined: int,
    stats: WindowStats,
    chunk_reports: list[dict],
    validator: Validator,
    cfg: IngestSettings,
    seconds: float,
    docs: bool,
) -> dict:
    import pandas as pd

    from tasks.data.validation import BatchValidationError

    if counts["rows_read"] != n_accepted + n_quarantined:  # an invariant: a broken one is a bug here, not bad data
        raise IngestError(
            f"row counts do not reconcile: read {counts['rows_read']}, accepted {n_accepted}, "
            f"quarantined {n_quarantined}"
        )
    share = n_quarantined / counts["rows_read"] if counts["rows_read"] else 0.0
    window_frame = pd.DataFrame(
        [
            {
                "rows_read": counts["rows_read"],
                "rows_accepted": n_accepted,
                "rows_quarantined": n_quarantined,
                "quarantined_share": share,
            }
        ]
    )
    workloads = pd.DataFrame({"workload": sorted(stats.workloads)}, dtype=object)
    batch = [
        validator.validate(
            "traces_window", window_frame, {"max_quarantine_share": cfg.max_quarantine_share}, docs=docs
        ),
        validator.validate(
            "traces_workloads", workloads, {"required_workloads": list(cfg.required_workloads)}, docs=docs
        ),
    ]
    storage.write_bytes(out / "stats.json", json.dumps(stats.to_dict()).encode())
    verdict = "passed" if all(b.success for b in batch) else "failed"
    summary = {
        "source": str(source),
        "window": str(window),
        "files": len(files),
        **counts,
        "rows_accepted": n_accepted,
        "rows_quarantined": n_quarantined,
        "quarantined_share": round(share, 6),
        "workloads": {w: s.n for w, s in sorted(stats.workloads.items())},
        "verdict": verdict,
        "failed_expectations": [e.message for b in batch for e in b.expectations if not e.success],
        "seconds": round(seconds, 3),
        "rows_per_s": round(counts["rows_read"] / max(seconds, 1e-9), 1),
        "output": str(out),
        "data_docs": str(validator.docs_index() or ""),
    }
    storage.write_bytes(
        out / "validation.json",
        json.dumps({"chunks": chunk_reports, "batch": [b.to_dict() for b in batch]}, indent=1, default=str).encode(),
    )
    storage.write_bytes(out / "summary.json", json.dumps(summary, indent=1).encode())
    log.info(
        "ingest %s: %s (%d read = %d accepted + %d quarantined; %d outside the window)",
        source,
        verdict,
        counts["rows_read"],
        n_accepted,
        n_quarantined,
        counts["rows_outside_window"],
    )
    failures = [e.to_dict() for b in batch for e in b.expectations if not e.success]
    if failures:
        error = BatchValidationError("+".join(b.suite for b in batch if not b.success), failures)
        # the caller (CLI, DAG) reports the summary of a failed window too
        error.summary = summary
        raise error
    return summary
