"""
How every script runs: its command line parsed against its dataclass of settings, bad input as
one line, a stdout or stderr that fails never its undoing, signals as a clean stop, and locks and
the process group given back on every way out.

    sys.exit(command.main("train.py", train, argv, TrainConfig))  # fn(given) -> its exit code
    stop = command.Stop.poll()   # a loop that can stop cleanly: the first signal is a request
    if stop.requested(): ...     # Ctrl-C, SIGTERM, SIGHUP, or the launcher gone: finish and save

Bad input is a UsageError (configurator.py; the project's other errors subclass it) or an OSError:
one line, exit 2. A model that blew up (FloatingPointError): one line, exit 1. A signal: one line,
exit 130. --debug=true shows the traceback instead; any other exception is a bug and keeps its
traceback.
"""

import errno
import os
import re
import signal
import sys

from configurator import UsageError, parse_flags, report
from support import files

SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")  # SIGHUP: not on Windows
# a collective's error when another process of the job is gone
LOST_PEER = re.compile(r"Connection (reset|closed) by peer|NCCL|gloo|[Tt]imed out|Socket Timeout")
# a project tool that launches a process names itself here, so that the process can outlive nothing
LAUNCHER = "NANOMESH_LAUNCHER"


def main(prog, fn, argv, settings=None, notes="", stopped=None):
    """fn(given) as a command: given its flags parsed against the dataclass `settings` (None: fn
    gets argv as it is); returns the exit code. stopped: what a signal's one line says after
    "stopped by SIGTERM, " (the default: what a kill mid-write leaves)."""
    given, name = {}, os.path.basename(prog)  # tools/probe.py's errors: "probe.py: error: ..."
    kept = keep(name)
    Stop.install()
    try:
        given = argv if settings is None else \
            parse_flags(settings, argv, prog, notes, read_config=files.read_config)
        return fn(given) or 0
    except Exception as e:
        debug = isinstance(given, dict) and given.get("debug")
        if isinstance(e, FloatingPointError) and not debug:
            return report(name, e, code=1)
        if isinstance(e, (UsageError, OSError)) and not debug:
            return report(name, e)
        if isinstance(e, RuntimeError) and LOST_PEER.search(str(e)) and not debug:
            from support import distributed  # another process of the job is gone: one line
            if distributed.grouped():
                return report(name, distributed.lost_peer(e), code=1)
        raise
    except KeyboardInterrupt as e:  # Ctrl-C, or Stopped: a signal that stops at once
        if isinstance(given, dict) and given.get("debug"):
            raise
        signame = e.name if isinstance(e, Stopped) else "SIGINT"
        what = ("after the run finished; its last checkpoint is saved, so nothing is lost"
                if Stop.saved else stopped or "so at once: a file being written, if any, was "
                "dropped, the one before it is as it was")
        print(f"\n{name}: stopped by {signame}, {what}", file=sys.stderr)
        return 130
    finally:
        Stop.restore()
        for module in ("support.log", "support.distributed"):  # a run's log, its process group
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
    """SIGINT, SIGTERM and SIGHUP for the command main() runs. By default a signal raises Stopped
    at once. A loop that can stop cleanly polls instead (poll()): its first signal only sets
    `asked` (train.py finishes its step and saves; table1.py passes the signal on to its runs and
    waits for them); a second signal raises, as does any once finished(). A signal ignored when the
    command started (nohup's SIGHUP) stays ignored. A process a launcher started (torchrun's worker,
    a run of table1.py's) whose launcher is gone stops as if signalled: it checks its parent."""
    signals = 0      # how many came
    polled = False   # a loop polls: the first signal is a request
    saved = False    # the run's last checkpoint is saved: any signal now stops at once
    held = False     # a signal now waits for release() (a result being written whole)
    launcher = None  # the parent pid whose end stops this process
    _previous = []   # (signal, handler) pairs to put back

    @classmethod
    def install(cls):
        cls.signals, cls.polled, cls.saved, cls.held = 0, False, False, False
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
        """From now on the first signal is a request that requested() reports, and `says` what
        follows. launched: this process was started by a launcher (torchrun, or a project tool
        that set LAUNCHER) whose end must stop it too."""
        cls.polled, cls.says = True, says
        ppid, named = os.getppid(), os.environ.get(LAUNCHER, "")
        if launched or named == str(ppid):
            cls.launcher = ppid
        elif named.isdigit() and not files.process_alive(int(named)):  # gone before this poll
            cls.launcher = int(named)
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
        """The run's last checkpoint is saved: a signal now stops at once, as does one that came
        while it was saved. Returns True."""
        cls.saved = True
        if cls.signals:
            raise Stopped(cls.name)
        return True

    @classmethod
    def hold(cls):
        """Signals wait until release(): what is being written goes out whole."""
        cls.held = True

    @classmethod
    def release(cls):
        cls.held = False
        if cls.signals:
            raise Stopped(cls.name)


