"""
The guards around a run: bad input as one line, a signal as a clean stop, and no checkpoint of a
model that blew up. train.py reaches each by one call; sample.py uses command() too, and the
simpler tools tool().

    sys.exit(guards.command("train.py", TrainConfig, train, argv))  # one line, exit 2, bad input
    return guards.tool("probe.py", command, argv)  # a tool's bad input one line, its stdout guarded
    stop = guards.Stop(rank, distributed)    # Ctrl-C, SIGTERM, SIGHUP, a lost torchrun
    guards.check_saveable(model, optimizer, losses, iter_num, last_good, distributed)
"""

import math
import os
import re
import signal
import sys

import torch
import torch.distributed as dist

from support import console, machine, outdir, plain
from configurator import UsageError, parse_flags, report

# a collective's error when another process of the job is gone
LOST_PEER = re.compile(r"Connection (reset|closed) by peer|NCCL|gloo|[Tt]imed out|Socket Timeout")
# an evaluated loss above DIVERGED x ln(vocab) (ten times a uniform guess's) means training blew up
DIVERGED = 10


def command(prog, settings, fn, argv, notes=""):
    """fn(given) as a command, given the flags of argv parsed against the dataclass `settings`: its
    exit code. Bad input (a UsageError, the project's one error class, which its other errors
    subclass; a file that cannot be used, an OSError) is one line on stderr and exit 2; a model that
    blew up (FloatingPointError) one line and exit 1; --debug=true shows the traceback instead. Any
    other exception is a bug (a ValueError from PyTorch included): its traceback shows the file and
    line. On every way out, signal handlers, OUT_DIR locks and the process group are given back."""
    given, kept = {}, console.keep(prog)  # a failing stdout or stderr stops nothing: one note
    try:
        given = parse_flags(settings, argv, prog, notes, read_config=plain.read_config)
        return fn(given)
    except FloatingPointError as e:
        if given.get("debug"):
            raise
        return report(prog, e, code=1)
    except (UsageError, OSError) as e:
        if given.get("debug"):
            raise
        return report(prog, e)
    except KeyboardInterrupt:
        # a Ctrl-C before training, a second one while saving, or one in the sample
        if given.get("debug"):
            raise
        if Stop.saved:
            print(f"\n{prog}: interrupted after the run finished; its last checkpoint is saved, so "
                  f"nothing is lost", file=sys.stderr)
            return 130
        print(f"\n{prog}: interrupted, so stopped at once: a checkpoint being written, if any, "
              f"was dropped, the one before it is as it was", file=sys.stderr)
        return 130
    except RuntimeError as e:
        # another process of the job is gone: one line here, not gloo's 50-line traceback
        grouped = dist.is_available() and dist.is_initialized()
        if given.get("debug") or not LOST_PEER.search(str(e)) or not grouped:
            raise
        return report(prog, machine.lost_peer(e), code=1)
    finally:
        Stop.restore()
        outdir.release()
        machine.stop()
        console.restore(kept)


def tool(prog, run, argv):
    """run(argv) as one of tools/' commands, its result: its stdout guarded as train.py's is (one
    that fails is a note, never a traceback), the project's errors (a UsageError, an OSError) one
    line and exit 2; any other exception is a bug, and keeps its traceback."""
    kept = console.keep(prog)  # a failing stdout stops nothing: one note on stderr
    try:
        return run(argv)
    except (UsageError, OSError) as e:
        raise SystemExit(report(prog, e))
    finally:
        console.restore(kept)


class Stop:
    """Asks the training loop to stop after the current step and save a checkpoint: on Ctrl-C
    (SIGINT), SIGTERM or SIGHUP, and under torchrun when the launcher is gone (a killed torchrun
    leaves its workers re-parented, so each worker checks its parent). A second signal stops at
    once, as does any signal once the run is finished(). A signal ignored when the run started
    (nohup's SIGHUP) stays ignored."""
    _previous = []  # (signal, handler) pairs to restore
    saved = False   # the run's last checkpoint is saved: only its closing sample is left

    def __init__(self, rank, distributed):
        self.rank, self.asked = rank, False
        self.launcher = os.getppid() if distributed else None
        for name in ("SIGINT", "SIGTERM", "SIGHUP"):  # SIGHUP: not on Windows
            signum = getattr(signal, name, None)
            if signum is None or signal.getsignal(signum) == signal.SIG_IGN:
                continue  # ignored when the run started (nohup's SIGHUP): it stays ignored
            Stop._previous.append((signum, signal.signal(signum, self._on_signal)))

    def _on_signal(self, signum, frame):
        if self.asked or Stop.saved:
            raise KeyboardInterrupt
        self.asked = True
        if self.rank == 0:
            print(f"\n{signal.Signals(signum).name}: finishing this step, then saving a checkpoint",
                  flush=True)

    def requested(self):
        if self.launcher is not None and not self.asked and os.getppid() != self.launcher:
            self.asked = True
            print(f"rank {self.rank}: the torchrun launcher (pid {self.launcher}) is gone: "
                  f"finishing this step, then saving a checkpoint", flush=True)
        return self.asked

    def finished(self):
        """The run has saved its last checkpoint: a signal now stops at once (the closing sample),
        and so does one that came while it was saved."""
        Stop.saved = True
        if self.asked:
            raise KeyboardInterrupt
        return True

    @classmethod
    def restore(cls):
        cls.saved = False
        while cls._previous:
            signal.signal(*cls._previous.pop())


def _local(v):
    """This rank's shard of a tensor under FSDP (a DTensor), else the tensor itself."""
    return v.to_local() if hasattr(v, "to_local") else v


def unsaveable(model, optimizer, losses):
    """Why this model must not be saved, or None: an evaluated loss that is not finite or that has
    blown up (far worse than a uniform guess), or a weight or optimizer state that is not finite."""
    limit = DIVERGED * math.log(model.config.vocab_size)
    for split, loss in losses.items():
        if not math.isfinite(loss):
            return f"{split} loss is {loss}"
        if loss > limit:
            return f"{split} loss is {loss:.4g} (above {limit:.4g}, {DIVERGED} x ln(vocab_size))"
    tensors = {f"weight {k}": _local(v) for k, v in model.state_dict().items()
               if v.is_floating_point()}
    names = {p: name for name, p in model.named_parameters()}
    for p, state in optimizer.state.items():
        owner = names.get(p, "a parameter")
        for k, v in state.items():
            if torch.is_tensor(v) and v.is_floating_point():
                tensors[f"optimizer {k} of {owner}"] = _local(v)
    finite = torch.stack([torch.isfinite(v).all() for v in tensors.values()]).tolist()
    return next((f"{name} is not finite" for name, ok in zip(tensors, finite) if not ok), None)


def check_saveable(model, optimizer, losses, iter_num, last_good, distributed):
    """Raise FloatingPointError, naming the last good checkpoint (last_good(), in words), unless the
    model may be saved. Every rank sees the same losses; under FSDP each checks its own shards, and
    all stop if any found one that is not finite."""
    reason = unsaveable(model, optimizer, losses)
    if distributed:
        flag = torch.tensor(float(reason is not None), device=model.lm_head.weight.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if not reason and flag.item():
            reason = "a weight or optimizer state on another rank is not finite"
    if reason:
        raise FloatingPointError(f"{reason} at iter {iter_num}; stopped without saving, "
                                 f"so {last_good()}")
