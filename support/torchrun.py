"""
A torchrun job's processes: they join their group first, as nanoGPT's do, and agree on one OUT_DIR
and on whether torchrun restarted them; a collective that fails is one line naming the lost peer.
resolve() (support/run.py) imports this only under torchrun (RANK set): one process never does.

    rank, world = join(tc.dist_timeout)  # torchrun's RANK and WORLD_SIZE, the group joined
    one_folder(out_dir)                  # every node sees rank 0's OUT_DIR, or all stop
    if restarted(out_dir): ...           # a restart after a save continues the run
"""

import contextlib
import datetime
import os
import platform
import re

import torch.distributed as dist

from configurator import UsageError
from support import checkpoint, files
from support.distributed import launch_id

_timeout = []  # the process group's --dist_timeout, for the words of its errors


def join(timeout):
    """Join this torchrun job's process group, as nanoGPT does, first: gloo for CPU tensors, NCCL
    for CUDA's where there is CUDA; waits of timeout s. -> (rank, world size)."""
    rank, size = os.environ["RANK"], os.environ.get("WORLD_SIZE")
    try:
        rank, size = int(rank), int(size)
        if not 0 <= rank < size:
            raise ValueError
    except (TypeError, ValueError):
        raise UsageError(f"RANK={rank} needs WORLD_SIZE, with 0 <= RANK < WORLD_SIZE "
                         f"(got WORLD_SIZE={size}); launch with torchrun, which sets both, "
                         f"or unset RANK") from None
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        variables = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
        names = [k for k in variables if k in os.environ]
        found = " ".join(f"{k}={os.environ[k]}" for k in names)
        raise UsageError(f"{found} set, but not by torchrun (no TORCHELASTIC_RUN_ID): "
                         f"left in this shell by an earlier job? unset {' '.join(names)}, "
                         f"or launch with torchrun (another launcher: set "
                         f"TORCHELASTIC_RUN_ID to say they are meant)")
    _timeout[:] = [timeout]
    wait = datetime.timedelta(seconds=timeout)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0
    try:  # torchrun's store, through torch's env:// rendezvous; no backend: each device's own
        store, rank, size = next(dist.rendezvous("env://", rank, size, timeout=wait))
        # a restart's keys apart from its killed processes': torchrun keeps one store for all
        store = dist.PrefixStore(f"nanomesh/attempt_{attempt}", store)
        dist.init_process_group(store=store, rank=rank, world_size=size, timeout=wait)
    except (RuntimeError, ValueError) as e:  # the others never came
        raise UsageError(f"could not join the other processes of this torchrun job "
                         f"({first_line(e)}): one failed before joining (its own output says "
                         f"why), or did not come within --dist_timeout={timeout:g} s") from None
    return rank, size


def one_folder(out_dir):
    """Stop every process with one line unless all see rank 0's out_dir (several machines)."""
    world = dist.get_world_size()
    if int(os.environ.get("LOCAL_WORLD_SIZE", world)) == world:
        return  # one process, or one machine
    made, token = not os.path.isdir(out_dir), None
    try:
        if dist.get_rank() == 0:
            os.makedirs(out_dir, exist_ok=True)
            token = files.temporary_name(os.path.join(out_dir, "one-folder"))  # made, empty
        name = [os.path.basename(token or "")]
        dist.broadcast_object_list(name, src=0)
        blind = [None] * world
        seen = os.path.isfile(os.path.join(out_dir, name[0]))
        dist.all_gather_object(blind, "" if seen else platform.node())
    finally:
        if dist.get_rank() == 0 and token:
            files.remove(token)
            if made:
                with contextlib.suppress(OSError):  # empty again, unless another came
                    os.rmdir(out_dir)
    r, host = next(((r, host) for r, host in enumerate(blind) if host), (0, ""))
    if host:
        raise UsageError(f"--out_dir={out_dir} is not one folder for all processes: rank {r} (on "
                         f"{host}) does not see the file rank 0 wrote there; several nodes need "
                         f"one out_dir on a filesystem every node sees, at the same path")


def restarted(out_dir):
    """Whether torchrun restarted this launch after it saved a checkpoint in out_dir: its run
    continues from there (--init_from=resume), whatever the flags say."""
    count = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if count in ("", "0"):
        return False
    if launch_id() not in [state.get("launch") for *_, state in checkpoint.found(out_dir)]:
        return False  # (join() made sure the launch has an id)
    if os.environ.get("RANK", "0") == "0":
        print(f"torchrun restart {count} of this launch: continuing its run in {out_dir} from its "
              f"last checkpoint (--init_from=resume)", flush=True)
    return True


def first_line(error):
    """The first line of a torch.distributed error, without gloo's or c10d's source location."""
    first = (str(error).strip().splitlines() or [""])[0]
    return re.sub(r"^\[[^\]]*\]\s*", "", first)[:160]


def lost_peer(error):
    """The one line for a failed collective: a peer stopped or did not answer in --dist_timeout."""
    first = first_line(error)
    if not re.search(r"timed out|timeout", first, re.IGNORECASE):
        return f"another process of this torchrun job stopped ({first}); its own output says why"
    rank, world = dist.get_rank(), dist.get_world_size()
    peer = f"rank {1 - rank}" if world == 2 else f"one of the other {world - 1} processes"
    return (f"rank {rank}: no answer from {peer} of this torchrun job within "
            f"--dist_timeout={_timeout[0]:g} s ({first}): it is frozen (stopped, or swapping) "
            f"or its machine cannot be reached; the last checkpoint is whole: "
            f"continue with --init_from=resume")
