"""The directory of detached pools: this user's only, names that are file names."""

from __future__ import annotations

import os
import stat

import pytest

from notebook_accel.launch.detached.runtime_dir import check_name, pool_files, runtime_dir


def test_the_runtime_directory_is_made_private_and_an_open_one_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    folder = runtime_dir()
    assert folder == tmp_path / "notebook_accel" and stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    os.chmod(folder, 0o755)  # readable by others: someone could read a token or plant a socket
    with pytest.raises(PermissionError, match=r"must be a directory of this user's .* mode 755"):
        runtime_dir()


def test_a_pools_token_is_this_users_only_and_never_an_existing_file(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    files = pool_files("exp1")
    token = files.write_token()
    assert files.read_token() == token and len(token) == 64
    assert stat.S_IMODE(os.stat(files.token).st_mode) == 0o600
    with pytest.raises(FileExistsError):
        files.write_token()
    files.remove()
    assert not files.token.exists()


@pytest.mark.parametrize("name", ["", "a/b", "../x", ".hidden", "x" * 65, 3])
def test_a_bad_name_is_refused_naming_what_is_allowed(name):
    with pytest.raises(ValueError, match=r"a detached pool's name is 1 to 64 letters"):
        check_name(name)
