"""
Training over many processes with torchrun: the process group, and the model spread whole with DDP
(Spread) or sharded with FSDP2 (--fsdp=true: Sharded); train.py never asks which.

    distributed, rank, world = process_group()          # torchrun's RANK, WORLD_SIZE
    spread = spread_over(tc, distributed, world)        # --fsdp: Sharded, else Spread
    raw_model, model = spread.wrap(model, device, tc, scratch=True)  # model: compiled, in DDP
    with spread.sync(model, last=...): loss.backward()  # DDP all-reduces at the last micro-batch

FSDP2's units: one per unique block, plus the root; a shared core's K gradients accumulate into
one shard. On GPUs blocks gather bf16 weights and reduce float32 gradients.
"""

import datetime
import inspect
import os
import platform
import re
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from configurator import UsageError
from support import checkpoint, files

# DDP's switch for syncing buffers at every forward: forward_sync_buffers from torch 2.13 on
NO_BUFFER_SYNC = next(k for k in ("forward_sync_buffers", "broadcast_buffers")
                      if k in inspect.signature(DDP).parameters)
_started = {}  # the process group's settings, for the words of its errors


class LaunchError(UsageError):
    """This process could not join its torchrun job: one line, exit 2."""


# -----------------------------------------------------------------------------
# The processes of a torchrun job

def process_group():
    """(distributed, rank, world size) from torchrun's RANK and WORLD_SIZE; no RANK: one process."""
    rank, size = os.environ.get("RANK", "-1"), os.environ.get("WORLD_SIZE")
    if rank == "-1":
        return False, 0, 1
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
    return True, rank, size


def join(device, timeout):
    """Join this torchrun job's process group (NCCL on GPUs, else gloo), waits of timeout s."""
    _started["timeout"] = timeout
    try:
        dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo",
                                timeout=datetime.timedelta(seconds=timeout), store=store(timeout),
                                rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]))
    except RuntimeError as e:  # the others never came
        raise not_joined(e, timeout) from None


def not_joined(error, timeout):  # the line for a process that could not join its job
    return LaunchError(f"could not join the other processes of this torchrun job "
                       f"({first_line(error)}): one failed before joining (its own output says "
                       f"why), or did not come within --dist_timeout={timeout:g} s")


def store(timeout):
    """This job's key-value store, prefixed by the restart (never a killed process's keys)."""
    if "store" not in _started:
        agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        try:
            tcp = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                                is_master=not agent and os.environ["RANK"] == "0",
                                timeout=datetime.timedelta(seconds=timeout), wait_for_workers=False)
        except RuntimeError as e:
            raise not_joined(e, timeout) from None
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        _started["store"] = dist.PrefixStore(f"nanomesh/attempt_{attempt}", tcp)
    return _started["store"]


def one_folder(out_dir, timeout):
    """Stop every process with one line unless all see rank 0's out_dir."""
    world, local = int(os.environ.get("WORLD_SIZE", 1)), os.environ.get("LOCAL_WORLD_SIZE")
    if os.environ.get("RANK", "-1") == "-1" or int(local or world) == world:
        return  # one process, or one machine
    rank, token = int(os.environ["RANK"]), None
    jobs, made = store(timeout), not os.path.isdir(out_dir)
    try:
        if rank == 0:
            os.makedirs(out_dir, exist_ok=True)
            token = files.temporary_name(os.path.join(out_dir, "one-folder"))  # made, empty
            jobs.set("token", os.path.basename(token))
        seen = os.path.isfile(os.path.join(out_dir, jobs.get("token").decode()))
        jobs.set(f"saw/{rank}", "" if seen else platform.node())
        jobs.wait([f"saw/{r}" for r in range(world)])
        blind = [(r, jobs.get(f"saw/{r}").decode()) for r in range(world)]
    except RuntimeError as e:  # a store's timeout: a process never came, or stopped
        raise not_joined(e, timeout) from None
    finally:
        if token:
            files.remove(token)
            files.disown(token)
            if made:
                os.rmdir(out_dir)
    r, host = next(((r, host) for r, host in blind if host), (0, ""))
    if host:
        raise UsageError(f"--out_dir={out_dir} is not one folder for all processes: rank {r} (on "
                         f"{host}) does not see the file rank 0 wrote there; several nodes need "
                         f"one out_dir on a filesystem every node sees, at the same path")