def ignore_ctrl_c():
    """In a helper process of a command: the terminal's Ctrl-C reaches the whole process group,
    and the parent answers it (ending the helper)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


# -----------------------------------------------------------------------------
# Streams: what a command prints, never its undoing

WHY = {errno.EPIPE: "the program reading it has stopped", errno.EIO: "its terminal is gone",
       errno.ENOSPC: "the file it is redirected to is full"}
_notes = []  # notes of streams given up, not yet in a run's log


class Stream:
    """A text stream that never raises. A write that fails (a reader gone, a lost terminal, a full
    disk) gives the stream up: its descriptor is pointed at os.devnull, one note says so on stderr
    (and in the run's log), and the command goes on. A character the encoding lacks is escaped. A
    print from a signal handler in the middle of a write waits for that write to end."""

    def __init__(self, stream, name, prog):
        self.stream, self.name, self.prog = stream, name, prog
        self.given_up, self.busy, self.waiting = False, False, []

    def write(self, text):
        self._one_at_a_time(self._write, text)
        return len(text)

    def flush(self):
        self._one_at_a_time(self._flush)

    def __getattr__(self, name):  # encoding, fileno, isatty, ...: the stream's own
        return getattr(self.stream, name)

    def _one_at_a_time(self, fn, *args):
        if self.busy:  # called from a signal handler, in the middle of a write: done after it
            self.waiting.append((fn, args))
            return
        self.busy = True
        try:
            fn(*args)
            while self.waiting:
                fn, args = self.waiting.pop(0)
                fn(*args)
        finally:
            self.busy = False

    def _write(self, text):
        if self.given_up:
            return
        try:
            try:
                self.stream.write(text)
            except UnicodeEncodeError:  # an encoding without these characters: escaped (\xe9)
                encoding = self.stream.encoding or "ascii"
                self.stream.write(text.encode(encoding, "backslashreplace").decode(encoding))
        except OSError as e:
            self._give_up(e)

    def _flush(self):
        if self.given_up:
            return
        try:
            self.stream.flush()
        except OSError as e:
            self._give_up(e)

    def _give_up(self, error):
        self.given_up = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.stream.fileno())
            os.close(devnull)
        except (OSError, ValueError):  # no descriptor (a stream in memory): nothing to point
            pass
        why = f"{error.strerror or error}: {WHY[error.errno]}" if error.errno in WHY else error
        note = (f"{self.prog}: note: cannot write to standard {self.name} ({why}); nothing more is "
                f"printed there, and nothing else stops")
        _notes.append(note)
        if self.name != "error":
            sys.stderr.write(note + "\n")


def keep(prog):
    """sys.stdout and sys.stderr through Stream from now on; returns what restore() puts back
    (nothing where they already are, in a command run by another; a stream that is None, as `>&-`
    leaves it, stays None)."""
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
