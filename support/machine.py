"""
Where a run runs: its processes (torchrun), its device and dtype, and the chip's peak for MFU.

    # torchrun's RANK and WORLD_SIZE; (False, 0, 1) alone
    distributed, rank, world = process_group()
    # under torchrun "cuda:LOCAL_RANK", its group started
    device = Device(tc, distributed, master)
    device.name, device.type, device.dtype, device.autocast, device.mfu(cfg, tokens, seconds, world)
"""

import datetime
import os
import platform
import re
from contextlib import nullcontext

import torch
import torch.distributed as dist

from configurator import UsageError

# Dense bf16 peak FLOP/s by the exact name torch.cuda.get_device_name gives (every A100 is
# 312e12): exact, because substrings mislead ("L40S" contains "L4", "H100 PCIe" is not an SXM
# H100). Not listed: no MFU.
PEAK_BF16_FLOPS = {"NVIDIA H100 80GB HBM3": 989e12, "NVIDIA H100": 989e12,
                   "NVIDIA H100 PCIe": 756e12, "NVIDIA H100 NVL": 835e12, "NVIDIA H200": 989e12,
                   "NVIDIA L40S": 362e12, "NVIDIA L40": 181e12, "NVIDIA L4": 121e12,
                   "NVIDIA A10": 125e12}


class LaunchError(UsageError):
    """This process could not join its torchrun job: one line, exit 2."""


_started = {}  # the process group's settings, for the words of its errors


def process_group():
    """(distributed, rank, world size) from torchrun's RANK and WORLD_SIZE; RANK unset (or -1): one
    process. RANK set but not by torchrun (a shell's leftover of an earlier job) is refused: it
    would wait for peers."""
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
    # torchrun sets it: without it the peers would never come
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        variables = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
        names = [k for k in variables if k in os.environ]
        found = " ".join(f"{k}={os.environ[k]}" for k in names)
        raise UsageError(f"{found} set, but not by torchrun (no TORCHELASTIC_RUN_ID): "
                         f"left in this shell by an earlier job? unset {' '.join(names)}, "
                         f"or launch with torchrun (another launcher: set "
                         f"TORCHELASTIC_RUN_ID to say they are meant)")
    return True, rank, size


def launch_id():
    """Which torchrun launch this process belongs to, as its checkpoints record it (None outside
    torchrun): torchrun's run id, random for each --standalone launch, a multi-node job's --rdzv_id;
    where that is torchrun's default "none", with this machine and its launcher's process."""
    run = os.environ.get("TORCHELASTIC_RUN_ID")
    if run is None:
        return None
    return run if run != "none" else f"none@{platform.node()}:{os.getppid()}"


def restarted(given, out_dir, master):
    """The flags given, or, for a torchrun restart (--max-restarts:
    TORCHELASTIC_RESTART_COUNT > 0) of a launch whose checkpoint is in out_dir, the flags that
    continue it (--init_from=resume): started again, the run would begin at iter 0 over its own
    checkpoint (--overwrite) or refuse its folder."""
    count = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if count in ("", "0") or given.get("init_from") == "resume" or launch_id() is None:
        return given
    from support import checkpoint  # (the model's modules: loaded only for a restart)
    if launch_id() not in checkpoint.launches(out_dir):
        return given  # this launch saved nothing there yet: it starts as it was asked to
    if master:
        print(f"torchrun restart {count} of this launch: continuing its run in {out_dir} from its "
              f"last checkpoint (--init_from=resume)", flush=True)
    return {**{k: v for k, v in given.items() if k != "overwrite"}, "init_from": "resume"}


def start(name, distributed, timeout=1800.0):
    """The device of this process (--device); under torchrun also its process group (NCCL on GPUs,
    else gloo). Each process takes GPU LOCAL_RANK, so that RNG states, bf16 checks and kernels use
    it, not GPU 0."""
    device = resolve_device(name)
    if distributed and device.startswith("cuda"):
        local, count = int(os.environ.get("LOCAL_RANK", 0)), torch.cuda.device_count()
        if local >= count:
            raise UsageError(f"this process is torchrun's local rank {local}, but this machine has "
                             f"{count} GPU(s): start at most {count} process(es) a machine "
                             f"(--nproc_per_node={count})")
        device = f"cuda:{local}"
    if device.startswith("cuda:"):
        torch.cuda.set_device(device)
    # timeout: how long a collective waits on the others (a frozen peer, then a line)
    if distributed:
        _started["timeout"] = timeout
        wait = datetime.timedelta(seconds=timeout)
        try:
            dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo",
                                    timeout=wait, **attempt_store(wait))
        except RuntimeError as e:  # torch's DistStoreError, DistNetworkError: the others never came
            raise LaunchError(f"could not join the other processes of this torchrun job "
                              f"({first_line(e)}): one failed before joining (its own output "
                              f"says why), or did not come within "
                              f"--dist_timeout={timeout:g} s") from None
    return device


def attempt_store(wait):
    """init_process_group's store under torchrun's agent store, keyed by the restart: torchrun
    keeps one store for every attempt of a launch, so a restarted process could read the address
    a killed one published (gloo: "Connection refused") before its new peer replaces it. {}
    outside torchrun."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return {}
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    agent = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False, timeout=wait)
    return {"store": dist.PrefixStore(f"nanomesh/attempt_{attempt}", agent),
            "rank": int(os.environ["RANK"]), "world_size": int(os.environ["WORLD_SIZE"])}


def first_line(error):
    """The first line of a torch.distributed error, without gloo's or c10d's source location."""
    text = str(error).strip()
    first = text.splitlines()[0] if text else ""
    return re.sub(r"^\[[^\]]*\]\s*", "", first)[:160]


def lost_peer(error):
    """The one line for a collective that failed: another process stopped (its own output says
    why), or, past --dist_timeout, one never answered: frozen (stopped, swapping) or its machine
    unreachable, named where it can be (of two processes, the other)."""
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
    """How this job was started, as a command to start it again: python, or torchrun
    with its process count."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if world == 1 and "RANK" not in os.environ:
        return "python"
    if local == world:
        return f"torchrun --standalone --nproc_per_node={world}"
    return (f"torchrun --nnodes={world // local} --nproc_per_node={local} "
            f"(and this job's rendezvous flags)")


