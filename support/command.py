"""
How every script runs (main): its settings parsed, bad input as one line, a failing stdout never
its undoing, signals as a clean stop (Stop), locks and the process group given back at the end.

    sys.exit(command.main("train.py", train, argv, TrainConfig))  # fn(given) -> its exit code
    stop = command.Stop.poll()   # a loop that can stop cleanly: the first signal is a request

Bad input (UsageError), an OSError or a GPU out of memory: one line, exit 2; a model that blew up
(FloatingPointError): exit 1; a signal: exit 130. A bug keeps its traceback (all do with --debug).
"""

import contextlib
import errno
import os
import re
import signal
import sys

from configurator import UsageError, parse_flags, report
from support import files

SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")  # SIGHUP: not on Windows
LOST_PEER = re.compile(r"Connection (reset|closed) by peer|NCCL|gloo|[Tt]imed out|Socket Timeout")
LAUNCHER = "NANOMESH_LAUNCHER"  # a tool names itself here to the process it starts (Stop.poll)


def main(prog, fn, argv, settings=None, notes="", stopped=None):
    """fn(given) as a command, given argv parsed against the dataclass `settings` (None: argv as it
    is); returns the exit code. stopped: what a signal's line says after "stopped by SIGTERM, "."""
    given, name = {}, os.path.basename(prog)  # tools/probe.py's errors: "probe.py: error: ..."
    kept = keep(name)
    Stop.install()
    try:
        if settings is not None:
            given = parse_flags(settings, argv, prog, notes, read_config=files.read_config)
        return fn(argv if settings is None else given) or 0
    except Exception as e:
        if given.get("debug"):
            raise
        if type(e).__name__ == "OutOfMemoryError":  # torch's: the GPU is full
            said = ". ".join(str(e).split(". ")[:2])  # CUDA out of memory. Tried to allocate X
            e = UsageError(f"{said}; use --device=cpu, or smaller settings")
        if isinstance(e, (UsageError, OSError, FloatingPointError)):  # a blown-up model: exit 1
            return report(name, e, code=1 if isinstance(e, FloatingPointError) else 2)
        if isinstance(e, RuntimeError) and LOST_PEER.search(str(e)):
            from support import distributed, torchrun  # another process of the job is gone
            if distributed.grouped():
                return report(name, torchrun.lost_peer(e), code=1)
        raise
    except KeyboardInterrupt as e:  # Ctrl-C, or Stopped: a signal that stops at once
        if given.get("debug"):
            raise
        signame = e.name if isinstance(e, Stopped) else "SIGINT"
        what = ("after the run finished; its last checkpoint is saved, so nothing is lost"
                if Stop.saved else stopped or "so at once: a file being written, if any, was "
                "dropped, the one before it is as it was")
        print(f"\n{name}: stopped by {signame}, {what}", file=sys.stderr)
        return 130
    finally:
        Stop.restore()
        for module in ("support.run", "support.distributed"):  # a run's log, its process group
            if module in sys.modules:
                sys.modules[module].close()
        files.release()
        restore(kept)


# -----------------------------------------------------------------------------
# Signals

class Stopped(KeyboardInterrupt):
    """A signal that stops the command at once (raised in the main thread, as Ctrl-C is)."""

    def __init__(self, name):
        super().__init__(name)
        self.name = name


