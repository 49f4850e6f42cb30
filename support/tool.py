"""
What sample.py and every tool share around a trained run: its checkpoint and its log read back, a
decode that fits in memory, outputs that never land on a run's or a dataset's files, and signals
held while a tool writes. train.py needs only a resume's log (read_log) and check_run_folder.

    model, ckpt, note = tool.load_run("out", "cpu", "sample.py")  # note: "unfinished at iter N"
    records = tool.log_records("out/log.jsonl")  # its whole records, a damaged line left out
    tool.check_writable(path, "json")  # before a long computation, not after
"""

import os
import platform
import shlex
import sys

import torch

from configurator import UsageError
from support import command, files
from support.checkpoint import CKPT, KEPT, SHARDS, CheckpointError, found, latest, load
from support.memory import GiB, device_memory

UNFINISHED = "use a run still training or stopped early as it is now"  # --unfinished's help


# -----------------------------------------------------------------------------
# A run's checkpoint, as the tools read it

def load_latest(out_dir, device, prog, kept=None):
    """OUT_DIR's latest checkpoint, or with kept=ITER its checkpoint of that iteration; a sharded
    one is refused, naming consolidate.py, unless a whole one beside it has trained as far."""
    # kept: ckpt_ITER.pt, ckpt_ITER/ (a run folder), or the one of that iter
    check_run_folder(out_dir)
    entry = latest(out_dir, iter_num=kept)
    have = sorted({e[0] for e in found(out_dir)}) if kept is not None and entry is None else []
    if have:
        raise CheckpointError(f"{out_dir} has no checkpoint of iter {kept} (it has "
                              f"{', '.join(map(str, have))})")
    name = entry[2] if entry else CKPT  # none at all: load()'s one line
    if os.path.isdir(os.path.join(out_dir, name)) and KEPT.match(name):
        return load_latest(os.path.join(out_dir, name), device, prog, kept)
    if SHARDS.match(name):
        which = "latest" if kept is None else "kept"
        raise UsageError(f"{os.path.join(out_dir, name)} (iter {entry[0]}) is the run's {which} "
                         f"checkpoint, a sharded one, and {prog} reads a whole one ({CKPT}); "
                         f"write it first: python tools/consolidate.py "
                         f"{shlex.quote('--out_dir=' + out_dir)}")
    return load(out_dir, device, name)


def check_run_folder(out_dir, export="to from_pretrained or to train.py as --init_from=hf:"):
    """Refuse a checkpoint, an export or a file given as a run; export: how the caller takes it."""
    up, name = os.path.split(os.path.normpath(out_dir))
    saved = os.path.isfile(out_dir) and (name == CKPT or KEPT.match(name))
    if SHARDS.match(name) or saved:
        raise CheckpointError(f"{out_dir} is a checkpoint; give its run's folder, {up or '.'}")
    if os.path.isfile(os.path.join(out_dir, "model.safetensors")):  # export_hf.py's
        raise CheckpointError(f"{out_dir} is a Hugging Face export; give it {export}{out_dir}")
    if os.path.isfile(out_dir):
        raise CheckpointError(f"{out_dir} is a file; give a run's folder")


def ran_out(ckpt):
    """Whether a sequential run read its --epochs passes: Dataset.steps, from ckpt's records."""
    tc, data = ckpt["train_config"], ckpt.get("data") or {}
    if tc.get("data_order") != "sequential" or not data.get("train_tokens"):
        return False
    windows = data["train_tokens"] // (ckpt["model_config"]["block_size"] + 1)
    step = tc["batch_size"] * tc["grad_accum"]
    return ckpt["iter_num"] >= tc.get("epochs", 1) * windows // step


