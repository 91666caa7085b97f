"""Ray clusters for the loop: connect to one, or start a local head on its own ports and temp dir.

    head = start_local_head("/tmp/eg-ray-1", port=6390)    # `ray start --head`, ~5 s
    ray.init(address=head.address)
    ...
    head.stop()                                             # only this head's processes

`ray stop` would end every Ray process on the machine (other runs, other users), so a head is stopped
through its own processes: those whose command line names its temp dir.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import subprocess
import sys
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasks.net import free_port
from tasks.processes import end_processes

if TYPE_CHECKING:
    from tasks.config import Settings

log = logging.getLogger(__name__)


@dataclass
class LocalHead:
    address: str
    temp_dir: str
    dashboard_url: str | None
    env: dict  # what a driver needs in its environment to connect (the head's auth token)

    def pids(self) -> list[int]:
        """This head's processes: those naming its temp dir on their command line, and Ray's processes
        that name it nowhere but write their logs there (the dashboard and runtime-env agents retitle
        themselves `ray::…`, the client server gets only the address): missed, they outlived teardowns."""
        import psutil

        out, token = [], str(token_dir(self.temp_dir)) + "/"
        for p in psutil.process_iter(["pid", "cmdline", "name"]):
            try:
                cmdline = p.info["cmdline"] or []
                if any(self.temp_dir in part for part in cmdline) or (
                    (str(p.info["name"]).startswith(("ray::", "ray-")) or any("ray" in part for part in cmdline[:3]))
                    and (
                        any(f.path.startswith(self.temp_dir + "/") for f in p.open_files())
                        # a process the head had just spawned (a dashboard module) opens its logs later, but
                        # carries the head's token in its environment from the start
                        or p.environ().get("RAY_AUTH_TOKEN_PATH", "").startswith(token)
                    )
                ):
                    out.append(p.info["pid"])
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return [p for p in out if p != os.getpid()]

    def stop(self, timeout: float = 5.0) -> int:
        """Terminate this head's processes (then kill stragglers); returns how many were found. Some Ray
        processes ignore SIGTERM, so a long grace period only delays the kill (it made teardowns take 19 s)."""
        import psutil

        procs = []
        for pid in self.pids():
            with suppress(psutil.NoSuchProcess):
                procs.append(psutil.Process(pid))
        end_processes(procs, grace=timeout)
        log.info("stopped local Ray head %s (%d processes)", self.address, len(procs))
        return len(procs)


def private_dir(path: Path, shared_mode: bool = False) -> Path:
    """`path` as a directory of this user: created with mode 0700 (parents as needed), or, where it exists,
    refused unless it is a real directory (no symlink) owned by this user and, unless `shared_mode`, with no
    group or other access. The run's head derives its temp dir from the run (local_temp_dir: a teardown
    must find it without the setup's XCom), so the name is predictable: a directory someone else made
    first is refused, never used (what mkdtemp's random name would otherwise guard). `shared_mode` is for
    Ray's temp dir, which `ray start` itself opens to mode 0777; the token lives beside it, in a strictly
    private directory (token_dir)."""
    import stat

    path.parent.mkdir(parents=True, exist_ok=True)
    with suppress(FileExistsError):
        path.mkdir(mode=0o700)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or (st.st_mode & 0o077 and not shared_mode):
        raise PermissionError(
            f"{path} is not a private directory of this user (owner uid {st.st_uid}, mode "
            f"{oct(st.st_mode & 0o777)}, {'a directory' if stat.S_ISDIR(st.st_mode) else 'not a directory'}): "
            "remove it (someone else may have created it) and run again"
        )
    return path


def private_file(path: Path) -> Path:
    """Refuse a token file that is not ours or that others may read (PermissionError says which)."""
    import stat

    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise PermissionError(
            f"Ray token {path} must be a regular file of this user with mode 0600 (owner uid "
            f"{st.st_uid}, mode {oct(st.st_mode & 0o777)}): fix or remove it"
        )
    return path


def token_dir(temp_dir: str | Path) -> Path:
    """Where the head of `temp_dir` keeps its auth token: beside Ray's temp dir (which Ray makes 0777), in
    a directory only this user may enter."""
    return Path(f"{temp_dir}.auth")


def new_token(path: Path) -> Path:
    """A fresh random token at `path`, created exclusively with mode 0600 (never a file found there: a retried
    setup's old token goes; the directory is private_dir's)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    return path


def start_local_head(
    temp_dir: str | Path,
    port: int = 6390,
    num_cpus: int | None = None,
    dashboard_port: int | None = 8265,
    timeout: float = 60.0,
) -> LocalHead:
    """`ray start --head` bound to 127.0.0.1 with its own temp dir; returns once it accepts drivers."""
    temp_dir = str(Path(temp_dir).resolve())
    if len(temp_dir) > 40:
        raise ValueError(
            f"Ray temp dir {temp_dir!r} is too long: its unix sockets must stay under 107 characters; "
            "use a short path such as /tmp/eg-ray-<run>"
        )
    private_dir(Path(temp_dir), shared_mode=True)
    # Ray 2.60 clusters require a token; this head gets its own, readable only by us. A process that
    # already holds one (RAY_AUTH_TOKEN_PATH) keeps it: Ray reads the token once, at import, so every head
    # this process drives must share it
    held = held_token()
    if held is not None:
        token_path = held
        private_file(token_path)
    else:
        token_path = new_token(private_dir(token_dir(temp_dir)) / "auth_token")
    # Ray resolves 127.0.0.1 to the machine's routable address (services.resolve_ip_for_localhost) unless it
    # believes clusters are off (its macOS/Windows switch): then every component of a local head (GCS,
    # raylet, agents, client server, workers) binds loopback. Drivers and jobs get it too (head.env)
    auth_env = {
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token_path),
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "GLOO_SOCKET_IFNAME": "lo",
    }
    ray_bin = shutil.which("ray", path=str(Path(sys.executable).parent)) or "ray"
    cmd = [
        ray_bin,
        "start",
        "--head",
        f"--port={port}",
        f"--temp-dir={temp_dir}",
        "--node-ip-address=127.0.0.1",
        f"--num-cpus={num_cpus or os.cpu_count()}",
        "--disable-usage-stats",
    ]
    if dashboard_port:
        # the job agent's default port (52365) is one per machine: a second head with a dashboard would have no
        # job agent, and every job submitted to it fails with "No available agent to submit job"
        cmd += [
            "--include-dashboard=true",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dashboard_port}",
            f"--dashboard-agent-listen-port={free_port()}",
        ]
    else:
        cmd += ["--include-dashboard=false"]
    t0 = time.time()
    # its own session: the head's daemons must outlive the process that started them, as on a machine of
    # their own. In the same process group, a Celery worker killed with its group (a lost machine) would take
    # the run's cluster, and every stage after it, down with it; teardown stops the head by its own pids.
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env=os.environ | auth_env, start_new_session=True
    )
    if proc.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    head = LocalHead(
        f"127.0.0.1:{port}", temp_dir, f"http://127.0.0.1:{dashboard_port}" if dashboard_port else None, auth_env
    )
    log.info("local Ray head up at %s in %.1fs (temp dir %s)", head.address, time.time() - t0, temp_dir)
    return head


