"""
The device a run runs on: its name, dtype and compile setting resolved for this machine, and the
chip's peak for MFU (what fits in its memory: memory.py).

    device = Device(tc, master)                # under torchrun "cuda:LOCAL_RANK"
    device.name, device.type, device.dtype, device.compile, device.mfu(cfg, tokens, seconds, world)
    device.pace(seconds)                       # ", 4x slower than its first steps: ..." or ""
"""

import os
from contextlib import nullcontext

import torch

from configurator import UsageError

# Dense bf16 peak FLOP/s by the exact name torch.cuda.get_device_name gives (every A100: 312e12):
# exact, because substrings mislead ("L40S" contains "L4"). Not listed: no MFU.
PEAK_BF16_FLOPS = {"NVIDIA H100 80GB HBM3": 989e12, "NVIDIA H100": 989e12,
                   "NVIDIA H100 PCIe": 756e12, "NVIDIA H100 NVL": 835e12, "NVIDIA H200": 989e12,
                   "NVIDIA L40S": 362e12, "NVIDIA L40": 181e12, "NVIDIA L4": 121e12,
                   "NVIDIA A10": 125e12}


class Device:
    """This process's device as a run uses it: its name ("cuda:1", "mps", "cpu") and type, with
    --dtype and --compile resolved for it, and the chip's peak for MFU. Under torchrun each
    process takes GPU LOCAL_RANK."""

    def __init__(self, tc, master):
        self.name = resolve_device(tc.device)
        if "LOCAL_RANK" in os.environ and self.name.startswith("cuda"):
            local, count = int(os.environ["LOCAL_RANK"]), torch.cuda.device_count()
            if local >= count:
                raise UsageError(f"this process is torchrun's local rank {local}, but this "
                                 f"machine has {count} GPU(s): start at most {count} process(es) "
                                 f"a machine (--nproc_per_node={count})")
            self.name = f"cuda:{local}"
        if self.name.startswith("cuda:"):  # RNG states, bf16 checks and kernels use it, not GPU 0
            torch.cuda.set_device(self.name)
        self.type = self.name.split(":")[0]  # cuda, mps or cpu
        self.dtype = resolve_dtype(tc.dtype, self.name)
        self.autocast = (torch.autocast(self.type, dtype=torch.bfloat16)
                         if self.dtype == "bfloat16" else nullcontext())
        if tc.compile and self.type == "cpu" and master:  # asked for on a CPU: done, its cost said
            print("note: --compile on a CPU compiles for minutes before the first step and gains "
                  "a few percent on small models; leave it off here to start at once", flush=True)
        self.compile = self.type == "cuda" if tc.compile is None else tc.compile  # None: CUDA's
        self.peak = peak_bf16_flops(self.name, self.dtype)
        if tc.threads is not None:  # else torch's choice: a thread per core (or OMP_NUM_THREADS)
            torch.set_num_threads(tc.threads)
        self.first = []  # the seconds a step took in this run's first logged windows

    def mfu(self, cfg, tokens, seconds, world):
        """Model FLOPs utilisation of training `tokens` tokens in `seconds` on world processes:
        the share of their peak used; None where the peak is unknown."""
        if not self.peak:
            return None
        return flops_per_token(cfg) * tokens / seconds / (self.peak * world)

    def pace(self, seconds):
        """What a log line adds when a step took 3x or more the fastest of the run's first three
        logged windows: the cores are shared with other work, which threads that spin waiting for
        each other make far worse than it need be."""
        self.first += [seconds] * (len(self.first) < 3)
        slower = seconds / min(self.first)
        return "" if slower < 3 else (
            f", {slower:.0f}x slower than its first steps: other work shares the cores, or "
            f"threads wait on each other (try --threads=1, or fewer runs at once)")


def resolve_device(name):
    """'auto' -> cuda, then mps, then cpu; an explicit device that is not there is a UsageError."""
    available = {"cpu": True, "cuda": torch.cuda.is_available(),
                 "mps": torch.backends.mps.is_available()}
    if name == "auto":
        return "cuda" if available["cuda"] else "mps" if available["mps"] else "cpu"
    kind, colon, index = name.partition(":")
    if kind not in available:
        raise UsageError(f"unknown --device={name}; expected auto, cpu, cuda, cuda:N or mps")
    if not available[kind]:
        raise UsageError(f"--device={name} is not available on this machine; "
                         f"use --device=auto or --device=cpu")
    count = torch.cuda.device_count() if kind == "cuda" else 1  # mps and cpu: device 0 alone
    if colon and not (index.isdigit() and int(index) < count):
        has = f" (it has {count} GPU(s), cuda:0 to cuda:{count - 1})" if kind == "cuda" else ""
        hint = " or one of those" if has else ""
        raise UsageError(f"--device={name} is not a device of this machine{has}; "
                         f"use --device={kind}{hint}")
    return name


def resolve_dtype(name, device):
    """--dtype: 'auto' -> bfloat16 autocast on CUDA GPUs built for it (Ampere on), else float32."""
    if name == "auto":
        bf16 = "cuda" in device and torch.cuda.is_bf16_supported(including_emulation=False)
        return "bfloat16" if bf16 else "float32"
    if name not in ("float32", "bfloat16"):
        raise UsageError(f"--dtype={name} is not supported; use auto, float32 or bfloat16")
    return name


def flops_per_token(cfg):
    """Training FLOPs per token (nanoGPT / PaLM): 6 x the L applied blocks' params (MeSH's
    routers left out: <0.2%) + 6 D V (head) + 12 L D T (attention)."""
    D, L = cfg.n_embd, cfg.shape.depth
    return 6 * (L * (12 * D * D + 13 * D) + D * cfg.vocab_size) + 12 * L * D * cfg.block_size


def peak_bf16_flops(device, dtype):
    """The chip's dense bf16 peak FLOP/s, or None: not CUDA, not bf16, or not listed."""
    if not device.startswith("cuda") or dtype != "bfloat16":
        return None
    name = torch.cuda.get_device_name(device)
    return 312e12 if name.startswith("NVIDIA A100") else PEAK_BF16_FLOPS.get(name)