class Stop:
    """SIGINT, SIGTERM and SIGHUP for the command main() runs: a signal raises Stopped at once,
    unless a loop polls (poll()): then the first is a request (train.py finishes its step and
    saves), a second raises, as does any once finished(). One ignored at the start (nohup's SIGHUP)
    stays ignored. A process whose launcher (torchrun, table1.py) is gone stops as if signalled."""
    signals = 0      # how many came
    polled = False   # a loop polls: the first signal is a request
    saved = False    # the run's last checkpoint is saved: any signal now stops at once
    held = False     # a signal now is counted, nothing more (tool.hold)
    launcher = None  # the parent pid whose end stops this process
    _previous = []   # (signal, handler) pairs to put back

    @classmethod
    def install(cls):
        cls.signals, cls.polled, cls.saved, cls.held, cls.launcher = 0, False, False, False, None
        for name in SIGNALS:
            signum = getattr(signal, name, None)
            if signum is not None and signal.getsignal(signum) not in (signal.SIG_IGN, None):
                cls._previous.append((signum, signal.signal(signum, cls._on_signal)))

    @classmethod
    def restore(cls):
        while cls._previous:
            signal.signal(*cls._previous.pop())

    @classmethod
    def _on_signal(cls, signum, frame):
        cls.signals += 1
        cls.name = signal.Signals(signum).name
        if cls.held:
            return
        if cls.signals > 1 or cls.saved or not cls.polled:
            raise Stopped(cls.name)
        print(f"\n{cls.name}: {cls.says}", flush=True)

    @classmethod
    def poll(cls, launched=False, says="finishing this step, then saving a checkpoint"):
        """From now on the first signal is a request that requested() reports; `says` what follows.
        launched: started by a launcher (torchrun, a tool setting LAUNCHER) whose end stops it."""
        cls.polled, cls.says = True, says
        named = os.environ.get(LAUNCHER, "")  # a tool's pid: its end is seen once re-parented
        if launched or named.isdecimal():
            cls.launcher = os.getppid() if launched else int(named)
        return cls

    @classmethod
    def requested(cls):
        """Whether the loop should stop after this step: a signal came, or the launcher is gone."""
        if cls.launcher is not None and not cls.signals and os.getppid() != cls.launcher:
            cls.signals, cls.name = 1, "the launcher's end"
            print(f"the process that launched this one (pid {cls.launcher}) is gone: "
                  f"finishing this step, then saving a checkpoint", flush=True)
        return cls.signals > 0

    @classmethod
    def finished(cls):
        """The last checkpoint is saved: a signal now (or one while saving) stops at once. True."""
        cls.saved = True
        if cls.signals:
            raise Stopped(cls.name)
        return True


# -----------------------------------------------------------------------------
# Streams: what a command prints, never its undoing

WHY = {errno.EPIPE: "the program reading it has stopped", errno.EIO: "its terminal is gone",
       errno.ENOSPC: "the file it is redirected to is full"}
_notes = []  # notes of streams given up, not yet in a run's log


class Stream:
    """A stream that never raises: a failed write (a reader gone, a lost terminal, a full disk)
    points it at os.devnull, says so once on stderr (and in the run's log), and the command goes
    on. A character the encoding lacks is escaped; a signal handler's print waits for the write."""

    def __init__(self, stream, name, prog):
        self.stream, self.name, self.prog = stream, name, prog
        self.given_up, self.busy, self.waiting = False, False, []

    def write(self, text):
        self._one_at_a_time(self._write, text)
        return len(text)

    def flush(self):
        self._one_at_a_time(self.stream.flush)

    def __getattr__(self, name):  # encoding, fileno, isatty, ...: the stream's own
        return getattr(self.stream, name)

    def _one_at_a_time(self, fn, *args):
        self.waiting.append((fn, args))
        if self.busy:  # called from a signal handler, in the middle of a write: done after it
            return
        self.busy = True
        try:
            while self.waiting:
                fn, args = self.waiting.pop(0)
                if self.given_up:
                    continue
                try:
                    fn(*args)
                except OSError as e:
                    self._give_up(e)
        finally:
            self.busy = False

    def _write(self, text):
        try:
            self.stream.write(text)
        except UnicodeEncodeError:  # an encoding without these characters: escaped (\xe9)
            encoding = self.stream.encoding or "ascii"
            self.stream.write(text.encode(encoding, "backslashreplace").decode(encoding))

    def _give_up(self, error):
        self.given_up = True
        # (a stream in memory has no descriptor to point: ValueError)
        with contextlib.suppress(OSError, ValueError), open(os.devnull, "wb") as devnull:
            os.dup2(devnull.fileno(), self.stream.fileno())
        why = f"{error.strerror or error}: {WHY[error.errno]}" if error.errno in WHY else error
        note = (f"{self.prog}: note: cannot write to standard {self.name} ({why}); nothing more "
                f"is printed there, and nothing else stops")
        _notes.append(note)
        if self.name != "error":
            sys.stderr.write(note + "\n")


def keep(prog):
    """sys.stdout and sys.stderr through Stream from now on (unless they are, or are None, as `>&-`
    leaves one); returns what restore() puts back."""
    kept = []
    for name, word in (("stdout", "output"), ("stderr", "error")):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, Stream):
            kept.append((name, stream))
            setattr(sys, name, Stream(stream, word, prog))
    return kept


def note():
    """The notes of the streams given up since the last call, as one string, or None."""
    text = " ".join(_notes) or None
    _notes.clear()
    return text


def restore(kept):
    """Flush the streams keep() replaced (a failure given up, as ever) and put them back."""
    for name, stream in kept:
        current = getattr(sys, name)
        if isinstance(current, Stream) and current.stream is stream:
            current.flush()
            setattr(sys, name, stream)
    if kept:
        _notes.clear()