def loopback_driver(address: str | None) -> None:
    """Make this process a loopback driver when `address` is on this machine (or None: an in-process
    cluster). A local head's components run with Ray's cluster switch off (start_local_head), so their node
    IP is 127.0.0.1; a driver that computed the routable address instead is no node of that cluster and
    waits for a raylet that never answers. Ray reads the switch from the environment when it is first
    imported, which may have happened already in this process: the module constant is set too."""
    host = (address or "127.0.0.1").rsplit(":", 1)[0].strip("[]")
    if host not in ("127.0.0.1", "localhost", "::1"):
        return
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False


def connect(settings: Settings, **init_kwargs: Any) -> Any:
    """ray.init against settings.ray.address, or an in-process local cluster (quiet, loopback only)."""
    import ray

    if ray.is_initialized():
        return ray.get_runtime_context()
    loopback_driver(settings.ray.address)
    # before ray.init: workers inherit the driver's environment only from then on
    os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")  # else every worker print appears twice
    os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_CHDIR_TO_TRIAL_DIR", "0")
    init_kwargs.setdefault("logging_level", "WARNING")
    # without a dashboard, Ray Train's placement-group watcher logs "State API may be temporarily
    # unavailable" every few seconds; ERROR-level system logs keep the console readable
    init_kwargs.setdefault("logging_config", ray.LoggingConfig(encoding="TEXT", log_level="ERROR"))
    env = {
        "runtime_env": {
            "env_vars": {
                "PYTHONPATH": os.pathsep.join(
                    filter(None, [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH")])
                )
            }
        }
    }
    # ray.LoggingConfig reaches the workers, but it also reconfigures this process's root logger:
    # keep the driver's own progress lines
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    try:
        if settings.ray.address:
            # Ray Train's helpers resolve the cluster by RAY_ADDRESS, in this driver and in its controller actor
            # (whose placement-group cleaner dies with "Found multiple active Ray instances" beside a second head)
            os.environ["RAY_ADDRESS"] = settings.ray.address
            env["runtime_env"]["env_vars"]["RAY_ADDRESS"] = settings.ray.address
            return ray.init(address=settings.ray.address, log_to_driver=True, **env, **init_kwargs)
        return ray.init(
            num_cpus=settings.ray.num_cpus or os.cpu_count(),
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            log_to_driver=True,
            **env,
            **init_kwargs,
        )
    finally:
        root.setLevel(level)
        root.handlers[:] = handlers


def local_temp_dir(run_key: str) -> str:
    """The temp dir of a run's local head, derived from the run: a teardown finds the head even when the
    setup's XCom never got written. Short: Ray's unix sockets live under it and must stay under 107 characters."""
    import hashlib

    return f"/tmp/eg-ray-{hashlib.sha1(run_key.encode()).hexdigest()[:8]}"


def held_token() -> Path | None:
    """The Ray auth token this process holds (RAY_AUTH_MODE=token and an existing RAY_AUTH_TOKEN_PATH), if any."""
    held = os.environ.get("RAY_AUTH_TOKEN_PATH")
    return Path(held) if os.environ.get("RAY_AUTH_MODE") == "token" and held and Path(held).exists() else None


def hold_token(name: str) -> Path:
    """One Ray auth token for every local head this process starts (start_local_head keeps a held one), set
    before anything here imports Ray: Ray reads the token once, at import, and vLLM imports Ray when an engine
    is built. A process that builds an engine and then starts heads (tasks/timeline) calls this first. The
    token's directory is named for `name`, never for a run: a run's teardown finds its head's processes by
    their token path, and must not find the process that holds it."""
    held = held_token()
    if held is not None:
        return held
    path = new_token(private_dir(Path(f"/tmp/eg-{name}.auth")) / "auth_token")
    os.environ.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(path)})
    return path


