"""
The one command grammar of every script (configurator.py): --key=value and --key value, a true/false
setting alone for true, JSON config files, a did-you-mean for a typo, and --help describing every
setting, without reading source text.

    python -m pytest tests/test_cli.py --all  # --all: its slow-marked tests too
"""

import dataclasses
import errno
import os
import re
import subprocess
import sys

import pytest

import mesh
import sample
import train
from configurator import UsageError, parse_flags, setting
from conftest import HANG, ROOT
from support.files import read_config
from data.prepare import PrepareConfig
from tools.bench import BenchConfig
from tools.consolidate import ConsolidateConfig
from tools.gpu_check import CheckConfig
from tools.probe import ProbeConfig
from tools.table1 import Table1Config

SETTINGS = [train.TrainConfig, sample.SampleConfig, BenchConfig, ProbeConfig, Table1Config,
            PrepareConfig, ConsolidateConfig, CheckConfig]


def test_both_forms_and_a_flag_alone():
    argv = ["--max_iters", "10", "--lr=3e-3", "--compile", "--overwrite", "false", "--layout",
            "2+2R4+2", "--min_lr", "-1", "--fsdp"]
    assert parse_flags(train.TrainConfig, argv, "train.py") == dict(
        max_iters=10, lr=3e-3, compile=True, overwrite=False, layout="2+2R4+2", min_lr=-1.0, fsdp=True)
    assert parse_flags(train.TrainConfig, ["--lr_decay_iters", "None"], "train.py") == {
        "lr_decay_iters": None}


