"""Compiled code loaded only from a folder the user owns and no one else can write, with the checksum recorded at its
build (foundations/trusted_files.py): the rule ssh holds keys to, on a shared server whose cache the umask made
group-writable."""

from __future__ import annotations

import hashlib
import os

import pytest

from topl_core.foundations.trusted_files import (
    check_private_file,
    check_private_folder,
    checksum_path,
    private_folder,
    record_checksum,
    trusted,
    verify_checksum,
)


@pytest.fixture
def private(tmp_path):
    folder = tmp_path / "decode-steps"
    folder.mkdir(mode=0o700)
    os.chmod(folder, 0o700)
    os.chmod(tmp_path, 0o755)
    return folder


def test_a_folder_is_private_only_when_it_is_yours_and_no_one_else_can_write_it_or_any_folder_above(private):
    assert check_private_folder(private) is None
    os.chmod(private, 0o775)  # what a shared server's umask 002 makes
    assert "writable by its group" in check_private_folder(private)
    os.chmod(private, 0o757)
    assert "writable by every user" in check_private_folder(private)
    os.chmod(private, 0o755)
    assert check_private_folder(private) is None
    assert f"not to you (uid {os.geteuid() + 1})" in check_private_folder(private, uid=os.geteuid() + 1)

    os.chmod(private.parent, 0o777)  # a folder above that anyone may write: they could rename ours away
    assert f"{private.parent}, a folder above {private}, is writable by every user" in check_private_folder(private)
    os.chmod(private.parent, 0o1777)  # with the sticky bit, as /tmp: others cannot rename what is not theirs
    assert check_private_folder(private) is None
    os.chmod(private.parent, 0o755)
    assert "cannot be read" in check_private_folder(private / "missing")


def test_a_file_is_loaded_only_when_private_and_the_bytes_recorded_at_its_build(private):
    package = private / "14ac0c661ab9145c05bb.pt2"
    package.write_bytes(b"\x7fELF compiled step")
    os.chmod(package, 0o644)
    assert "no checksum recorded" in verify_checksum(package) and "no checksum" in trusted(package)
    record_checksum(package)
    digest = hashlib.sha256(package.read_bytes()).hexdigest()
    assert checksum_path(package).read_text() == f"{digest}  {package.name}\n"  # sha256sum's format
    assert verify_checksum(package) is None and trusted(package) is None

    package.write_bytes(b"\x7fELF someone else's code")  # same name, other code
    assert "not the file that was built" in verify_checksum(package) and trusted(package)
    record_checksum(package)
    os.chmod(package, 0o664)  # group-writable in a folder the group may enter
    os.chmod(private, 0o755)
    assert "writable by its group" in check_private_file(package) and trusted(package)
    os.chmod(private, 0o700)  # the umask's group bit is harmless where no one else may enter
    assert check_private_file(package) is None and trusted(package) is None
    os.chmod(private, 0o770)
    assert "writable by its group" in trusted(package)  # the folder itself


def test_compiled_code_goes_to_a_private_folder_of_the_users_own_when_the_cache_is_shared(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home-cache"))
    os.chmod(tmp_path, 0o755)
    shared = tmp_path / "cache" / "decode-steps"
    shared.mkdir(parents=True)
    os.chmod(shared, 0o755)
    assert private_folder(shared, "decode-steps") == (shared, None)

    os.chmod(shared, 0o2775)  # a group's shared cache
    folder, why = private_folder(shared, "decode-steps")
    assert folder == tmp_path / "home-cache" / "topl-workbench" / "decode-steps"
    assert f"{shared} is writable by its group" in why and f"kept in {folder} instead" in why
    assert (folder.stat().st_mode & 0o777) == 0o700 and check_private_folder(folder) is None

    os.chmod(tmp_path, 0o777)  # neither is private: nothing compiled is loaded
    folder, why = private_folder(shared, "decode-steps")
    assert folder is None and "no compiled code is loaded" in why
    os.chmod(tmp_path, 0o755)
