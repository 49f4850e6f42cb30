"""
--wandb_log=true: every record train.py writes to log.jsonl goes to Weights & Biases under the same keys,
and a resume continues the same wandb run. Tested offline (WANDB_MODE=offline): the offline run's own file,
OUT_DIR/wandb/offline-run-*/run-ID.wandb, read back record by record. Without wandb, one line.

    python -m pytest tests/test_wandb.py -q --all
"""
import json
import os
import re
import struct
import subprocess
import sys

import pytest

from conftest import HANG, ROOT, TINY, listed, run, snapshot

WANDBS_OWN = {"_step", "_timestamp", "_runtime"}  # what wandb adds to each logged record


def wandb_records(path):
    """The protobuf Records of an offline run's .wandb file: a header, then LevelDB's log format (32 KiB
    blocks of chunks: CRC-32, length, type FULL 1, FIRST 2, MIDDLE 3, LAST 4; a block's tail under 7 bytes
    is padding)."""
    from wandb.proto import wandb_internal_pb2
    with open(path, "rb") as f:
        data = f.read()
    assert data[:7] == b":W&B\xe1\xbe\x00"  # ident, magic 0xBEE1, version 0
    pos, chunks, out = 7, b"", []
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:
            pos += 32768 - pos % 32768
            continue
        _, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunks, pos = chunks + data[pos + 7:pos + 7 + n], pos + 7 + n
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunks)
            out.append(record)
            chunks = b""
    return out


def offline_runs(out_dir):
    """[(run id, [logged record without wandb's own keys, ...]), ...] of OUT_DIR/wandb's offline runs, oldest
    first."""
    found = []
    folder = os.path.join(out_dir, "wandb")
    for name in sorted(n for n in os.listdir(folder) if n.startswith("offline-run-")):
        run_id = name.rsplit("-", 1)[1]
        records = wandb_records(os.path.join(folder, name, f"run-{run_id}.wandb"))
        assert [r.run.run_id for r in records if r.WhichOneof("record_type") == "run"] == [run_id]
        history = [{i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
                   for r in records if r.WhichOneof("record_type") == "history"]
        found.append((run_id, [{k: v for k, v in h.items() if k not in WANDBS_OWN} for h in history]))
    return found


@pytest.mark.slow
def test_every_record_goes_to_wandb_and_a_resume_continues_its_run(data_root, tmp_path):
    pytest.importorskip("wandb", reason="wandb is not installed: pip install wandb")
    env = {**os.environ, "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1",  # nothing of wandb's outside tmp_path
           **{f"WANDB_{name}_DIR": str(tmp_path / name.lower()) for name in ("CONFIG", "CACHE", "DATA")}}
    out = tmp_path / "out"
    for flags in (["--wandb_log=true", "--max_iters=2"], ["--init_from=resume", "--max_iters=4"]):  # processes:
        r = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *TINY, f"--data_root={data_root}",
                            f"--out_dir={out}", "--eval_interval=2", *flags],  # wandb writes its files at exit
                           capture_output=True, text=True, cwd=tmp_path, env=env, timeout=HANG)
        assert r.returncode == 0, r.stderr[-2000:]
    with open(out / "log.jsonl") as f:
        log = [json.loads(line) for line in f]
    ids = [r["wandb_run_id"] for r in log if "wandb_run_id" in r]
    runs = offline_runs(out)
    assert len(ids) == 1 and [run_id for run_id, _ in runs] == ids * 2  # the resume: the same run
    assert [r for _, history in runs for r in history] == [r for r in log if "wandb_run_id" not in r]
    assert {"iter", "loss", "lr", "ms", "train_loss", "val_loss"} <= {k for r in log for k in r}


def test_without_wandb_installed_it_is_one_line_and_touches_nothing(data_root, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb: ImportError
    before = snapshot(data_root, tmp_path)
    assert run(["--wandb_log=true"], data_root, tmp_path / "out") == 2
    assert capsys.readouterr().err == ("train.py: error: --wandb_log=true needs wandb, which is not installed: pip "
                                       "install wandb (or pip install -r requirements-optional.txt)\n")
    assert snapshot(data_root, tmp_path) == before and not (tmp_path / "out").exists()


WANDB_REFUSALS = [  # (WANDB_MODE, flags, the one line as a pattern: wandb's own words, then ours)
    *[(mode, [], rf"wandb refuses mode='{mode}' from the environment \(Input should be 'online', 'offline'.*\); "
                 r"fix that WANDB_ variable \(WANDB_MODE: online, offline or disabled\)")
      for mode in ("ofline", "offlne", "off")],
    ("offline", ["--wandb_project=me/nanomesh"],
     r"wandb refuses its settings \(Invalid project name 'me/nanomesh': .*found '/'\); fix --wandb_project, "
     r"or the WANDB_ variable named"),
]


@pytest.mark.parametrize("mode, flags, words", WANDB_REFUSALS, ids=[m + "".join(f) for m, f, _ in WANDB_REFUSALS])
def test_settings_wandb_refuses_are_one_line_and_touch_nothing(data_root, tmp_path, capsys, monkeypatch, mode,
                                                                flags, words):
    """A WANDB_MODE or a project name wandb refuses: its words and the fix in one line, exit 2, before the
    run touches OUT_DIR."""
    pytest.importorskip("wandb", reason="wandb is not installed: pip install wandb")
    monkeypatch.setenv("WANDB_MODE", mode)
    before = snapshot(data_root, tmp_path)
    assert run(["--wandb_log=true", *flags], data_root, tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert re.fullmatch(f"train.py: error: {words}\n", err), err
    assert snapshot(data_root, tmp_path) == before and not (tmp_path / "out").exists()


def test_wandb_that_cannot_start_leaves_no_log(data_root, tmp_path, capsys, monkeypatch):
    """Not logged in (no API key for the server, no terminal to ask on): one line naming the fix, exit 2, and
    the new OUT_DIR holds nothing (its lock file only)."""
    pytest.importorskip("wandb", reason="wandb is not installed: pip install wandb")
    for name, value in {"MODE": "online", "BASE_URL": "http://127.0.0.1:9", "API_KEY": ""}.items():
        monkeypatch.setenv(f"WANDB_{name}", value)
    for name in ("CONFIG", "CACHE", "DATA"):
        monkeypatch.setenv(f"WANDB_{name}_DIR", str(tmp_path / name.lower()))
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))  # none: no credentials
    assert run(["--wandb_log=true"], data_root, tmp_path / "out") == 2
    assert capsys.readouterr().err == (
        "train.py: error: wandb could not start a run (No API key configured. Use `wandb login` to log in.); "
        "log in with `wandb login`, or log offline: WANDB_MODE=offline\n")
    assert listed(tmp_path / "out") == []