@pytest.mark.parametrize("argv, message", [
    (["--max_iters"], "flag '--max_iters' needs a value: --max_iters=VALUE or --max_iters VALUE"),
    (["--max_iters", "--lr=1"], "flag '--max_iters' needs a value"),
    (["--max_itrs", "5"], "unknown setting 'max_itrs' in the command line (did you mean --max_iters?)"),
    (["--max_itrs"], "unknown setting 'max_itrs' in the command line (did you mean --max_iters?)"),
    (["--max_iters", "ten"], "--max_iters=ten is not an integer"),
    (["--compile=maybe"], "--compile=maybe is not true or false (or None)"),
    (["--warm=1"], "'warm' in the command line (did you mean --warmup_iters?)"),
    (["--bsz=1"], "setting 'bsz' in the command line; see python"),
    (["--seed=-9223372036854775808"],
     "--seed=-9223372036854775808, too large: an integer setting"),
])
def test_bad_flags_are_one_line(argv, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        parse_flags(train.TrainConfig, argv, "train.py")


def test_true_and_false_are_words_in_any_case():
    for word, value in [("1", True), ("yes", True), ("ON", True),
                        ("True", True), ("0", False), ("No", False),
                        ("off", False), ("FALSE", False)]:
        for argv in (["--overwrite=" + word], ["--overwrite", word]):
            given = parse_flags(train.TrainConfig, argv, "train.py")
            assert given == {"overwrite": value}, argv


def test_an_empty_value_is_none_and_the_largest_integer_is_taken():
    argv = ["--lr_decay_iters=", "--seed=9223372036854775807"]
    assert parse_flags(train.TrainConfig, argv, "train.py") == {
        "lr_decay_iters": None, "seed": 2**63 - 1}


def test_config_files_are_read_by_the_reader_given_and_refused_without_one(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text('{"max_iters": 7}')
    assert parse_flags(train.TrainConfig, [str(cfg)], "train.py", read_config=read_config) == {
        "max_iters": 7}
    with pytest.raises(UsageError) as e:
        parse_flags(train.TrainConfig, [str(cfg)], "train.py")
    assert str(e.value) == (f"train.py reads no config file ({str(cfg)!r}); give its settings as "
                            f"flags: --key=value")
    r = subprocess.run([sys.executable, "tools/draw.py", "--help"], cwd=ROOT, capture_output=True,
                       text=True, timeout=HANG)  # every script's: command.main reads config files
    assert r.stdout.startswith("usage: python tools/draw.py [CONFIG.json ...] [--key=value"), r.stdout


def test_a_config_file_that_cannot_be_read_says_why_in_words(tmp_path):
    missing = str(tmp_path / "c.json")
    with pytest.raises(UsageError) as e:
        parse_flags(train.TrainConfig, [missing], "train.py", read_config=read_config)
    assert str(e.value) == (f"cannot read config file {missing!r}: "
                            f"{os.strerror(errno.ENOENT)}; fix the path")


def test_a_config_files_whole_number_is_either_type_a_fraction_no_integer(tmp_path):
    cfg, argv = tmp_path / "c.json", [str(tmp_path / "c.json")]
    cfg.write_text('{"lr": 1, "max_iters": 2.0}')
    given = parse_flags(train.TrainConfig, argv, "train.py",
                        read_config=read_config)
    assert given == {"lr": 1.0, "max_iters": 2}
    assert [type(v) for v in given.values()] == [float, int]
    cfg.write_text('{"max_iters": 2.5}')
    with pytest.raises(UsageError) as e:
        parse_flags(train.TrainConfig, argv, "train.py",
                    read_config=read_config)
    assert str(e.value) == (f"config file {str(cfg)!r}: max_iters is 2.5 "
                            f"(a number), not an integer")


def test_a_config_file_after_a_flag_is_refused_not_put_over_it(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text('{"max_iters": 7}')
    for argv in (["--max_iters=3", str(cfg)], [str(cfg), "--lr", "1", str(cfg)]):
        with pytest.raises(UsageError) as e:
            parse_flags(train.TrainConfig, argv, "train.py", read_config=read_config)
        assert str(e.value) == f"config file {str(cfg)!r} must come before the flags"
    assert parse_flags(train.TrainConfig, [str(cfg), str(cfg), "--max_iters=3"], "train.py",
                       read_config=read_config) == {"max_iters": 3}


def test_a_config_files_integer_past_what_python_reads_is_one_line(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text('{"seed": ' + "9" * 5000 + "}")  # int() reads at most 4300 digits
    with pytest.raises(UsageError) as e:
        parse_flags(train.TrainConfig, [str(cfg)], "train.py", read_config=read_config)
    assert str(e.value) == (f"config file {str(cfg)!r} holds a number past a float's "
                            f"range (write a smaller one); fix it, or give the "
                            f"settings as flags")


def test_a_config_file_of_anything_but_an_object_is_one_line(tmp_path):
    cfg = tmp_path / "c.json"
    for text in ('[{"max_iters": 7}]', "7", "null"):
        cfg.write_text(text)
        with pytest.raises(UsageError) as e:
            parse_flags(train.TrainConfig, [str(cfg)], "train.py", read_config=read_config)
        assert str(e.value) == f"config file {str(cfg)!r} must hold a JSON object of settings"


def test_an_empty_path_is_refused_by_name():
    with pytest.raises(UsageError) as e:
        parse_flags(train.TrainConfig, ["--data_root= "], "train.py")
    assert str(e.value) == "--data_root is empty; give it a name, e.g. --data_root=data (its default)"
    with pytest.raises(UsageError) as e:  # a list's default is made by a factory: no example
        parse_flags(ProbeConfig, ["--out_dir=a", "--out_dir="], "tools/probe.py")
    assert str(e.value) == "--out_dir is empty; give it a name"


def test_a_repeated_flag_adds_to_a_list():
    given = parse_flags(ProbeConfig, ["--out_dir", "a", "--out_dir=b"], "tools/probe.py")
    assert given == {"out_dir": ["a", "b"]} and ProbeConfig().out_dir == []


def test_a_config_files_list_is_checked_item_by_item_as_flags_are(tmp_path):
    """A list setting in a config file: each item a path as --out_dir's is (~ expanded, an empty
    one refused), text, never a number; a lone string is one item."""
    cfg = tmp_path / "c.json"
    for text, out_dir in (('["~/a", "b"]', [os.path.expanduser("~/a"), "b", "c"]),
                          ('"a"', ["a", "c"])):
        cfg.write_text(f'{{"out_dir": {text}}}')
        given = parse_flags(ProbeConfig, [str(cfg), "--out_dir=c"], "tools/probe.py",
                            read_config=read_config)
        assert given == {"out_dir": out_dir}
    for text, message in (("[3]", f"config file {str(cfg)!r}: out_dir is 3 (a number), not text"),
                          ('["a", ""]', "--out_dir is empty; give it a name")):
        cfg.write_text(f'{{"out_dir": {text}}}')
        with pytest.raises(UsageError) as e:
            parse_flags(ProbeConfig, [str(cfg)], "tools/probe.py", read_config=read_config)
        assert str(e.value) == message


@pytest.mark.parametrize("cls", SETTINGS, ids=[c.__name__ for c in SETTINGS])
def test_every_setting_has_a_description(cls):
    missing = [f.name for f in dataclasses.fields(cls) if not f.metadata.get("help")]
    assert not missing, f"{cls.__name__}: no description for {missing}"


@pytest.mark.parametrize("script", ["train.py", "sample.py", "tools/bench.py", "tools/probe.py",
                                    "tools/table1.py", "data/prepare.py", "tools/consolidate.py",
                                    "tools/gpu_check.py", "tools/draw.py", "tools/notebook.py"])
@pytest.mark.slow
def test_help_lists_every_setting(script):
    r = subprocess.run([sys.executable, script, "--help"], cwd=ROOT, capture_output=True, text=True,
                       timeout=HANG)
    assert r.returncode == 0 and r.stdout.startswith("usage: python "), r.stderr[-2000:]
    if script in ("train.py", "tools/bench.py", "tools/draw.py"):
        assert f"presets: {', '.join(mesh.PRESETS)}" in r.stdout
    if script in ("train.py", "tools/draw.py"):
        assert f"schemes: {', '.join(mesh.SCHEMES)}" in r.stdout
    if script == "train.py":  # each setting on its line, with its description
        for f in dataclasses.fields(train.TrainConfig):
            line = next(x for x in r.stdout.splitlines() if x.startswith(f"  --{f.name}="))
            assert line.rstrip().endswith(f.metadata["help"])


def test_h_is_help_and_it_shows_each_default_readably(capsys):
    @dataclasses.dataclass
    class Two:
        """Two settings."""
        sep: str = setting("\n", "between samples")
        name: str = setting("x" * 30, "a long default")
    with pytest.raises(SystemExit) as e:
        parse_flags(Two, ["-h"], "t.py")
    assert e.value.code == 0 and capsys.readouterr().out == (
        "usage: python t.py [CONFIG.json ...] [--key=value | --key "
        "value ...]\n\nTwo settings.\n\n"
        "  --sep='\\n'" + " " * 23 + "between samples\n"
        "  --name=" + "x" * 30 + "\n" + " " * 35 + "a long default\n")
