"""
What a command prints, never its undoing: guards.command puts every print of train.py and
sample.py (theirs, support's, a warning's) through Stream, which cannot raise. A stream that fails,
a pipe whose reader is gone (`| head -3`, a `| tee` ended by the same Ctrl-C), a terminal lost with
its ssh connection (EIO), a redirected log on a full disk, is given up: one note names it on stderr
and in the run's log.jsonl, and the run goes on to its checkpoint. A character the stream's
encoding lacks (PYTHONIOENCODING=ascii) is escaped, never an error.

    kept = console.keep("train.py")  # sys.stdout and sys.stderr through Stream, for the command
    note = console.note()            # the note of a stream given up, once (RunLog logs it)
    console.restore(kept)            # flushed (a failure given up, as ever) and put back
"""

import errno
import os
import sys

WHY = {errno.EPIPE: "the program reading it has stopped", errno.EIO: "its terminal is gone",
       errno.ENOSPC: "the file it is redirected to is full"}
_notes = []  # notes of streams given up, not yet in a run's log


class Stream:
    """A text stream that never raises. A write that fails gives the stream up: its descriptor is
    pointed at os.devnull, so that what is still buffered (and Python's flush at exit) goes there
    instead of failing. A print from a signal handler, arriving in the middle of another write,
    waits for that write to end (a buffered stream refuses a write from inside itself)."""

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
    """From now on sys.stdout and sys.stderr write through Stream: returns what restore() puts
    back (nothing where they already do, in a command run by another; a stream that is None, as
    `>&-` leaves it, stays None: print then writes nothing)."""
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
    """Flush the streams keep() replaced, a failure given up as ever, and put them back."""
    for name, stream in kept:
        current = getattr(sys, name)
        if isinstance(current, Stream) and current.stream is stream:
            current.flush()
            setattr(sys, name, stream)
    if kept:
        _notes.clear()
