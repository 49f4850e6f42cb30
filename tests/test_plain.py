"""
support/files.py: the limits on every JSON file the project reads, config files included.

    python -m pytest tests/test_plain.py -q
"""
import errno
import json
import os
import stat
import sys
import time
import types

import pytest

from support import files as plain


def test_parse_json_reads_plain_data_and_strings_with_brackets():
    assert plain.parse_json('{"a": [1, {"b": "[[{{\\"["}], "c": null}') == {"a": [1, {"b": '[[{{"['}],
                                                                           "c": None}


@pytest.mark.parametrize("text, message", [
    ("[" * 100_000 + "]" * 100_000, "is nested more than 64 levels deep"),
    ('{"a": 1, "a": 2}', "has the key 'a' twice"),
    ('{"a": NaN}', "holds NaN, which JSON does not allow (write a number)"),
    ('[-Infinity]', "holds -Infinity, which JSON does not allow (write a number)"),
    ('{"loss": 1' + "0" * 400 + "}", "holds a number past a float's range (write a smaller one)"),
    ('[1.5, -1e400]', "holds a number past a float's range (write a smaller one)"),
    ('{"ms": 1' + "0" * 400 + ".5}", "holds a number past a float's range (write a smaller one)"),
])
def test_parse_json_refuses_what_is_not_plain_data(text, message):
    with pytest.raises(plain.PlainDataError) as e:
        plain.parse_json(text)
    assert str(e.value) == message


def test_parse_json_keeps_integers_and_floats_apart():
    values = plain.parse_json("[0, -0, 12, -3.0, 1e308, 2E-5, " + "9" * 308 + "]")
    assert values == [0, 0, 12, -3.0, 1e308, 2e-5, int("9" * 308)]
    assert [type(v) for v in values] == [int, int, int, float, float, float, int]


def test_parse_json_reads_a_string_never_closed_in_one_pass():
    text = '"' + '\\"' * 20_000  # every quote after the first escaped: a string never closed
    start = time.perf_counter()
    with pytest.raises(json.JSONDecodeError):
        plain.parse_json(text)
    assert time.perf_counter() - start < 5  # (once quadratic: half a minute for these 40 kB)


def test_parse_json_depth_limit_is_exact():
    assert plain.parse_json("[" * 64 + "]" * 64) is not None
    with pytest.raises(plain.PlainDataError):
        plain.parse_json("[" * 65 + "]" * 65)
    with pytest.raises(json.JSONDecodeError):  # not JSON at all: json's own error, with its position
        plain.parse_json("{,}")


def test_read_text_refuses_large_binary_and_non_regular_files(tmp_path):
    big, binary = tmp_path / "big.json", tmp_path / "bin.json"
    big.write_text("[" + "0," * 600 + "0]")
    binary.write_bytes(b'{"a": "\xff"}')
    assert plain.read_json(big) == [0] * 601
    for path, max_bytes, message in [(big, 1000, "is larger than 1,000 bytes"),
                                     (binary, plain.MAX_BYTES, "is not UTF-8 text (byte 7)"),
                                     (tmp_path, plain.MAX_BYTES, "is not a regular file")]:
        if path == tmp_path and sys.platform == "win32":
            continue  # a folder cannot be opened as a file there at all (OSError)
        with pytest.raises(plain.PlainDataError, match=message.replace("(", r"\(").replace(")", r"\)")):
            plain.read_text(path, max_bytes)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")
def test_read_text_refuses_a_fifo_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "log.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(plain.PlainDataError, match="is not a regular file"):
        plain.read_text(fifo)  # no writer: a plain open() would block here forever


def test_read_bytes_takes_exactly_max_bytes_and_refuses_one_more(tmp_path):
    path = tmp_path / "f.json"
    path.write_bytes(b"x" * 1000)
    assert plain.read_bytes(path, 1000) == b"x" * 1000  # "at most max_bytes"
    path.write_bytes(b"x" * 1001)
    with pytest.raises(plain.PlainDataError) as e:
        plain.read_bytes(path, 1000)
    assert str(e.value) == "is larger than 1,000 bytes"


def test_a_plain_name_is_a_file_of_the_folder_itself():
    names = ["meta.json", "", ".", "..", "a/b", "..\\x", "/etc", None, 3]
    assert [plain.plain_name(n) for n in names] == [True] + [False] * 8


def test_atomic_write_syncs_the_whole_file_before_replacing_the_old(tmp_path, monkeypatch):
    path, synced, fsync = tmp_path / "a.json", [], os.fsync
    path.write_text("old")

    def seen(fd):  # the bytes on disk when fsync runs, and what path holds then
        synced.append((os.fstat(fd).st_size, path.read_text()))
        fsync(fd)
    monkeypatch.setattr(os, "fsync", seen)
    plain.atomic_write(path, lambda f: f.write(b"new" * 1000))
    assert synced == [(3000, "old")] and path.read_bytes() == b"new" * 1000
    assert os.listdir(tmp_path) == ["a.json"]