def launch_id():
    """This process's torchrun launch, as checkpoints record it (the run id, or machine:pid)."""
    run = os.environ.get("TORCHELASTIC_RUN_ID")
    if run is None:
        return None
    return run if run != "none" else f"none@{platform.node()}:{os.getppid()}"


def restarted(given, out_dir, master):
    """The flags given, or for a torchrun restart, those that resume its checkpoint."""
    count = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if count in ("", "0") or given.get("init_from") == "resume" or launch_id() is None:
        return given
    if launch_id() not in checkpoint.launches(out_dir):
        return given  # this launch saved nothing there yet: it starts as it was asked to
    if master:
        print(f"torchrun restart {count} of this launch: continuing its run in {out_dir} from its "
              f"last checkpoint (--init_from=resume)", flush=True)
    return {**{k: v for k, v in given.items() if k != "overwrite"}, "init_from": "resume"}


def first_line(error):
    """The first line of a torch.distributed error, without gloo's or c10d's source location."""
    text = str(error).strip()
    first = text.splitlines()[0] if text else ""
    return re.sub(r"^\[[^\]]*\]\s*", "", first)[:160]


def grouped():
    return dist.is_available() and dist.is_initialized()


def lost_peer(error):
    """The one line for a failed collective: a peer stopped, or did not answer in --dist_timeout."""
    first = first_line(error)
    if not re.search(r"timed out|timeout", first, re.IGNORECASE):
        return f"another process of this torchrun job stopped ({first}); its own output says why"
    rank, world = dist.get_rank(), dist.get_world_size()
    peer = f"rank {1 - rank}" if world == 2 else f"one of the other {world - 1} processes"
    timeout = _started.get("timeout", 0)
    return (f"rank {rank}: no answer from {peer} of this torchrun job within "
            f"--dist_timeout={timeout:g} s ({first}): it is frozen (stopped, or swapping) "
            f"or its machine cannot be reached; the last checkpoint is whole: "
            f"continue with --init_from=resume")


def launch(world):
    """How this job was started, as a command to start it again."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if world == 1 and "RANK" not in os.environ:
        return "python"
    if local == world:
        return f"torchrun --standalone --nproc_per_node={world}"
    return (f"torchrun --nnodes={world // local} --nproc_per_node={local} "
            f"(and this job's rendezvous flags)")


def close():
    """End this process's process group, if it started one."""
    if grouped():
        dist.destroy_process_group()


def from_rank0(fn, distributed, master):
    """fn() on rank 0, its result or one-line error shared with every rank: one decision for all."""
    result, failed = None, None
    if master:
        try:
            result = fn()
        except UsageError as e:
            failed = e
    if distributed:
        shared = [result, None if failed is None else str(failed)]
        dist.broadcast_object_list(shared, src=0)
        result, failed = shared[0], failed or (shared[1] is not None and UsageError(shared[1]))
    if failed:
        raise failed
    return result


# -----------------------------------------------------------------------------
# How the model is spread: whole (one process, DDP) or sharded (FSDP2)

def spread_over(tc, distributed, world):
    """Sharded with --fsdp=true, else Spread; --grad_accum must share out evenly."""
    tc.grad_accum = tc.grad_accum or world  # one micro-batch a process, saved
    if tc.grad_accum % world:
        raise UsageError(f"--grad_accum={tc.grad_accum} does not divide by the world size "
                         f"{world}; use a multiple of {world}")
    return Sharded(distributed) if tc.fsdp else Spread()


