"""
Helper processes a command spawns (data/prepare.py's --num_proc workers, bench.py's measuring
process). A Ctrl-C, a hang-up or `kill -TERM -PGID` reaches the whole group: the command alone
answers it, by ending its helpers (one it ended mid-message could leave it hung).

    spawn.helper()                    # a helper's first line: it ignores them from then on
    unblock = spawn.start(processes)  # the signals held until each helper ignores them
    unblock()                         # once the command can answer one: a held one lands here
"""

import multiprocessing.resource_tracker
import signal

from support.command import SIGNALS


def helper():
    """A helper process's first call: it ignores the group's signals from now on."""
    for signum in filter(None, (getattr(signal, name, None) for name in SIGNALS)):
        signal.signal(signum, signal.SIG_IGN)  # SIGHUP: not on Windows


def start(processes):
    """Start processes (spawned) with SIGNALS blocked, inherited, so that none lands in a helper
    before helper() -> unblock(), to call once the caller can answer a signal (POSIX; Windows
    has no pthread_sigmask: there they start as they are). A failed start ends those started."""
    mask = getattr(signal, "pthread_sigmask", None)
    if mask:  # the resource tracker first: its start unblocks them
        multiprocessing.resource_tracker.ensure_running()
        old = mask(signal.SIG_BLOCK, [getattr(signal, name) for name in SIGNALS])
    unblock = lambda: mask and mask(signal.SIG_SETMASK, old)  # noqa: E731
    try:
        for p in processes:
            p.start()
    except BaseException:  # an OSError (out of processes, of memory)
        unblock()
        for p in processes:
            if p.pid:
                p.kill()
                p.join()
        raise
    return unblock
