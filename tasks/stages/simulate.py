"""The demo's production traffic (the simulate_production DAG; `python -m tasks demo`).

    simulate_production(settings, days=2, tool_change=True)

Not part of a production deployment: there, the traces come from the agent's own traffic.
"""

from __future__ import annotations

import json
import logging
import shlex
import shutil
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tasks.config import Settings

log = logging.getLogger(__name__)


def child_env() -> dict:
    """This process's environment with the project on PYTHONPATH, for a `python -m tasks` child."""
    import os

    from tasks.config import PROJECT_ROOT

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
    return env


def stream(cmd: list[str], env: dict, prefix: str) -> list[str]:
    """Run `cmd`, its output line by line into this log as it happens; raises with its last lines on failure."""
    log.info("%s: %s", prefix, shlex.join(cmd))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines = []
    assert proc.stdout is not None  # stdout=PIPE
    for line in proc.stdout:
        lines.append(line.rstrip())
        log.info("[%s] %s", prefix, line.rstrip()[:500])
    if proc.wait() != 0:
        raise RuntimeError(f"{prefix} failed ({proc.returncode}): " + "\n".join(lines[-20:]))
    return lines


def simulate_production(settings: Settings, days: int = 2, tool_change: bool = True) -> dict:
    """`days` past days of champion traffic (through vLLM), the toolset switching to the target at
    midnight before the last day when `tool_change`.

    The engine runs in a process of its own (`python -m tasks simulate`): when vLLM builds an engine it scans
    every loaded module, and trips over the unbound Flask proxies an Airflow worker has imported."""
    import tempfile

    from tasks.mirror import Mirror
    from tasks.stages.models import fetch_champion
    from tasks.stages.signals import last_full_days
    from tasks.storage import is_s3

    # traces kept on S3 are written locally first, then pushed (the simulator writes files)
    remote = is_s3(settings.monitor.traces)
    out = Path(tempfile.mkdtemp(prefix="evergreen-traces-")) if remote else Path(settings.monitor.traces)
    champion = fetch_champion(settings, (settings.local_root / "production" if remote else out.parent) / "champion")
    today = last_full_days(1).end
    assert today is not None  # last_full_days sets both ends of its window
    start = today - timedelta(days=days)
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="evergreen-settings-") as cfg:
        cfg.write(settings.model_dump_json())
        cfg.flush()
        cmd = [
            sys.executable,
            "-m",
            "tasks",
            "--settings",
            cfg.name,
            "simulate",
            "--out",
            str(out),
            "--start",
            start.isoformat(),
            "--end",
            today.isoformat(),
            "--traces",
            str(settings.simulate.traces),
            "--from-toolset",
            settings.env.champion_toolset,
            "--to-toolset",
            settings.env.target_toolset,
            "--policy",
            str(champion),
            "--malformed-share",
            str(settings.simulate.malformed_share),
            "--seed",
            str(settings.grpo.seed),
        ]
        if tool_change:
            cmd += ["--change-at", (today - timedelta(days=1)).isoformat()]
        lines = stream(cmd, child_env(), "simulate")
    manifest = json.loads(next(line for line in reversed(lines) if line.startswith("{")))
    if remote:
        Mirror(settings.monitor.traces, out).push()
        shutil.rmtree(out)
    return {
        "traces": str(settings.monitor.traces),
        "days": days,
        "tool_change": tool_change,
        **{k: v for k, v in manifest.items() if isinstance(v, (int, float, str))},
    }