def load_run(out_dir, device, prog, unfinished=False, kept=None,
             as_is=lambda it: "give --unfinished=true to use it as it is"):
    """load_latest for a tool: unless unfinished, a run a process trains (it holds OUT_DIR's lock)
    or is to train (it holds the folder above, as table1.py does) is waited for, and one stopped
    before its max_iters refused, as_is(its iteration) saying how to take it as it is; kept
    (--ckpt=ITER) is taken as it is. -> (model, ckpt, "unfinished at iter N" or "")."""
    unfinished = unfinished or kept is not None
    check_run_folder(out_dir)  # not waited for
    above = os.path.dirname(os.path.abspath(out_dir))
    for folder, what in ((out_dir, "is still training"),
                         (above, "is yet to be trained by the process holding the folder above")):
        def waiting(what=what):
            print(f"{prog}: {out_dir} {what}; waiting for it (or {as_is(None)} now)",
                  file=sys.stderr, flush=True)
        # its holder's turn first (a folder this process holds is its own: own() says False);
        # no lock file there: never held, and none is made
        held = os.path.isfile(os.path.join(folder, files.LOCK))
        if not unfinished and held and files.own(folder, note=False, waiting=waiting):
            files.disown(folder)
        try:
            model, ckpt = load_latest(out_dir, device, prog, kept)
        except CheckpointError:
            if folder == above or unfinished:
                raise
            continue
        at, end = ckpt["iter_num"], ckpt["train_config"].get("max_iters")
        short = isinstance(end, int) and at < end and not ran_out(ckpt)
        if unfinished or not short:
            return model, ckpt, f"unfinished at iter {at}" if short else ""
    raise CheckpointError(f"{out_dir} is unfinished (iter {at} of its --max_iters={end}) and "
                          f"nothing trains it now; continue it with python train.py "
                          f"--init_from=resume {shlex.quote('--out_dir=' + out_dir)} (or the "
                          f"table1.py command that trained it), or {as_is(at)}")


# -----------------------------------------------------------------------------
# A run's log read back (support/run.py's RunLog writes it): its records, a damaged line left out

MAX_LOG = 1 << 30  # a log.jsonl of a million steps, one line each, is about 150 MB


def log_lines(path):
    """(line number, bytes, record or None if damaged) for each line of the log at path."""
    try:
        data = files.read_bytes(path, MAX_LOG)
    except files.PlainDataError as e:
        raise UsageError(f"{path} {e}; move it away, then resume the run") from None
    for number, line in enumerate(data.splitlines(keepends=True), start=1):
        try:
            record = files.parse_json(line.decode("utf-8"), nan=True)  # NaN: a loss that blew up
            if not isinstance(record, dict) or type(record.get("iter", 0)) is not int:
                raise ValueError("not a record of an iteration")
        except ValueError:  # UnicodeDecodeError and json's errors included
            record = None
        yield number, line, record


def log_records(path):
    return [record for _, _, record in log_lines(path) if record is not None]


def read_log(path, upto):
    """The log's lines of iterations up to upto, as bytes; a damaged line is moved into
    log.jsonl.damaged, which one note names."""
    kept, bad = [], []
    for number, line, record in log_lines(path):
        if record is None:
            bad.append((number, line))
        elif record.get("iter", 0) <= upto:
            kept.append(line if line.endswith(b"\n") else line + b"\n")
    if bad:
        aside, n = path + ".damaged", 1
        while os.path.lexists(aside):
            n += 1
            aside = f"{path}.damaged-{n}"
        files.atomic_write(aside, lambda f: f.writelines(line for _, line in bad))
        lines = ", ".join(str(number) for number, _ in bad[:5]) + (", ..." if len(bad) > 5 else "")
        print(f"note: {path} has {len(bad)} damaged line(s) (line {lines}: not whole JSON "
              f"records, as a kill or a full disk leaves); moved into {aside}, the rest of the "
              "log goes on", flush=True)
    return b"".join(kept)


# -----------------------------------------------------------------------------
# Signals held while a tool writes what must go out whole (command.Stop counts them meanwhile)

def hold():
    """Signals are counted, nothing more, until release(): what is written goes out whole."""
    command.Stop.held = True


def release():
    """Signals act again; one that came while held stops the command now."""
    command.Stop.held = False
    if command.Stop.signals:
        raise command.Stopped(command.Stop.name)


# -----------------------------------------------------------------------------
# A decode that fits; the machine, named