class Spread:
    """The whole model on every process: one process, or DDP under torchrun."""
    name = ""                     # the startup line's word for it
    checkpoint = checkpoint.CKPT  # the file it saves, which a resume continues from
    flag = ""                     # what the command that resumes it adds

    def wrap(self, model, device, tc, scratch):
        """(the model on its device, what trains: compiled, in DDP, with rank 0's weights)."""
        raw = model.to(device)
        model = torch.compile(raw) if tc.compile else raw
        if dist.is_initialized():  # no buffers to broadcast
            ids = [torch.device(device).index] if device.startswith("cuda") else None
            model = DDP(model, device_ids=ids, **{NO_BUFFER_SYNC: False})
        return raw, model

    def sync(self, model, last):
        """DDP all-reduces gradients in backward: only at a step's last micro-batch."""
        if isinstance(model, DDP) and not last:
            return model.no_sync()
        return nullcontext()

    def save(self, out_dir, model, optimizer, master, state):
        """OUT_DIR/ckpt.pt, by rank 0: state (plain data), the model's and AdamW's state dicts."""
        if master:
            whole = {**state, "model": model.state_dict(), "optimizer": optimizer.state_dict()}
            checkpoint.save(whole, os.path.join(out_dir, checkpoint.CKPT))

    def load(self, resume, model, optimizer):
        """AdamW's state from the checkpoint (the model came with it)."""
        optimizer.load_state_dict(resume["optimizer"])


class Sharded(Spread):
    """The model's weights, gradients and AdamW state sharded over the processes (FSDP2)."""
    name = " (FSDP)"
    checkpoint = checkpoint.POINTER
    flag = " --fsdp=true"

    def __init__(self, distributed):
        if not distributed:
            raise UsageError("--fsdp=true shards over processes started by torchrun, e.g. torchrun "
                             "--standalone --nproc_per_node=8 train.py ... --fsdp=true (one "
                             "process: --nproc_per_node=1)")

    def wrap(self, model, device, tc, scratch):
        """(the sharded model, what trains: compiled); a scratch model takes rank 0's weights."""
        if not device.startswith("cuda") and torch.__version__ < (2, 7):  # FSDP2's CPU streams
            raise UsageError(f"--fsdp=true on {device} needs torch 2.7 or later (this is "
                             f"{torch.__version__}): upgrade torch, or train without --fsdp (DDP)")
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        model = model.to(device)  # fully_shard keeps shards in place
        if scratch:
            for p in model.parameters():
                dist.broadcast(p.data, src=0)
        # bf16 gathering on GPUs only: CPU autocast runs LayerNorm in the input's dtype, so bf16
        # weights cannot meet a float32 residual stream there (CUDA autocast: LayerNorm in float32)
        bf16 = tc.dtype == "bfloat16" and device.startswith("cuda")
        mesh = init_device_mesh(device.split(":")[0], (dist.get_world_size(),))
        blocks = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                      cast_forward_inputs=False) if bf16 else MixedPrecisionPolicy()
        for block in [*model.prelude, *(b for core in model.cores for b in core), *model.coda]:
            fully_shard(block, mesh=mesh, mp_policy=blocks)
        # the root too frees its gathered weights after a forward
        fully_shard(model, mesh=mesh, reshard_after_forward=True)
        return model, torch.compile(model) if tc.compile else model

    def sync(self, model, last):
        """FSDP reduce-scatters the gradients at every micro-batch: no rank holds a whole one."""
        return nullcontext()

    def save(self, out_dir, model, optimizer, master, state):
        """A sharded checkpoint: each rank writes its shards, rank 0 the pointer."""
        checkpoint.save_sharded(out_dir, model, optimizer, master, state)

    def load(self, resume, model, optimizer):
        """A sharded checkpoint's shards, or a whole one's optimizer state cut to this rank's."""
        if "folder" in resume:
            checkpoint.load_sharded(os.path.dirname(resume["path"]), resume, model, optimizer)
        else:
            optimizer.load_state_dict(shard_optimizer_state(resume["optimizer"], optimizer))


def shard_optimizer_state(state_dict, optimizer):
    """A whole optimizer state dict, each sharded parameter's tensors cut to this rank's shard."""
    from torch.distributed.tensor import DTensor, distribute_tensor
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = {}
    for i, entry in state_dict["state"].items():
        p = params[int(i)]
        state[i] = {k: distribute_tensor(v.to(p.device_mesh.device_type), p.device_mesh,
                                         p.placements)
                    if isinstance(p, DTensor) and v.shape == p.shape else v
                    for k, v in entry.items()}
    return {"state": state, "param_groups": state_dict["param_groups"]}
