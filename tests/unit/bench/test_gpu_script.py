"""bench/gpu.sh has not run on a GPU here (none is lent to this project's machine): its syntax, its plan for
both modes, its refusal without a GPU, and that the settings it hands the GPU job load."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "bench" / "gpu.sh"


def _run(*args, path=None):
    env = {"PATH": path} if path else None
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT, env=env)


def test_syntax():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0


def test_cpu_plan_runs_the_cpu_venv_and_devices():
    done = _run("--cpu", "--dry-run")
    assert done.returncode == 0, done.stderr
    plan = [line[2:] for line in done.stderr.splitlines() if line.startswith("+ ")]
    assert plan[0] == "make venv"
    assert ".venv/bin/python bench/rl_step.py --quick --device cpu" in plan
    assert any(" train --init " in line and "nccl" not in line for line in plan)


def test_gpu_mode_refuses_without_nvidia_smi(tmp_path):
    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has a GPU")
    done = _run(path=f"{tmp_path}:/usr/bin:/bin")
    assert done.returncode == 1 and "run with --cpu" in done.stderr


def test_gpu_job_settings_load():
    import re

    from tasks.config import load_settings, nest

    text = SCRIPT.read_text()
    block = re.search(r"TRAIN_SETS=\((.*?)\)", text, re.S).group(1)
    pairs = dict(p.split("=", 1) for p in re.findall(r"--set (\S+)", block))
    s = load_settings(overrides=nest(pairs))
    assert s.grpo.device == "cuda" and s.rollout.weight_transfer_backend == "nccl"
