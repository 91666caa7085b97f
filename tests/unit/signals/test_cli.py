"""The signals commands end to end, as a user runs them: one JSON line on stdout, exit status."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tasks", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )


def last_json(proc) -> dict:
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_simulate_ingest_drift_across_a_tool_change(tmp_path):
    sim = run(
        "simulate",
        "--out",
        str(tmp_path / "sim"),
        "--start",
        "2026-11-20",
        "--end",
        "2026-11-24",
        "--traces",
        "2400",
        "--change-at",
        "2026-11-22",
        "--malformed-share",
        "0.03",
        "--seed",
        "2",
    )
    assert sim.returncode == 0, sim.stderr
    manifest = last_json(sim)

    ing = run("ingest", "--input", str(tmp_path / "sim"), "--output", str(tmp_path / "ing"))
    assert ing.returncode == 0, ing.stderr
    summary = last_json(ing)
    assert summary["verdict"] == "passed"
    assert summary["rows_read"] == summary["rows_accepted"] + summary["rows_quarantined"] == 2400
    assert summary["rows_quarantined"] == sum(manifest["malformed"].values())
    assert (tmp_path / "ing" / "gx_docs" / "index.html").exists()

    drift = run(
        "drift",
        "--reference",
        str(tmp_path / "sim"),
        "--reference-window",
        "2026-11-20/2026-11-22",
        "--current",
        str(tmp_path / "sim"),
        "--current-window",
        "2026-11-22/2026-11-24",
        "--out",
        str(tmp_path / "drift" / "report.json"),
    )
    assert drift.returncode == 0, drift.stderr
    report = last_json(drift)
    assert report["drifted"] and any("success rate" in r for r in report["reasons"])
    assert json.loads((tmp_path / "drift" / "report.json").read_text())["drifted"]

    same = run("drift", "--current", str(tmp_path / "sim"), "--current-window", "2026-11-21", "--reference-days", "1")
    assert same.returncode == 0, same.stderr
    assert not last_json(same)["drifted"], last_json(same)["reasons"]


def test_tooldiff_reports_the_breaking_change():
    proc = run("tooldiff", "1", "2")
    assert proc.returncode == 0, proc.stderr
    diff = last_json(proc)
    assert diff["breaking"] and diff["old_hash"] != diff["new_hash"]
    assert not last_json(run("tooldiff", "1", "1"))["changes"]


def test_failed_window_prints_its_summary_and_exits_1(tmp_path):
    (tmp_path / "empty.jsonl").write_bytes(b"")
    proc = run("ingest", "--input", str(tmp_path / "empty.jsonl"), "--output", str(tmp_path / "out"))
    assert proc.returncode == 1
    assert last_json(proc)["verdict"] == "failed"
    assert "rows_read" in proc.stderr and "observed 0" in proc.stderr and "the window is empty" in proc.stderr


def test_bad_arguments_exit_2_with_the_fix(tmp_path):
    proc = run("ingest", "--input", str(tmp_path / "nowhere"), "--output", str(tmp_path / "out"))
    assert proc.returncode == 2 and "neither a file nor a directory" in proc.stderr
    proc = run("ingest", "--input", str(tmp_path), "--output", str(tmp_path / "o"), "--window", "2026-12-02/2026-12-01")
    assert proc.returncode == 2 and "ends before it starts" in proc.stderr