def decode_bytes(cfg, num_samples, length, element_size, weights):
    """The bytes a decode of num_samples sequences of `length` tokens takes at its peak: the
    weights, the KV cache (a key and a value per applied block), the prefill's logits and
    activations (the residual stream, MeSH's buffer, attention, the MLP) and the token ids."""
    N, L, D = num_samples, cfg.block_size, cfg.n_embd
    cache = 2 * cfg.shape.depth * N * L * D * element_size + L * L * element_size
    logits = N * L * cfg.vocab_size * element_size + 3 * N * cfg.vocab_size * 4
    activations = N * L * D * (cfg.slots + 8) * 4
    return weights + cache + logits + activations + 2 * N * length * 8 + 40 * length


def check_decode(model, prompt_chars, num_samples, max_new_tokens, device):
    """Refuse a decode beyond the device's memory before allocating (a prompt: a token a char)."""
    (total, where), cfg = device_memory(device), model.config
    weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    need = decode_bytes(cfg, num_samples, max(1, prompt_chars) + max_new_tokens,
                        model.lm_head.weight.element_size(), weights)
    if total and need > total:
        raise UsageError(f"--num_samples={num_samples} and --max_new_tokens={max_new_tokens} need "
                         f"about {need / GiB:,.1f} GiB to decode (the KV cache of "
                         f"{cfg.shape.depth} applied blocks, the logits, the tokens), more than "
                         f"the {total / GiB:,.1f} GiB of {where}; use fewer samples or tokens")


def machine_name(device="cpu"):
    """The GPU's name for a CUDA device, else the CPU's model name."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            models = (line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
            return next(models)
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


# -----------------------------------------------------------------------------
# Output paths: never a run's or a dataset's file

RUN_FILES = ("ckpt.pt", "ckpt-sharded.json", "log.jsonl", "result.json", "train.out")


def _owner(path):
    """(kind, folder, name) where path, or what a link there points to, is a run's file (RUN_FILES,
    a kept checkpoint, anything in one) or a dataset's (anything beside a meta.json); else None."""
    for where in dict.fromkeys((os.path.abspath(path), os.path.realpath(path))):
        inner, folder = where, os.path.dirname(where)
        while folder != inner:  # each folder above, up to the root
            top = os.path.basename(inner)
            if (top in RUN_FILES or SHARDS.match(top) or KEPT.match(top)) and \
                    any(os.path.exists(os.path.join(folder, n)) for n in RUN_FILES[:3]):
                return "run", folder, os.path.relpath(where, folder)
            if inner == where and os.path.isfile(os.path.join(folder, "meta.json")):
                return "dataset", folder, os.path.relpath(where, folder)
            inner, folder = folder, os.path.dirname(folder)
    return None


def check_writable(path, flag, ending="", folder=False):
    """Refuse now, not after a long run, --flag's output (a file ending in `ending`, or a folder)
    where it cannot be written or would land among a run's or a dataset's files."""
    shown, kind = f"--{flag}={path}", "folder" if folder else "file name"
    if os.path.exists(path) and os.path.isdir(path) != folder:
        raise UsageError(f"{shown} is a {'file' if folder else 'folder'}; give a {kind}")
    if os.path.islink(path) and not os.path.exists(path):  # its writer would replace the link
        raise UsageError(f"{shown} is a link to {os.readlink(path)}, which is not there; give a "
                         f"{kind}")
    if not path.lower().endswith(ending):
        raise UsageError(f"{shown} does not end in {ending}; give a {kind} that does")
    found = _owner(os.path.join(path, "x") if folder else path)
    if found:
        what = "a folder" if folder else f"the {found[2]}"
        raise UsageError(f"{shown} is {what} of the {found[0]} in {found[1]}, which no output may "
                         f"write; give another {kind}")
    there = path if folder else os.path.dirname(os.path.abspath(path))
    while not os.path.exists(there):  # folders the writer will make: the nearest one there decides
        there = os.path.dirname(os.path.abspath(there))
    if not os.path.isdir(there) or not os.access(there, os.W_OK) or \
            os.path.exists(path) and not os.access(path, os.W_OK):
        raise UsageError(f"cannot write --{flag}={path}: no permission, or a file where a folder "
                         f"should be")