@pytest.mark.parametrize("error", [PermissionError(errno.EACCES, "Permission denied"),
                                   KeyboardInterrupt()], ids=["oserror", "ctrl_c"])
def test_a_failed_atomic_write_leaves_the_old_file_and_no_temporary(error, tmp_path):
    path = tmp_path / "a.json"
    path.write_text("old")

    def fails(f):
        f.write(b"half")
        raise error
    with pytest.raises(type(error)) as e:  # (OSError(13, ...) is a PermissionError)
        plain.atomic_write(path, fails)
    assert os.listdir(tmp_path) == ["a.json"] and path.read_text() == "old"
    if isinstance(error, OSError):  # re-raised as an OSError saying why in words
        assert (e.value.errno, e.value.strerror) == (errno.EACCES, "Permission denied")


@pytest.mark.parametrize("system, refusals", [("nt", 2), ("nt", 99), ("posix", 1)])
def test_a_replace_refused_is_tried_again_on_windows_only(system, refusals, tmp_path, monkeypatch):
    """On Windows a file another process has open (a reader's CRC check, sample.py) cannot be
    replaced: the replace is tried again after each of RETRIES' waits, the last refusal raised
    with the old file kept; elsewhere a refusal is a real one, raised at once."""
    path, waits, replace = tmp_path / "a.json", [], os.replace
    path.write_text("old")
    left = [refusals]

    def refused(src, dst):  # refused while a reader holds dst open
        if left[0]:
            left[0] -= 1
            raise PermissionError(errno.EACCES, "Access is denied")
        replace(src, dst)
    monkeypatch.setattr(plain.os, "replace", refused)
    monkeypatch.setattr(plain.time, "sleep", waits.append)
    error = None
    with monkeypatch.context() as m:  # os.name put back before pytest reports anything
        m.setattr(plain.os, "name", system)
        try:
            plain.atomic_write(path, lambda f: f.write(b"new"))
        except OSError as e:
            error = e.strerror
    if refusals <= len(plain.RETRIES) and system == "nt":
        assert (error, path.read_text(), waits) == (None, "new", list(plain.RETRIES[:refusals]))
    else:
        waited = list(plain.RETRIES) if system == "nt" else []
        assert (error, path.read_text(), waits) == ("Access is denied", "old", waited)
    assert os.listdir(tmp_path) == ["a.json"]


def test_an_atomic_write_gets_the_mode_a_plain_write_gets(tmp_path):
    umask = os.umask(0o022)
    try:
        plain.atomic_write(tmp_path / "a", lambda f: f.write(b"a"))
        (tmp_path / "b").write_bytes(b"b")
    finally:
        os.umask(umask)
    modes = [stat.S_IMODE(os.stat(tmp_path / n).st_mode) for n in "ab"]
    assert modes[0] == modes[1]  # (0o644 here: not mkstemp's private 0o600)


def test_why_a_write_failed_in_words(tmp_path, monkeypatch):
    why = plain.why_write_failed
    assert why(PermissionError(13, "Permission denied", "x"), tmp_path) == "Permission denied"
    assert why(RuntimeError("zip writer failed\nat 3"), tmp_path) == "zip writer failed"
    usage = types.SimpleNamespace(free=123456)
    monkeypatch.setattr(plain.shutil, "disk_usage", lambda folder: usage)
    assert why(RuntimeError("x"), tmp_path) == "the disk is full (123,456 bytes free)"

    def gone(folder):
        raise FileNotFoundError(errno.ENOENT, "No such file or directory")
    monkeypatch.setattr(plain.shutil, "disk_usage", gone)
    assert why(OSError(errno.ENOSPC, "No space left"), tmp_path) == "the disk is full"


def test_own_takes_a_folder_once_and_never_waits_on_itself(tmp_path):
    waited = []
    try:
        assert plain.own(str(tmp_path)) is True
        assert plain.own(str(tmp_path), waiting=lambda: waited.append(1)) is False
    finally:
        plain.release()
    assert waited == [] and plain._owned == {}
    try:
        assert plain.own(str(tmp_path)) is True  # given back: taken afresh
    finally:
        plain.release()


@pytest.mark.skipif(sys.platform == "win32", reason="a symbolic link needs privileges there")
def test_remove_takes_a_link_itself_never_what_it_points_to(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_text("x")
    os.symlink(tmp_path / "d", tmp_path / "link")
    plain.remove(str(tmp_path / "link"))
    plain.remove(str(tmp_path / "never"))  # not there: nothing to do
    assert os.listdir(tmp_path) == ["d"] and (tmp_path / "d" / "f").read_text() == "x"
