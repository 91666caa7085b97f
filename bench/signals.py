"""Signals benchmark: ingest + validation (schema, GX) + drift over simulated production traces.

    python bench/signals.py            # 100,000 and 1,000,000 traces (about 2 minutes here)
    python bench/signals.py --quick    # 20,000 and 100,000 traces (under a minute)

Prints one JSON line: traces/s of the large run (ingest with validation, then the drift comparison
against the small run), the peak RSS of each ingest (each in its own process, so the peaks are its
own), their ratio (flat memory: close to 1 while the input grows 10x), and the per-row parse-and-check
speed of the ingest path (orjson + compiled fastjsonschema) against its peer, the stdlib json module
with the reference `jsonschema` validator, on the same rows.

The traces are 2,000 scripted episodes (tasks.signals.simulate), copied with fresh trace ids into one
plain JSONL file per size, so the figure measures ingestion rather than the simulator or gzip.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def base_lines(n: int = 2000) -> list[bytes]:
    from tasks.signals.simulate import simulate_traces

    start = datetime.now(UTC) - timedelta(days=2)
    with tempfile.TemporaryDirectory() as d:
        simulate_traces(d, start, start + timedelta(days=1), n, [(start, "1")], seed=3)
        import gzip

        return [line for f in sorted(Path(d).rglob("*.jsonl.gz")) for line in gzip.open(f).read().splitlines()]


def write_input(path: Path, lines: list[bytes], n: int) -> None:
    """n lines cycling through `lines`, each with a unique 20-character trace id (same length)."""
    prefix = b'{"trace_id": "'
    assert all(line.startswith(prefix) for line in lines)
    with open(path, "wb", buffering=1 << 22) as f:
        for i in range(n):
            line = lines[i % len(lines)]
            f.write(prefix + b"%020x" % i + line[len(prefix) + 20 :] + b"\n")


def run_ingest(input_path: Path, out_dir: Path) -> dict:
    """Ingest in a child process; returns its summary, wall seconds and peak RSS (MiB)."""
    code = (
        "import json,sys,resource; from tasks.config import load_settings; from tasks.signals.ingest import ingest;"
        f"s=ingest({str(input_path)!r},{str(out_dir)!r},load_settings().ingest,docs=False);"
        "s['peak_rss_mib']=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss/1024; print(json.dumps(s))"
    )
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    if proc.returncode:
        raise SystemExit(f"ingest of {input_path} failed:\n{proc.stderr[-3000:]}")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    summary["wall_s"] = time.perf_counter() - started
    return summary


def parse_peer_ratio(lines: list[bytes], rows: int = 5000) -> dict:
    """Rows/s of the ingest row check against stdlib json + jsonschema on the same rows."""
    import jsonschema

    from tasks.signals.rows import SCHEMA_PATH, RowParser

    sample = (lines * (rows // len(lines) + 1))[:rows]
    parser = RowParser(1 << 20)
    t = time.perf_counter()
    for line in sample:
        parser.parse(line)
    ours = rows / (time.perf_counter() - t)
    validator = jsonschema.Draft7Validator(json.loads(SCHEMA_PATH.read_text()))
    t = time.perf_counter()
    for line in sample:
        validator.validate(json.loads(line.decode()))
    peer = rows / (time.perf_counter() - t)
    return {
        "row_check_per_s": round(ours),
        "peer_row_check_per_s": round(peer),
        "row_check_speedup": round(ours / peer, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    small, large = (20_000, 100_000) if args.quick else (100_000, 1_000_000)
    lines = base_lines()
    with tempfile.TemporaryDirectory(prefix="evergreen-bench-") as d:
        d = Path(d)
        runs = {}
        for n in (small, large):
            write_input(d / f"traces-{n}.jsonl", lines, n)
            runs[n] = run_ingest(d / f"traces-{n}.jsonl", d / f"out-{n}")
            (d / f"traces-{n}.jsonl").unlink()
            (d / f"out-{n}" / "accepted" / "part-00000.jsonl").unlink()
        from tasks.config import load_settings
        from tasks.signals.drift import compare
        from tasks.signals.windowstats import WindowStats

        t = time.perf_counter()
        ref = WindowStats.from_dict(json.loads((d / f"out-{small}" / "stats.json").read_text()))
        cur = WindowStats.from_dict(json.loads((d / f"out-{large}" / "stats.json").read_text()))
        report = compare(ref, cur, load_settings().drift)
        drift_s = time.perf_counter() - t
    big = runs[large]
    print(
        json.dumps(
            {
                "traces": large,
                "traces_per_s": round(large / (big["seconds"] + drift_s)),
                "ingest_seconds": big["seconds"],
                "drift_seconds": round(drift_s, 3),
                "drifted": report.drifted,
                "rows_accepted": big["rows_accepted"],
                "rows_quarantined": big["rows_quarantined"],
                f"peak_rss_mib_{small}": round(runs[small]["peak_rss_mib"], 1),
                f"peak_rss_mib_{large}": round(big["peak_rss_mib"], 1),
                "peak_rss_ratio": round(big["peak_rss_mib"] / runs[small]["peak_rss_mib"], 3),
                **parse_peer_ratio(lines),
            }
        )
    )


if __name__ == "__main__":
    main()
