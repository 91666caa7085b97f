"""The local Ray head's temp dir and token (tasks/rl/cluster.py): private to this user, the token fresh,
exclusive and 0600; a directory or token someone else prepared is refused, never used."""

import os
import stat

import pytest

from tasks.rl.cluster import local_temp_dir, new_token, private_dir, private_file


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_the_temp_dir_is_created_private_and_the_token_fresh(tmp_path):
    d = private_dir(tmp_path / "eg-ray-x")
    assert _mode(d) == 0o700 and os.lstat(d).st_uid == os.getuid()
    first = new_token(d / "auth_token")
    assert _mode(first) == 0o600 and len(first.read_text()) == 64
    before = first.read_text()
    again = new_token(d / "auth_token")  # a retried setup: a new token, never the one found there
    assert again.read_text() != before and _mode(again) == 0o600
    assert private_dir(d) == d  # ours and private: used as it is


@pytest.mark.parametrize("prepare", ["open_mode", "symlink", "file"])
def test_a_prepared_directory_is_refused(tmp_path, prepare):
    target = tmp_path / "eg-ray-y"
    if prepare == "open_mode":
        target.mkdir(mode=0o755)
        target.chmod(0o755)
    elif prepare == "symlink":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        target.symlink_to(tmp_path / "elsewhere")
    else:
        target.write_text("")
    with pytest.raises(PermissionError, match="not a private directory"):
        private_dir(target)


def test_a_readable_token_is_refused(tmp_path):
    token = tmp_path / "token"
    token.write_text("x")
    token.chmod(0o644)
    with pytest.raises(PermissionError, match="0600"):
        private_file(token)
    token.chmod(0o600)
    assert private_file(token) == token


def test_the_run_temp_dir_is_short_enough_for_rays_sockets():
    assert len(local_temp_dir("continuous_post_training/manual__2026-12-06T00:00:00+00:00")) <= 40
