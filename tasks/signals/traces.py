"""Reading production traces: time windows, the files of a window, and their lines.

    from tasks.signals.traces import Window, select_files, numbered_lines
    window = Window.parse("2026-12-01/2026-12-02")       # or one date, or RFC 3339 times; either side open
    for uri in select_files("s3://bucket/traces/", window):
        for line_no, raw in numbered_lines(uri): ...

Input: JSONL files (optionally `.gz`) under a local directory or an `s3://` prefix, or one file. Files in
date-partitioned paths (`.../2026-12-01/...`, `date=2026-12-01`, `2026/12/01`) outside the window are
not opened; undated files always are. Lines are streamed (tasks.storage.iter_lines): memory does not
grow with the file. Validating the rows and the window is tasks.signals.rows and tasks.signals.ingest.
"""

from __future__ import annotations

import gzip
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import BinaryIO, cast

from tasks import storage

TRACE_SUFFIXES = (".jsonl", ".jsonl.gz", ".ndjson", ".ndjson.gz")  # a .json beside them is a manifest, not traces
_DAY_PATTERNS = (re.compile(r"(\d{4})-(\d{2})-(\d{2})"), re.compile(r"(\d{4})/(\d{2})/(\d{2})"))


class IngestError(ValueError):
    pass


@dataclass(frozen=True)
class Window:
    """A half-open time window [start, end); either side may be open (None)."""

    start: datetime | None = None
    end: datetime | None = None

    @classmethod
    def parse(cls, text: str | None) -> Window:
        """'START/END' with RFC 3339 times or dates (a date means its midnight UTC), or one date (that day)."""
        if not text:
            return cls()
        if "/" not in text:
            day = _parse_time(text)
            return cls(day, day + timedelta(days=1))
        a, _, b = text.partition("/")
        w = cls(_parse_time(a) if a else None, _parse_time(b) if b else None)
        if w.start and w.end and w.end <= w.start:
            raise ValueError(f"window {text!r} ends before it starts: give START/END with START < END")
        return w

    def days_before(self, days: int) -> Window:
        """The reference window: the `days` days that end where this one starts."""
        if self.start is None:
            raise ValueError("a reference of the days before needs a current window with a start")
        return Window(self.start - timedelta(days=days), self.start)

    def contains_day(self, day: date) -> bool:
        lo = datetime(day.year, day.month, day.day, tzinfo=UTC)
        return (self.end is None or lo < self.end) and (self.start is None or lo + timedelta(days=1) > self.start)

    def __str__(self) -> str:
        return f"{self.start.isoformat() if self.start else ''}/{self.end.isoformat() if self.end else ''}"


def _parse_time(text: str) -> datetime:
    try:
        t = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"{text!r} is not an RFC 3339 time or a YYYY-MM-DD date") from None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def select_files(source: str | Path, window: Window) -> list[str]:
    """Trace files under `source` whose date partition (if the path has one) meets the window."""
    files = storage.list_files(source, TRACE_SUFFIXES)
    out = []
    for uri in files:
        day = _path_day(uri)
        if day is None or window.contains_day(day):
            out.append(uri)
    return out


def _path_day(uri: str) -> date | None:
    for pattern in _DAY_PATTERNS:
        found = pattern.findall(uri)
        if found:
            try:
                return date(*map(int, found[-1]))
            except ValueError:
                return None
    return None


def iter_file_lines(uri: str) -> Iterator[bytes]:
    raw = stream = storage.open_binary(uri)
    try:
        if uri.endswith(".gz"):
            stream = cast(BinaryIO, gzip.GzipFile(fileobj=raw))
        lines = storage.iter_lines(stream)
        first = next(lines, None)
        if first is not None:
            yield first[3:] if first.startswith(b"\xef\xbb\xbf") else first  # a BOM from Windows tools
        yield from lines
    finally:
        stream.close()
        if stream is not raw:
            raw.close()  # GzipFile does not close a file object it was given


def numbered_lines(uri: str) -> Iterator[tuple[int, bytes]]:
    """(line number, line); a file that cannot be read to its end (truncated gzip, I/O error) stops the
    window with the file and the line reached: its remaining rows cannot be accounted for."""
    line_no = 0
    try:
        for line_no, raw in enumerate(iter_file_lines(uri), start=1):
            yield line_no, raw
    except (EOFError, OSError, zlib.error) as e:
        raise IngestError(
            f"{uri}: unreadable after line {line_no} ({type(e).__name__}: {e}); "
            "repair or remove the file and ingest the window again"
        ) from None
