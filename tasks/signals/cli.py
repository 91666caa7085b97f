"""The signals commands of `python -m tasks` (ingest, drift, tooldiff, simulate); each prints one JSON line.

    python -m tasks ingest --input PATH --output DIR [--window 2026-12-01/2026-12-02]
    python -m tasks ingest --input mlflow:EXPERIMENT --output DIR --window 2026-12-01   # or otel:spans.json
    python -m tasks drift --reference REF --current CUR [--reference-window W] [--current-window W] [--out FILE]
    python -m tasks drift --current TRACES --current-window 2026-12-01 --reference-days 7
    python -m tasks monitor --input PATH --window 2026-12-01 --champion DIR --toolset SRC --output DIR
    python -m tasks tooldiff OLD NEW            # toolset files, s3:// objects, OpenAPI documents, or versions 1, 2
    python -m tasks simulate --out DIR --start 2026-11-20 --end 2026-11-24 --traces 2000 --change-at 2026-11-22

REF and CUR are ingest outputs (a directory with stats.json) or trace inputs, which are then ingested
first (into DIR/ingest_reference and DIR/ingest_current beside --out, else a temporary directory).
Exit status: 0, or 1 when a window fails validation (its summary is still printed), 2 on bad arguments.
"""

from __future__ import annotations

import json
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse

    from tasks.config import Settings


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("ingest", help="validate a window of production traces; quarantine bad rows")
    p.add_argument(
        "--input",
        required=True,
        help="a JSONL(.gz) file, a directory, an s3:// prefix, "
        "mlflow:EXPERIMENT (MLflow traces) or otel:FILE.json (OTLP JSON GenAI spans)",
    )
    p.add_argument("--output", required=True)
    p.add_argument("--window", help="START/END (RFC 3339 or dates) or one date; default: everything")
    p = sub.add_parser("drift", help="drift tests between a reference and a current window")
    p.add_argument("--reference", help="default: --current (with --reference-days)")
    p.add_argument("--current", required=True)
    p.add_argument("--reference-window")
    p.add_argument("--current-window")
    p.add_argument(
        "--reference-days",
        type=int,
        help="reference = the N days before the current window's start (same input if --reference is omitted)",
    )
    p.add_argument("--out", help="also write the report (JSON) here")
    p = sub.add_parser("monitor", help="ingest a window, drift against the days before it, diff the toolsets")
    p.add_argument("--input", required=True)
    p.add_argument("--window", required=True, help="the current window (START/END or a date)")
    p.add_argument("--output", required=True)
    p.add_argument("--champion", help="model directory (or s3:// prefix) holding tool_registry.json")
    p.add_argument("--toolset", help="the toolset in production now: file, s3://, http(s):// OpenAPI, or version")
    p.add_argument("--reference", help="reference input or ingest output (default: the days before, same input)")
    p = sub.add_parser("tooldiff", help="breaking and non-breaking changes between two toolsets")
    p.add_argument("old")
    p.add_argument("new")
    p = sub.add_parser("simulate", help="write simulated production traces with a tool change at a known time")
    p.add_argument("--out", required=True)
    p.add_argument("--start", required=True)
    p.add_argument("--end", required=True)
    p.add_argument("--traces", type=int, default=2000)
    p.add_argument("--change-at", help="when production switches from --from-toolset to --to-toolset")
    p.add_argument("--from-toolset", default="1")
    p.add_argument("--to-toolset", default="2")
    p.add_argument("--policy", default="scripted", help="'scripted' or a model directory (episodes through vLLM)")
    p.add_argument("--malformed-share", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)


COMMANDS = ("ingest", "drift", "tooldiff", "simulate", "monitor")


def run(args: argparse.Namespace, settings: Settings) -> int:
    from tasks.data.validation import BatchValidationError
    from tasks.signals.traces import Window

    # the option a command writes a directory to: an existing file there is a mistake, said before any work
    name = {"ingest": "output", "monitor": "output", "simulate": "out"}.get(args.command)
    if name:
        target = getattr(args, name, None)
        if target and not str(target).startswith("s3://") and Path(target).exists() and not Path(target).is_dir():
            print(f"error: --{name} {target} is a file; give a directory (it is created if missing)", file=sys.stderr)
            return 2
    try:
        if args.command == "ingest":
            from tasks.signals.ingest import ingest
            from tasks.signals.trace_sources import materialize

            window = Window.parse(args.window)
            # mlflow:EXPERIMENT / otel:FILE.json: exported to partitions under DIR/source first, then ingested like files
            source = materialize(args.input, Path(args.output) / "source", window, tracking_uri=settings.tracking.uri)
            print(json.dumps(ingest(source, args.output, settings.ingest, window)))
        elif args.command == "drift":
            print(json.dumps(_drift(args, settings)))
        elif args.command == "monitor":
            from tasks.signals.monitor import check_production

            print(
                json.dumps(
                    check_production(
                        settings,
                        args.input,
                        args.output,
                        Window.parse(args.window),
                        champion=args.champion,
                        toolset=args.toolset,
                        reference=args.reference,
                    )
                )
            )
        elif args.command == "tooldiff":
            from tasks.signals.tooldiff import diff_toolsets

            print(json.dumps(diff_toolsets(args.old, args.new, settings.env.name).to_dict()))
        elif args.command == "simulate":
            from tasks.signals.simulate import simulate_traces

            span = Window.parse(f"{args.start}/{args.end}")
            assert span.start is not None and span.end is not None  # both given (required options)
            schedule = [(span.start, args.from_toolset)]
            if args.change_at:
                change_at = Window.parse(f"{args.change_at}/").start
                assert change_at is not None  # a non-empty start
                schedule.append((change_at, args.to_toolset))
            print(
                json.dumps(
                    simulate_traces(
                        args.out,
                        span.start,
                        span.end,
                        args.traces,
                        schedule,
                        policy=args.policy,
                        settings=settings,
                        malformed_share=args.malformed_share,
                        seed=args.seed,
                    )
                )
            )
    except BatchValidationError as e:
        summary = getattr(e, "summary", None)
        if summary:
            print(json.dumps(summary))
        print(f"error: {e}", file=sys.stderr)
        return 1
    except (ValueError, OSError) as e:  # a missing or unreadable input, a directory for a file, bad content
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def _drift(args: argparse.Namespace, settings: Settings) -> dict:
    from tasks.signals.drift import compare
    from tasks.signals.monitor import window_stats
    from tasks.signals.traces import Window

    current_window = Window.parse(args.current_window)
    reference_window = (
        current_window.days_before(args.reference_days) if args.reference_days else Window.parse(args.reference_window)
    )
    if not args.reference and not args.reference_days:
        raise ValueError("give --reference, or --reference-days N to compare with the N days before --current-window")
    base = Path(args.out).parent if args.out else Path(tempfile.mkdtemp(prefix="evergreen-drift-"))
    reference, _ = window_stats(
        args.reference or args.current, base / "ingest_reference", settings, reference_window, docs=False
    )
    current, _ = window_stats(args.current, base / "ingest_current", settings, current_window, docs=False)
    report = compare(reference, current, settings.drift).to_dict()
    report["computed_at"] = datetime.now(UTC).isoformat()
    if args.out:
        from tasks.storage import write_atomic

        write_atomic(args.out, json.dumps(report, indent=1))
    return report