def setup_local_cluster(settings: Settings, run_key: str, num_cpus: int | None = None) -> dict:
    """A fresh local head for one run (a half-up head of an earlier try is stopped first); returns the
    cluster description (tasks.stages.contracts.ClusterInfo) drivers and jobs connect with."""
    temp_dir = local_temp_dir(run_key)
    old = LocalHead("", temp_dir, None, {})
    if old.pids():  # a retried setup: the first try's head may be half up; start clean
        log.warning("a head of this run is already running (%d processes): stopping it first", len(old.pids()))
        old.stop()
    head = start_local_head(
        temp_dir,
        port=settings.ray.head_port,
        num_cpus=num_cpus or settings.ray.num_cpus,
        dashboard_port=settings.ray.dashboard_port,
    )
    log.info("Ray head %s up; dashboard %s; temp dir %s", head.address, head.dashboard_url, temp_dir)
    return {
        "backend": "local",
        "address": head.address,
        "dashboard_url": head.dashboard_url,
        "env": head.env,
        "temp_dir": temp_dir,
    }


def teardown_local_cluster(run_key: str) -> int:
    """Stop exactly the processes of the run's local head (never `ray stop`); returns how many."""
    head = LocalHead("", local_temp_dir(run_key), None, {})
    stopped = head.stop()
    # a process the head was starting as it stopped (a worker forked by the raylet, an agent restarting) shows
    # up after the first sweep: sweep until none has shown up for `quiet` seconds
    quiet, deadline, last_seen = 3.0, time.time() + 30, time.time()
    while time.time() < deadline and time.time() - last_seen < quiet:
        time.sleep(0.5)
        if head.pids():
            stopped += head.stop()
            last_seen = time.time()
    left = head.pids()
    if left:
        raise RuntimeError(
            f"Ray processes still alive after teardown: {left}; stop them by hand "
            f"(kill {' '.join(map(str, left))}) — never `ray stop`, it ends other runs' clusters"
        )
    log.info("Ray head of %s stopped: %d processes, none left", run_key, stopped)
    return stopped