def stop():
    """End this process's process group, if it started one."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def from_rank0(fn, distributed, master):
    """fn() on rank 0, its result (or its error's message) shared with every rank, so that all act
    on one decision (say, which dataset to train on) and none waits forever when rank 0 fails."""
    result, failed = None, None
    if master:
        try:
            result = fn()
        except UsageError as e:  # the project's one-line errors (DataError, ...) are UsageErrors
            failed = e
    if distributed:
        shared = [result, None if failed is None else str(failed)]
        dist.broadcast_object_list(shared, src=0)
        result, failed = shared[0], failed or (shared[1] is not None and UsageError(shared[1]))
    if failed:
        raise failed
    return result


def resolve_device(name):
    """'auto' -> cuda, then mps, then cpu; an explicit device that is not available
    is a UsageError."""
    available = {"cpu": True, "cuda": torch.cuda.is_available(),
                 "mps": torch.backends.mps.is_available()}
    if name == "auto":
        return "cuda" if available["cuda"] else "mps" if available["mps"] else "cpu"
    kind = name.split(":")[0]
    if kind not in available:
        raise UsageError(f"unknown --device={name}; expected auto, cpu, cuda, cuda:N or mps")
    if not available[kind]:
        raise UsageError(f"--device={name} is not available on this machine; "
                         f"use --device=auto or --device=cpu")
    index = name.partition(":")[2]
    count = torch.cuda.device_count() if kind == "cuda" else 1  # mps and cpu: device 0 alone
    if ":" in name and not (index.isdigit() and int(index) < count):
        has = f" (it has {count} GPU(s), cuda:0 to cuda:{count - 1})" if kind == "cuda" else ""
        hint = " or one of those" if has else ""
        raise UsageError(f"--device={name} is not a device of this machine{has}; "
                         f"use --device={kind}{hint}")
    return name


def resolve_dtype(name, device):
    """--dtype: 'auto' -> bfloat16 autocast on CUDA GPUs that support it, else float32."""
    if name == "auto":
        bf16 = str(device).startswith("cuda") and torch.cuda.is_bf16_supported()
        return "bfloat16" if bf16 else "float32"
    if name not in ("float32", "bfloat16"):
        raise UsageError(f"--dtype={name} is not supported; use auto, float32 or bfloat16")
    return name


def resolve_compile(compile, device_type, master=True):
    """--compile: None means on for CUDA only. Asked for on a CPU, it is done, with a note of what
    it costs there: minutes of compiling before the first step, for a few percent at this size."""
    if compile and device_type == "cpu" and master:
        print("note: --compile on a CPU compiles for minutes before the first step and gains a few "
              "percent on small models; leave it off here to start at once", flush=True)
    return device_type == "cuda" if compile is None else compile


def autocast(device, dtype):
    """bf16 autocast on the device for --dtype=bfloat16; nothing for float32."""
    if dtype == "float32":
        return nullcontext()
    return torch.autocast(str(device).split(":")[0], dtype=torch.bfloat16)


def flops_per_token(cfg):
    """Training FLOPs per token of a mesh.Config, MFU's numerator (nanoGPT / PaLM): 6 x the unrolled
    non-embedding params (a shared core once per step) + 6 D V (head) + 12 L D T (attention)."""
    D, L = cfg.n_embd, cfg.shape.depth
    return 6 * (L * (12 * D * D + 13 * D) + D * cfg.vocab_size) + 12 * L * D * cfg.block_size


def peak_bf16_flops(device, dtype):
    """The chip's dense bf16 peak FLOP/s (PEAK_BF16_FLOPS), or None: not CUDA, not bf16, or not
    listed. MFU is only quoted against the peak of the precision the run used."""
    if not str(device).startswith("cuda") or dtype != "bfloat16":
        return None
    name = torch.cuda.get_device_name(device)
    return 312e12 if name.startswith("NVIDIA A100") else PEAK_BF16_FLOPS.get(name)


class Device:
    """This process's device as a run uses it: its name ("cuda:1", "mps", "cpu") and type, with
    --dtype and --compile resolved for it, its autocast, and the chip's peak for MFU. Making one
    starts the device (and, under torchrun, the process group: start)."""

    def __init__(self, tc, distributed, master):
        self.name = start(tc.device, distributed, tc.dist_timeout)
        self.type = self.name.split(":")[0]  # cuda, mps or cpu
        self.dtype = resolve_dtype(tc.dtype, self.name)
        self.compile = resolve_compile(tc.compile, self.type, master)
        self.autocast = autocast(self.name, self.dtype)  # a context: `with device.autocast:`
        self.peak = peak_bf16_flops(self.name, self.dtype)

    def mfu(self, cfg, tokens, seconds, world):
        """Model FLOPs utilisation: the share of the world processes' peak that training `tokens`
        tokens of a model of mesh.Config cfg in `seconds` used; None where the peak is unknown."""
        if not self.peak:
            return None
        return flops_per_token(cfg) * tokens / seconds / (self.peak * world)


def machine_name(device="cpu"):
    """The GPU's name for a CUDA device, else the CPU's model name (bench.py and
    table1.py print it)."""
    if str(device).startswith("cuda"):
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            models = (line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
            return next(models)
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()
