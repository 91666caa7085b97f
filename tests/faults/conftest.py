"""The fault matrix's fixtures: a small filesystem that fills up, and an S3 endpoint behind a proxy that
answers with errors (the moto server of tests/integration/conftest.py)."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.integration.conftest import s3, s3_through  # noqa: F401 (the session's moto server, its proxy route)


@pytest.fixture
def small_disk(tmp_path):
    """A 16 MiB tmpfs mounted for the test (root only: skipped, saying so, where mounting is not allowed)."""
    mount = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip()[:200]}): the disk-full case needs root")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)
        shutil.rmtree(mount, ignore_errors=True)


def fill(disk: Path, leave: int = 4096) -> None:
    """Take all but `leave` bytes of the disk's free space."""
    free = shutil.disk_usage(disk).free
    with open(disk / "filler", "wb") as f:
        f.truncate(0)
        f.write(b"\0" * max(0, free - leave))
