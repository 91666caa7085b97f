"""The project's own files agree with each other, and its checks catch what they are for.

- pyproject.toml names the packages of requirements*.txt at the same pins (requirements stay the install sets);
- the lint, format and type checks that `make test` runs first (`make lint`) fail on a deliberately bad file:
  an unused import (ruff), an unformatted line (ruff format), an unannotated public function (mypy).
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _pins(lines: list[str]) -> dict[str, str]:
    """{canonical name[extras]: specifier} of requirement lines (comments and blanks skipped)."""
    out = {}
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            out[req.name.lower().replace("_", "-") + str(sorted(req.extras))] = str(req.specifier)
    return out


def _file(name: str) -> dict[str, str]:
    return _pins((ROOT / name).read_text().splitlines())


@pytest.fixture(scope="module")
def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_pyproject_and_the_requirement_files_name_the_same_pins(project):
    base = _pins(project["dependencies"])
    extras = {k: _pins(v) for k, v in project["optional-dependencies"].items()}
    assert {**base, **extras["cpu"]} == _file("requirements.txt")
    assert {**base, **extras["gpu"]} == _file("requirements-gpu.txt")
    assert extras["test"] == _file("requirements-test.txt")


def test_the_environments_entry_point_group_is_declared(project):
    assert project["entry-points"]["evergreen.environments"]["desk"] == "tasks.envs.desk:environment"


BAD = '''"""A deliberately bad contribution."""

import os


def public(x):
    return  x
'''


@pytest.mark.parametrize(
    "command, finding",
    [
        (["ruff", "check", "--no-cache"], "F401"),  # the unused import
        (["ruff", "format", "--check", "--no-cache"], "would be reformatted"),  # `return  x`
        (["mypy", "--no-incremental"], "Function is missing a type annotation"),  # `def public(x)`
    ],
)
def test_the_checks_fail_a_bad_file(tmp_path, command, finding):
    bad = tmp_path / "bad.py"
    bad.write_text(BAD)
    config = ["--config-file", str(ROOT / "pyproject.toml")] if command[0] == "mypy" else []
    flags = ["--config", str(ROOT / "pyproject.toml")] if command[0] == "ruff" else []
    proc = subprocess.run(
        [str(BIN / command[0]), *command[1:], *flags, *config, str(bad)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert finding in proc.stdout + proc.stderr


def test_the_checks_pass_a_good_file(tmp_path):
    good = tmp_path / "good.py"
    good.write_text('"""A good one."""\n\n\ndef public(x: int) -> int:\n    return x\n')
    for command in (["ruff", "check", "--no-cache"], ["ruff", "format", "--check", "--no-cache"]):
        proc = subprocess.run(
            [str(BIN / command[0]), *command[1:], "--config", str(ROOT / "pyproject.toml"), str(good)],
            capture_output=True,
            text=True,
            cwd=tmp_path,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = subprocess.run(
        [str(BIN / "mypy"), "--no-incremental", "--config-file", str(ROOT / "pyproject.toml"), str(good)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