def test_a_resume_continues_the_wandb_run_its_log_names_a_damaged_id_left_out(tmp_path, monkeypatch):
    """The id a resume continues is the log's last wandb_run_id that is text: a damaged one (a number, a
    list) never reaches wandb.init."""
    from types import SimpleNamespace
    import train
    from support import mirror
    seen = {}

    def init(**kwargs):
        seen.update(kwargs)
        return SimpleNamespace(define_metric=lambda *a, **k: None, id=kwargs["id"])
    wandb = SimpleNamespace(init=init, Settings=lambda **kwargs: None, Error=RuntimeError)
    monkeypatch.setattr(mirror, "need_wandb", lambda tc: wandb)
    log = tmp_path / "log.jsonl"
    log.write_text('{"iter": 0, "wandb_run_id": "abc123"}\n{"iter": 2, "wandb_run_id": [7]}\n')
    mirror.start(train.TrainConfig(), SimpleNamespace(path=str(log)), resumed_at=2)
    assert seen["id"] == "abc123"


def fake_wandb(init):
    """wandb as mirror.py calls it, its init() replaced (its errors: RuntimeError)."""
    from types import SimpleNamespace
    return SimpleNamespace(init=init, Settings=lambda **kwargs: None, Error=RuntimeError)


def test_a_wandb_run_is_named_after_out_dir_records_the_settings_and_the_log_its_id(tmp_path, monkeypatch):
    """A run's wandb run: named after OUT_DIR (no --wandb_run_name) in --wandb_project, the run's settings its
    config, its charts over iter; the log records its id at the iteration the mirroring began (a run resumed with
    --wandb_log=true at the one it resumed at)."""
    import dataclasses
    from types import SimpleNamespace
    import train
    from support import mirror
    seen, metrics, written = {}, [], []

    def init(**kwargs):
        seen.update(kwargs)
        return SimpleNamespace(define_metric=lambda *a, **k: metrics.append((a, k)), id="xyz", name=kwargs["name"])
    monkeypatch.setattr(mirror, "need_wandb", lambda tc: fake_wandb(init))
    (tmp_path / "run-a").mkdir()
    (tmp_path / "run-a" / "log.jsonl").write_text('{"iter": 0, "loss": 4.0}\n')  # a run that logged no id
    tc = train.TrainConfig(out_dir=str(tmp_path / "run-a"), wandb_project="mine")
    log = SimpleNamespace(path=str(tmp_path / "run-a" / "log.jsonl"), write=lambda *a: written.append(a))
    for resumed_at in (None, 4):
        mirror.start(tc, log, resumed_at)
        assert seen["name"] == "run-a" and seen["project"] == "mine" and seen["id"] is None
        assert seen["config"] == dataclasses.asdict(tc) and metrics.pop() == (("*",), {"step_metric": "iter"})
        assert written.pop() == ({"iter": resumed_at or 0, "wandb_run_id": "xyz"},
                                 "wandb: run xyz of project mine, named run-a")
    mirror.start(dataclasses.replace(tc, wandb_run_name="named"), log)
    assert seen["name"] == "named"


@pytest.mark.parametrize("flags", [["--init_from=resume"], ["--overwrite=true"]], ids=["resume", "overwrite"])
def test_wandb_that_cannot_start_leaves_an_old_runs_folder_as_it_was(flags, data_root, tmp_path, capsys, monkeypatch):
    """A resume, or a new run over an old one, that wandb cannot start: the first line of wandb's words, exit 2,
    and the old run's files (its log.jsonl) as they were."""
    from support import mirror
    out = tmp_path / "out"
    assert run(["--max_iters=2", "--eval_interval=2"], data_root, out) == 0
    before = snapshot(out)

    def init(**kwargs):
        raise RuntimeError(" No API key configured.\nRun `wandb login`.\n")
    monkeypatch.setattr(mirror, "need_wandb", lambda tc: fake_wandb(init))
    capsys.readouterr()
    assert run(["--max_iters=4", "--wandb_log=true", *flags], data_root, out) == 2
    assert capsys.readouterr().err == (
        "train.py: error: wandb could not start a run (No API key configured.); log in with `wandb login`, or log "
        "offline: WANDB_MODE=offline\n")
    assert snapshot(out) == before
