"""
Train a nanoMeSH model, from a 2-core laptop CPU to multi-node torchrun DDP.

    python train.py                                   # classroom MeSH model, Tiny Shakespeare chars, ~3 min on CPU
    python train.py config/classroom_base.json        # a JSON file of settings, then --key=value overrides
    python train.py --init_from=resume --out_dir=out  # continue exactly where a run stopped
    torchrun --standalone --nproc_per_node=8 train.py config/pythia-160m_mesh.json

Every setting is a field of TrainConfig below (`python train.py --help`). The batches
of optimizer step `it` are random windows drawn from a generator seeded by (seed, it,
micro-batch), or with --data_order=sequential the next windows of the data in order (see
get_batch), so they depend only on the step: never on the number of processes, and a
resumed run sees exactly the data it would have seen. --dataset is a folder made by
data/prepare.py or the path of a Megatron / GPT-NeoX indexed dataset (PATH/document), such
as Pythia's pre-tokenized Pile (data/indexed.py). Checkpoints (OUT_DIR/ckpt.pt) are
written atomically, never of a model whose losses blew up or whose weights are not finite;
Ctrl-C, SIGTERM or a killed torchrun finishes the current step, saves and exits. A run locks
its OUT_DIR while it lives, so a second run there is refused.
"""

import dataclasses
import fcntl
import json
import math
import os
import shlex
import signal
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from checkpoint import CheckpointError, check_resumable, load_checkpoint, load_hf, save_checkpoint
from configurator import UsageError, parse_flags, process_alive, report, resolve_device, resolve_dtype
from data.prepare import (PrepareError, Tokenizer, checkpoint_dataset, dataset_record, ensure_dataset, load_split,
                          random_windows, sequential_windows)
from mesh import PRESETS, Config, RecursiveGPT

import fsdp as sharding  # noqa: E402 (FSDP2 and sharded checkpoints; imports checkpoint and mesh)


@dataclass
class TrainConfig:
    """Settings of one training run; model fields left at None take the preset's value."""
    # model
    model: str = "classroom"            # a preset of mesh.PRESETS
    layout: str | None = None           # e.g. 2+4R2+2, 4+8R2+4, 12
    scheme: str | None = None           # base, residual, anchor, anchor_emb, mesh
    n_slots: int | None = None          # mesh buffer slots; None means K+3
    cycle: str | None = None            # mesh transitional cycle: routed (default) or direct
    router_init: str | None = None      # mesh routers at init: uniform (default) or base
    slot0: str | None = None            # mesh slot 0: the scaled (default) or unscaled embedding
    n_embd: int | None = None
    n_head: int | None = None
    block_size: int | None = None
    dropout: float | None = None
    # data and output
    dataset: str = "shakespeare_char"   # a folder of DATA_ROOT made by data/prepare.py, or PATH/document (indexed)
    data_root: str = "data"
    data_order: str = "random"          # random windows, or sequential: the data once, in order (the paper's)
    epochs: int = 1                     # sequential: passes over the data allowed before the run stops
    out_dir: str = "out"
    overwrite: bool = False             # allow a scratch run to replace an existing OUT_DIR/ckpt.pt
    init_from: str = "scratch"          # scratch, resume, or hf:PATH (a Hugging Face GPT-NeoX folder)
    # optimisation (the paper's Appendix B: AdamW (0.9, 0.95), wd 0.01 on matrices, clip 1.0,
    # 1% linear warmup, cosine to 10% of peak)
    batch_size: int = 16                # micro-batch per process
    grad_accum: int = 1                 # micro-batches per optimizer step, summed over all processes
    max_iters: int = 1000
    lr: float | None = None             # peak; None means the preset's (Pythia) value
    min_lr: float | None = None         # None means 10% of lr
    warmup_iters: int | None = None     # None means 1% of lr_decay_iters
    lr_decay_iters: int | None = None   # length of the cosine; None means max_iters
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0              # 0 disables
    # evaluation, logging, sampling
    eval_interval: int = 250            # also the checkpoint interval
    eval_iters: int = 20
    log_interval: int = 50
    sample_tokens: int = 300            # printed from the trained model at the end; 0 to skip
    # system
    device: str = "auto"                # auto: cuda, then mps, then cpu
    dtype: str = "auto"                 # auto: bfloat16 autocast on GPUs that support it, else float32
    compile: bool | None = None         # None: on for CUDA only
    grad_checkpoint: bool = False       # recompute activations in backward to save memory
    fsdp: bool = False                  # shard weights, gradients and AdamW state over the processes (FSDP2)
    seed: int = 1337
    # memory plan (plan.py): print per-GPU memory under DDP and FSDP, then exit without training
    plan: bool = False
    plan_gpus: int | None = None        # processes to plan for; None: WORLD_SIZE under torchrun, else 8
    gpu_memory: float = 80.0            # GiB per GPU
    debug: bool = False                 # show Python tracebacks for errors

    def __post_init__(self):
        for name in ("batch_size", "grad_accum", "eval_interval", "eval_iters", "log_interval"):
            if getattr(self, name) < 1:
                raise UsageError(f"--{name}={getattr(self, name)} must be at least 1")
        if self.plan_gpus is not None and self.plan_gpus < 1 or not self.gpu_memory > 0:
            raise UsageError(f"--plan_gpus={self.plan_gpus} must be at least 1 and --gpu_memory={self.gpu_memory} "
                             f"(GiB) more than 0")
        for name in ("max_iters", "sample_tokens"):
            if getattr(self, name) < 0:
                raise UsageError(f"--{name}={getattr(self, name)} must be 0 or more")
        if self.data_order not in ("random", "sequential"):
            raise UsageError(f"--data_order={self.data_order} is not random or sequential")
        if self.epochs < 1:
            raise UsageError(f"--epochs={self.epochs} must be at least 1")
        # Every number has a range, checked before anything is written: a negative min_lr or grad_clip, an
        # infinite lr or a NaN weight decay would otherwise train, silently wrong.
        for name, ok, allowed in RANGES:
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and ok(value)):
                raise UsageError(f"--{name}={value} must be {allowed}")
        if self.lr is not None and self.min_lr is not None and self.min_lr > self.lr:
            raise UsageError(f"--min_lr={self.min_lr} is above --lr={self.lr}; the cosine decays from lr to min_lr")


RANGES = [  # (setting, test, the range in words) for TrainConfig's numbers that other checks leave open
    ("lr", lambda v: v > 0, "a finite number above 0"),
    ("min_lr", lambda v: v >= 0, "a finite number, 0 or more"),
    ("warmup_iters", lambda v: v >= 0, "0 or more"),
    ("lr_decay_iters", lambda v: v >= 1, "at least 1"),
    ("weight_decay", lambda v: v >= 0, "a finite number, 0 or more"),
    ("beta1", lambda v: 0 <= v < 1, "in [0, 1)"),
    ("beta2", lambda v: 0 <= v < 1, "in [0, 1)"),
    ("grad_clip", lambda v: v >= 0, "a finite number, 0 or more (0 disables clipping)"),
    ("dropout", lambda v: 0 <= v < 1, "in [0, 1)"),
    ("seed", lambda v: v >= 0, "0 or more (numpy's generators take no negative seed)"),
]


MODEL_KEYS = ("layout", "scheme", "n_slots", "cycle", "router_init", "slot0", "n_embd", "n_head", "block_size",
              "dropout")
# Dense bf16 peak FLOP/s by the exact name torch.cuda.get_device_name gives (every A100 is 312e12): exact,
# because substrings mislead ("L40S" contains "L4", "H100 PCIe" is not an SXM H100). Not listed: no MFU.
PEAK_BF16_FLOPS = {"NVIDIA H100 80GB HBM3": 989e12, "NVIDIA H100": 989e12, "NVIDIA H100 PCIe": 756e12,
                   "NVIDIA H100 NVL": 835e12, "NVIDIA H200": 989e12, "NVIDIA L40S": 362e12, "NVIDIA L40": 181e12,
                   "NVIDIA L4": 121e12, "NVIDIA A10": 125e12}


def peak_bf16_flops(device, dtype):
    """The chip's dense bf16 peak FLOP/s (PEAK_BF16_FLOPS), or None: not CUDA, not bf16, or not listed.
    MFU is only quoted against the peak of the precision the run used."""
    if not str(device).startswith("cuda") or dtype != "bfloat16":
        return None
    name = torch.cuda.get_device_name(device)
    return 312e12 if name.startswith("NVIDIA A100") else PEAK_BF16_FLOPS.get(name)


def model_config(tc, vocab_size):
    overrides = {k: getattr(tc, k) for k in MODEL_KEYS}
    return Config.from_preset(tc.model, vocab_size=vocab_size, **overrides)


def config_conflicts(given, ckpt_cfg, ckpt_settings):
    """Settings given on the command line that contradict a checkpoint: its preset or its model config."""
    saved = {"model": ckpt_settings.get("model"), **ckpt_cfg.to_dict()}
    return [f"{k}: checkpoint {saved[k]!r} vs given {given[k]!r}" for k in ("model",) + MODEL_KEYS
            if k in given and saved[k] != given[k]]


# -----------------------------------------------------------------------------
# Data order. --data_order=random: windows at random starts, drawn from a generator seeded by (seed, key).
# --data_order=sequential (training batches only, key (0, it, m)): the train tokens cut into consecutive
# windows of block_size + 1, read once in order: micro-batch m of step it is windows
# (it * grad_accum + m) * batch_size ... + batch_size - 1, so step it's global batch is windows
# it * G ... it * G + G - 1 (G = batch_size x grad_accum). With Pythia's data (sequences of 2049 tokens),
# --block_size=2048 and G = 1024, step it trains on Pythia's sequences it*1024 ... it*1024 + 1023. Either
# way a batch depends on (it, m) only: not on the number of processes, and a resume continues exactly.

def get_batch(data, tc, block_size, key, device):
    """A batch of `tc.batch_size` windows of block_size + 1 tokens (inputs and targets); `key` (a tuple of ints:
    (0, step, micro-batch) for training, (split code, 0, k) for evaluation) alone decides which."""
    if tc.data_order == "sequential" and key[0] == 0:
        _, it, m = key
        rows = sequential_windows(data, block_size + 1, (it * tc.grad_accum + m) * tc.batch_size, tc.batch_size)
    else:
        rows = random_windows(data, block_size + 1, tc.batch_size, [tc.seed, *key])
    xy = torch.from_numpy(rows)  # (B, T+1)
    xy = xy.to(device, non_blocking=True)
    return xy[:, :-1], xy[:, 1:]


def check_import_tokenizer(path, tokenizer, dataset, master):
    """An imported model knows the ids of its own tokenizer (PATH/tokenizer.json): a dataset made with another
    one is refused. Without a tokenizer.json in PATH only a GPT-2 dataset gets a note (Pythia's is GPT-NeoX's)."""
    if not os.path.isfile(os.path.join(path, "tokenizer.json")):
        if master and tokenizer.kind == "gpt2":
            print("note: Pythia checkpoints use the GPT-NeoX tokenizer, not GPT-2's; the ids of a GPT-2 "
                  "dataset mean other tokens to them")
        return
    if Tokenizer("bpe", path=path).identity != tokenizer.identity:
        made = "another tokenizer.json" if tokenizer.kind == "bpe" else f"the {tokenizer.kind} tokenizer"
        raise UsageError(f"dataset {dataset!r} was made with {made}, not the imported model's own "
                         f"({os.path.join(path, 'tokenizer.json')}); prepare it with that one: python data/prepare.py "
                         f"--dataset NAME --input FILE --tokenizer {path}")


def sequential_steps(n_tokens, tc, block_size):
    """How many optimizer steps --data_order=sequential can take in tc.epochs passes over n_tokens train tokens."""
    return tc.epochs * (n_tokens // (block_size + 1)) // (tc.batch_size * tc.grad_accum)


@torch.no_grad()
def batch_losses(model, batches, autocast=nullcontext()):
    """The mean loss of each (inputs, targets) batch, in evaluation mode (no dropout): the evaluation of
    train.py (every eval_interval) and of table1.py (the final checkpoints)."""
    training = model.training
    model.eval()
    losses = []
    for x, y in batches:
        with autocast:
            losses.append(model(x, y)[1].float().item())
    model.train(training)
    return losses


def get_lr(it, tc):
    warmup, decay = tc.warmup_iters, tc.lr_decay_iters
    if it < warmup:
        return tc.lr * (it + 1) / (warmup + 1)
    if it >= decay:
        return tc.min_lr
    ratio = (it - warmup) / max(1, decay - warmup)
    return tc.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (tc.lr - tc.min_lr)


def flops_per_token(cfg):
    """Training FLOPs per token: 6 x unrolled non-embedding params (a shared core counts once per
    application) + 6 x D x V for the head + attention 12 x layers x D x T (nanoGPT / PaLM)."""
    D, L = cfg.n_embd, cfg.shape.depth
    return 6 * (L * (12 * D * D + 13 * D) + D * cfg.vocab_size) + 12 * L * D * cfg.block_size


# -----------------------------------------------------------------------------
# Keeping a run's files safe: who owns OUT_DIR, which process this is, what may be saved

def process_group():
    """(ddp, rank, world size) from torchrun's RANK and WORLD_SIZE; RANK unset (or -1): one process."""
    rank, size = os.environ.get("RANK", "-1"), os.environ.get("WORLD_SIZE")
    if rank == "-1":
        return False, 0, 1
    try:
        rank, size = int(rank), int(size)
        if not 0 <= rank < size:
            raise ValueError
    except (TypeError, ValueError):
        raise UsageError(f"RANK={rank} needs WORLD_SIZE, with 0 <= RANK < WORLD_SIZE (got WORLD_SIZE={size}); "
                         f"launch with torchrun, which sets both, or unset RANK") from None
    return True, rank, size


_owned = {}  # real path of an OUT_DIR -> the descriptor that holds its lock while this process lives


def own_out_dir(out_dir):
    """Lock OUT_DIR for this run (an exclusive flock on the folder itself: no file is created, and the
    kernel drops the lock when the process ends, kill -9 included), or say that another run holds it."""
    key = os.path.realpath(out_dir)
    if key in _owned:
        return
    fd = os.open(out_dir, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise UsageError(f"another run is using --out_dir={out_dir} (it holds the folder's lock); wait for it "
                         f"to end, or choose another --out_dir") from None
    except OSError as e:  # a file system without flock on folders (some NFS setups): train, unprotected
        print(f"note: cannot lock --out_dir={out_dir} ({e.strerror}); make sure no other run uses it", flush=True)
    _owned[key] = fd


def release_out_dirs():
    for fd in _owned.values():
        os.close(fd)
    _owned.clear()


def remove_stale_temporaries(out_dir):
    """Remove the temporary files of checkpoint writes (.ckpt-PID-*.tmp) and logs (.log-PID.tmp) whose
    process is dead (or is this one)."""
    for name in os.listdir(out_dir):
        pid = name.split("-")[1].split(".")[0] if name.startswith((".ckpt-", ".log-")) and name.endswith(".tmp") else ""
        if pid.isdigit() and (int(pid) == os.getpid() or not process_alive(int(pid))):
            os.remove(os.path.join(out_dir, name))


DIVERGED = 10  # an evaluated loss above DIVERGED x ln(vocab) (ten times a uniform guess's) means training blew up


def unsaveable(model, optimizer, losses):
    """Why this model must not be saved, or None: an evaluated loss that is not finite or that has blown up
    (far worse than a uniform guess), or a weight or optimizer state that is not finite."""
    limit = DIVERGED * math.log(model.config.vocab_size)
    for split, loss in losses.items():
        if not math.isfinite(loss):
            return f"{split} loss is {loss}"
        if loss > limit:
            return f"{split} loss is {loss:.4g} (above {limit:.4g}, {DIVERGED} x ln(vocab_size))"
    local = lambda v: v.to_local() if hasattr(v, "to_local") else v  # noqa: E731 (under FSDP, this rank's shard)
    tensors = {f"weight {k}": local(v) for k, v in model.state_dict().items() if v.is_floating_point()}
    names = {p: name for name, p in model.named_parameters()}
    tensors.update({f"optimizer {k} of {names.get(p, 'a parameter')}": local(v) for p, state in optimizer.state.items()
                    for k, v in state.items() if torch.is_tensor(v) and v.is_floating_point()})
    finite = torch.stack([torch.isfinite(v).all() for v in tensors.values()]).tolist()
    return next((f"{name} is not finite" for name, ok in zip(tensors, finite) if not ok), None)


class Trainer:
    def __init__(self, tc, given, resume=None):
        self.tc = tc
        # Resolved below for this machine and run, but saved as given: a resume on another machine picks its
        # own dtype and compile, and a new --lr there brings its own 10% min_lr.
        self.as_given = {k: getattr(tc, k) for k in ("dtype", "compile", "lr", "min_lr")}
        self.ddp, self.rank, self.world = process_group()
        self.launcher = os.getppid()  # torchrun, under DDP: when it is gone, the workers stop (see step)
        self.master = self.rank == 0
        if tc.fsdp and not self.ddp:
            raise UsageError("--fsdp=true shards over processes started by torchrun, e.g. torchrun --standalone "
                             "--nproc_per_node=8 train.py ... --fsdp=true (one process: --nproc_per_node=1)")
        if tc.grad_accum % self.world:
            raise UsageError(f"--grad_accum={tc.grad_accum} does not divide by the world size {self.world}; "
                             f"use a multiple of {self.world}")
        device = resolve_device(tc.device)
        if self.ddp and device.startswith("cuda"):
            device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
        if device.startswith("cuda:"):  # so that RNG states, bf16 checks and kernels all use this GPU, not GPU 0
            torch.cuda.set_device(device)
        if self.ddp:
            dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
        self.device, self.device_type = device, device.split(":")[0]
        tc.dtype = resolve_dtype(tc.dtype, self.device_type)
        self.autocast = nullcontext() if tc.dtype == "float32" else \
            torch.autocast(self.device_type, dtype=torch.bfloat16)
        tc.compile = self.device_type == "cuda" if tc.compile is None else tc.compile
        torch.manual_seed(tc.seed + self.rank)
        if tc.init_from == "scratch":  # catch a bad model config before touching data/ or out_dir
            model_config(tc, vocab_size=1)

        # ---- data: prepared on first use (the default dataset falls back to 'pydoc' offline); a resumed
        # run only looks for its dataset, as sample.py does (a relative data_root also from the project folder)
        data_dir = failed = None
        if self.master:
            try:
                if tc.init_from != "resume":
                    tc.dataset = ensure_dataset(tc.dataset, tc.data_root)
                data_dir = checkpoint_dataset(dataclasses.asdict(tc), resume[1].get("data") if resume else None)
            except PrepareError as e:
                failed = str(e)
        if self.ddp:  # every rank uses the dataset rank 0 settled on, or stops with rank 0's error
            shared = [tc.dataset, data_dir, failed]
            dist.broadcast_object_list(shared, src=0)
            tc.dataset, data_dir, failed = shared
        if failed:
            raise PrepareError(failed)
        self.tokenizer = Tokenizer.load(data_dir)
        self.train_data, self.val_data = load_split(data_dir, "train"), load_split(data_dir, "val")
        self.data_record = dataset_record(data_dir)  # saved in checkpoints: what they were trained on
        vocab = self.tokenizer.vocab_size
        vocab = vocab if self.tokenizer.kind == "char" else -(-vocab // 64) * 64  # pad BPE to a multiple of 64

        # ---- model and optimizer: scratch, resume, or a Hugging Face GPT-NeoX import
        ckpt_path = os.path.join(tc.out_dir, "ckpt.pt")
        ckpt = None
        if tc.init_from == "resume":
            model, ckpt = resume  # its config was checked against the flags given in main()
        elif tc.init_from == "scratch":
            if self.master and os.path.isdir(tc.out_dir):  # a live run there is the first thing to report
                own_out_dir(tc.out_dir)
            self.check_scratch_out_dir()
            model = RecursiveGPT(model_config(tc, vocab))
        elif tc.init_from.startswith("hf:"):  # a vanilla model; its shape comes from the import
            shaped = [k for k in MODEL_KEYS if k in given and k not in ("block_size", "dropout")]
            if shaped:
                raise UsageError(f"--init_from={tc.init_from} takes the model's shape from the import; "
                                 f"drop --{', --'.join(shaped)} (only --block_size and --dropout apply)")
            model = load_hf(tc.init_from[3:])
            if tc.block_size or tc.dropout is not None:  # a shorter context or dropout for fine-tuning
                cfg = Config(**{**model.config.to_dict(), "block_size": tc.block_size or model.config.block_size,
                                "dropout": model.config.dropout if tc.dropout is None else tc.dropout})
                state, model = model.state_dict(), RecursiveGPT(cfg)
                model.load_state_dict(state)
            check_import_tokenizer(tc.init_from[3:], self.tokenizer, tc.dataset, self.master)
        else:
            raise UsageError(f"--init_from={tc.init_from} is not one of scratch, resume, hf:PATH")
        cfg = model.config
        if cfg.vocab_size < self.tokenizer.vocab_size:
            raise UsageError(f"dataset {tc.dataset!r} has {self.tokenizer.vocab_size} tokens but the model's "
                             f"vocabulary is {cfg.vocab_size}; use a dataset made with the model's tokenizer")
        if len(self.train_data) < cfg.block_size + 1:
            raise UsageError(f"block_size {cfg.block_size} is longer than the training split of {tc.dataset!r} "
                             f"({len(self.train_data)} tokens in {self.train_data.filename}); use a smaller "
                             f"--block_size or more text")
        if len(self.val_data) < cfg.block_size + 1:
            raise UsageError(f"block_size {cfg.block_size} is longer than the validation split of "
                             f"{tc.dataset!r} ({len(self.val_data)} tokens); use a smaller --block_size or more text")
        tc.lr = PRESETS[tc.model]["lr"] if tc.lr is None else tc.lr
        tc.min_lr = 0.1 * tc.lr if tc.min_lr is None else tc.min_lr
        tc.lr_decay_iters = tc.max_iters if tc.lr_decay_iters is None else tc.lr_decay_iters
        tc.warmup_iters = max(1, tc.lr_decay_iters // 100) if tc.warmup_iters is None else tc.warmup_iters

        model.grad_checkpoint = tc.grad_checkpoint
        if tc.fsdp:
            model = self.shard(model, scratch=ckpt is None)
        self.raw_model = model.to(self.device)  # the uncompiled, unwrapped module: saved and sampled
        self.optimizer = model.configure_optimizer(tc.weight_decay, tc.lr, (tc.beta1, tc.beta2), self.device_type)
        self.iter_num, self.best_val = 0, float("inf")
        self.saved_iter = None  # the iteration of the checkpoint in OUT_DIR that this run stands behind
        if ckpt is not None:
            if "folder" not in ckpt:  # a whole checkpoint: wrong optimizer shapes would crash inside fused AdamW
                check_resumable(ckpt, ckpt_path, self.optimizer)
            self.load_optimizer(ckpt)
            self.saved_iter = ckpt["iter_num"]
            self.iter_num, self.best_val = ckpt["iter_num"], ckpt["best_val_loss"]
            if self.rank == 0:  # the saved RNG state is rank 0's; the others get their own (dropout masks differ)
                torch.set_rng_state(ckpt["rng"]["torch"].cpu())
                if "cuda" in ckpt["rng"] and self.device_type == "cuda":
                    torch.cuda.set_rng_state(ckpt["rng"]["cuda"].cpu())
            else:
                torch.manual_seed(tc.seed + self.rank + self.world * self.iter_num)
        self.model = torch.compile(model) if tc.compile else model
        if self.ddp and not tc.fsdp:
            # no buffers to broadcast: the rotary tables are the same on every rank
            self.model = DDP(self.model, device_ids=[int(self.device.split(":")[1])] if self.device_type == "cuda" else None,
                             broadcast_buffers=False)
        self.flops_per_token = flops_per_token(cfg)

        if self.master:  # everything is checked: now the run takes OUT_DIR
            os.makedirs(tc.out_dir, exist_ok=True)
            own_out_dir(tc.out_dir)
            if tc.init_from != "resume":
                self.check_scratch_out_dir()  # again: another run may have finished there in the meantime
            remove_stale_temporaries(tc.out_dir)  # of checkpoint writes that were killed
            sharding.remove_unfinished(tc.out_dir)  # sharded ones (this run holds OUT_DIR: no live writer)
            log = os.path.join(tc.out_dir, "log.jsonl")
            # --overwrite replaces the old run when the new one saves its first checkpoint, not before: until
            # then the new log is a temporary file, and the old log.jsonl still matches the old ckpt.pt
            self.pending_log = os.path.join(tc.out_dir, f".log-{os.getpid()}.tmp") \
                if not ckpt and os.path.exists(log) else None
            self.log_file = open(log, "a") if ckpt else open(self.pending_log or log, "w")
            print(f"model {tc.model} layout {cfg.layout} scheme {cfg.scheme}: "
                  f"{model.num_params():,} non-embedding params, compute depth {cfg.shape.depth}; "
                  f"dataset {tc.dataset} ({len(self.train_data):,} train tokens, {tc.data_order} order), "
                  f"device {self.device} {tc.dtype}, "
                  f"{self.world} process(es){' (FSDP)' if tc.fsdp else ''}, {tc.batch_size * tc.grad_accum * cfg.block_size:,} tokens/step")

    def shard(self, model, scratch):
        """FSDP2 over all processes (fsdp.shard). A scratch model takes rank 0's initial weights first, as DDP
        does, so every shard comes from the same model."""
        model = model.to(self.device)  # NCCL broadcasts GPU tensors; fully_shard keeps the shards where they are
        if scratch:
            for p in model.parameters():
                dist.broadcast(p.data, src=0)
        # bf16 gathering on GPUs only: CPU autocast runs LayerNorm in the input's dtype, so bf16 weights cannot meet
        # a float32 residual stream there (CUDA autocast computes LayerNorm in float32)
        return sharding.shard(model, self.device_type, bf16=self.tc.dtype == "bfloat16" and self.device_type == "cuda")

    def load_optimizer(self, ckpt):
        """The checkpoint's AdamW state: a sharded checkpoint's (with the weights, each rank its own shards), or
        a whole one, cut to this rank's shards under FSDP."""
        if "folder" in ckpt:
            sharding.load_sharded(self.tc.out_dir, ckpt, self.raw_model, self.optimizer)
        elif self.tc.fsdp:
            self.optimizer.load_state_dict(sharding.shard_optimizer_state(ckpt["optimizer"], self.optimizer))
        else:
            self.optimizer.load_state_dict(ckpt["optimizer"])

    def check_scratch_out_dir(self):
        path = os.path.join(self.tc.out_dir, "ckpt.pt")
        if os.path.exists(path) and not self.tc.overwrite:
            raise UsageError(f"{path} exists; continue it with --init_from=resume, or start over "
                             f"with --overwrite=true, or choose another --out_dir")

    def last_good(self):
        """Where the run stands after a failure, in words."""
        path = os.path.join(self.tc.out_dir, sharding.POINTER if self.tc.fsdp else "ckpt.pt")
        if self.saved_iter is None:
            return "this run saved no checkpoint (start again with a lower --lr)"
        return (f"{path} (iter {self.saved_iter}) is the last good checkpoint (resume with --init_from=resume "
                f"and a lower --lr)")

    def out_of_data(self):
        """--data_order=sequential: True, after saying so, when step iter_num would read past --epochs passes."""
        tc, T = self.tc, self.raw_model.config.block_size
        steps = sequential_steps(len(self.train_data), tc, T) if tc.data_order == "sequential" else math.inf
        if self.iter_num < steps:
            return False
        if self.master:
            windows, seen = len(self.train_data) // (T + 1), self.iter_num * tc.batch_size * tc.grad_accum
            print(f"the data ran out at iter {self.iter_num} (--max_iters={tc.max_iters}): {seen / windows:.3f} "
                  f"epoch(s) of {windows:,} windows of {T + 1} tokens read in order, {seen * (T + 1):,} tokens seen; "
                  f"allow more passes with --init_from=resume --epochs={tc.epochs + 1}", flush=True)
        return True

    def log(self, record, text):
        if self.master:
            print(text, flush=True)
            self.log_file.write(json.dumps(record) + "\n")
            self.log_file.flush()

    def evaluate(self):
        """Mean loss over eval_iters fixed batches per split, shared out over the processes."""
        out = {}
        for code, split, data in ((1, "train", self.train_data), (2, "val", self.val_data)):
            # under FSDP every rank must run as many forwards as the others (each gathers weights with all):
            # the last round is padded with batches whose losses are dropped
            n = -(-self.tc.eval_iters // self.world) * self.world if self.tc.fsdp else self.tc.eval_iters
            keys = range(self.rank, n, self.world)
            batches = (get_batch(data, self.tc, self.raw_model.config.block_size, (code, 0, k % self.tc.eval_iters),
                                 self.device) for k in keys)
            losses = [loss for k, loss in zip(keys, batch_losses(self.raw_model, batches, self.autocast))
                      if k < self.tc.eval_iters]
            if self.tc.fsdp:  # the root keeps its weights gathered after a forward without backward: free them
                self.raw_model.reshard()
            total = torch.tensor([sum(losses), len(losses)], device=self.device, dtype=torch.float64)
            if self.ddp:
                dist.all_reduce(total)
            out[split] = (total[0] / total[1]).item()
        return out

    def checkpoint(self):
        """OUT_DIR/ckpt.pt (rank 0), or under FSDP a sharded checkpoint (every rank its shards, fsdp.save_sharded)."""
        rng = {"torch": torch.get_rng_state()}  # the data needs no state: a step's batches depend only on the step
        if self.device_type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state()
        plain = {"model_config": self.raw_model.config.to_dict(),
                 "train_config": {**dataclasses.asdict(self.tc), **self.as_given},
                 "iter_num": self.iter_num, "best_val_loss": self.best_val}
        if self.tc.fsdp:
            sharding.save_sharded(self.tc.out_dir, self.raw_model, self.optimizer,
                                  {**plain, "rng": sharding.rng_to_json(rng)}, self.master)
        elif self.master:
            save_checkpoint({**plain, "model": self.raw_model.state_dict(), "optimizer": self.optimizer.state_dict(),
                             "rng": rng, "data": self.data_record}, os.path.join(self.tc.out_dir, "ckpt.pt"))
        self.saved_iter = self.iter_num
        if self.master and self.pending_log:  # this run's first checkpoint: its log takes the old one's place
            os.replace(self.pending_log, os.path.join(self.tc.out_dir, "log.jsonl"))
            self.pending_log = None

    def eval_and_save(self):
        losses = self.evaluate()
        self.best_val = min(self.best_val, losses["val"])
        self.log({"iter": self.iter_num, "train_loss": losses["train"], "val_loss": losses["val"]},
                 f"iter {self.iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        # every rank sees the same losses and (DDP) the same weights, so all stop here together
        reason = unsaveable(self.raw_model, self.optimizer, losses)
        if self.tc.fsdp:  # each rank checked its own shards: all stop if any found one that is not finite
            flag = torch.tensor(float(reason is not None), device=self.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            reason = reason or ("a weight or optimizer state on another rank is not finite" if flag.item() else None)
        if reason:
            raise FloatingPointError(f"{reason} at iter {self.iter_num}; stopped without saving, so "
                                     f"{self.last_good()}")
        self.checkpoint()

    def step(self):
        """One optimizer step over the global batch; returns [mean loss, stop flag] agreed by all ranks."""
        tc, it = self.tc, self.iter_num
        if self.ddp and os.getppid() != self.launcher and not self.stop:  # torchrun was killed: we were re-parented
            self.stop = True
            print(f"rank {self.rank}: the torchrun launcher (pid {self.launcher}) is gone: finishing this step, "
                  f"then saving a checkpoint", flush=True)
        lr = get_lr(it, tc)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        local = tc.grad_accum // self.world
        loss_sum = torch.zeros((), device=self.device)
        for j, m in enumerate(range(self.rank, tc.grad_accum, self.world)):  # this rank's micro-batches
            x, y = get_batch(self.train_data, tc, self.raw_model.config.block_size, (0, it, m), self.device)
            # DDP all-reduces gradients only on the last micro-batch; FSDP reduce-scatters every one, so that
            # no rank holds a whole gradient
            sync = nullcontext() if not self.ddp or self.tc.fsdp or j == local - 1 else self.model.no_sync()
            with sync:
                with self.autocast:
                    _, loss = self.model(x, y)
                # DDP averages over ranks, so the update uses the mean over the whole global batch
                (loss / local).backward()
            loss_sum += loss.detach().float()
        if tc.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.raw_model.parameters(), tc.grad_clip)
        state = torch.stack([loss_sum / local, torch.tensor(float(self.stop), device=self.device)])
        if self.ddp:
            dist.all_reduce(state, op=dist.ReduceOp.AVG)
        if not math.isfinite(state[0].item()):
            self.optimizer.zero_grad(set_to_none=True)
            raise FloatingPointError(f"loss is {state[0].item()} at iter {it}; stopped without saving, so "
                                     f"{self.last_good()}")
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return state[0].item(), lr, state[1].item() > 0

    def train(self):
        self.stop = False

        def on_signal(signum, frame):
            if self.stop:  # a second Ctrl-C stops at once
                raise KeyboardInterrupt
            self.stop = True
            if self.master:
                print(f"\n{signal.Signals(signum).name}: finishing this step, then saving a checkpoint", flush=True)

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            return self.loop()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            if self.master:
                self.log_file.close()
                if self.pending_log:  # saved nothing: the old run stays as it was
                    os.remove(self.pending_log)

    def loop(self):
        tc = self.tc
        tokens_per_step = tc.batch_size * tc.grad_accum * self.raw_model.config.block_size
        peak = peak_bf16_flops(self.device, tc.dtype)
        resumed_at = self.iter_num
        t0, timed_from = time.time(), self.iter_num
        while self.iter_num < tc.max_iters and not self.out_of_data():
            if self.iter_num % tc.eval_interval == 0 and (self.iter_num != resumed_at or self.iter_num == 0):
                self.eval_and_save()
                t0, timed_from = time.time(), self.iter_num  # keep evaluation out of ms/iter
            loss, lr, stop = self.step()
            self.iter_num += 1
            if self.iter_num % tc.log_interval == 0 or self.iter_num == tc.max_iters or stop:
                dt = (time.time() - t0) / (self.iter_num - timed_from)
                t0, timed_from = time.time(), self.iter_num
                eta = dt * (tc.max_iters - self.iter_num)
                # tokens_per_step is the global batch, so the peak is all processes' together
                mfu = f", mfu {100 * self.flops_per_token * tokens_per_step / dt / (peak * self.world):.1f}%" if peak else ""
                self.log({"iter": self.iter_num, "loss": loss, "lr": lr, "ms": 1000 * dt},
                         f"iter {self.iter_num}: loss {loss:.4f}, lr {lr:.2e}, {1000 * dt:.1f} ms/iter, "
                         f"{tokens_per_step / dt:,.0f} tok/s, eta {eta / 60:.1f} min{mfu}")
            if stop:
                self.checkpoint()
                if self.master:
                    print(f"stopped at iter {self.iter_num}; checkpoint saved. Continue with "
                          f"python train.py --init_from=resume {shlex.quote('--out_dir=' + tc.out_dir)}")
                return False
        self.eval_and_save()
        return True


def load_resume(out_dir, given):
    """(model, checkpoint dict) of the run to continue: the newer of OUT_DIR/ckpt.pt and its sharded checkpoint
    (fsdp.newest), in ckpt.pt's layout. A sharded one resumed under FSDP is read later, each rank its own
    shards: here only its plain data comes, with a model of its config."""
    source = sharding.newest(out_dir)
    if source is None:
        raise UsageError(f"--init_from=resume but there is no checkpoint in {out_dir}; "
                         f"start with --init_from=scratch or point --out_dir at a run")
    if source == "full":
        model, ckpt = load_checkpoint(out_dir)
        check_resumable(ckpt, os.path.join(out_dir, "ckpt.pt"))
        return model, ckpt
    meta = sharding.read_pointer(out_dir)
    if given.get("fsdp"):
        return RecursiveGPT(Config.from_dict(meta["model_config"])), {**meta, "rng": sharding.rng_from_json(meta["rng"])}
    return sharding.load_whole(out_dir, meta)


def main(argv):
    given = {}
    try:
        given = parse_flags(TrainConfig, argv, "train.py")
        settings, resume = dataclasses.asdict(TrainConfig()), None
        if given.get("init_from") == "resume":  # continue with the run's own settings, then the flags given
            out_dir = given.get("out_dir", settings["out_dir"])
            if process_group()[1] == 0 and os.path.isdir(out_dir):  # before reading: a live run may be saving
                own_out_dir(out_dir)
            resume = load_resume(out_dir, given)
            # not --fsdp: how this launch spreads the model is its own choice, whatever wrote the checkpoint
            settings.update({k: v for k, v in resume[1]["train_config"].items() if k in settings and k != "fsdp"})
        tc = TrainConfig(**{**settings, **given})
        if tc.plan:  # nothing is trained, loaded or allocated
            import plan
            print(plan.plan(tc, resume[0].config if resume else model_config(tc, vocab_size=None)))
            return 0
        conflicts = config_conflicts(given, resume[0].config, resume[1]["train_config"]) if resume else []
        if conflicts:
            raise UsageError("the checkpoint's model differs from the flags given: " + "; ".join(conflicts))
        if resume and resume[1]["iter_num"] >= tc.max_iters:  # a finished run: leave it as it is
            print(f"{os.path.join(tc.out_dir, 'ckpt.pt')} is at iter {resume[1]['iter_num']}, already "
                  f"--max_iters={tc.max_iters}: nothing to do (raise --max_iters to train further, and "
                  f"--lr_decay_iters to stretch the cosine: past it the learning rate stays at min_lr)")
            return 0
        trainer = Trainer(tc, given, resume)
        resume = None  # the loaded checkpoint (a copy of model and optimizer) is in the trainer now: free it
        finished = trainer.train()
        if finished and trainer.master and tc.sample_tokens > 0 and tc.fsdp:
            print(f"(no sample under FSDP: python fsdp.py {tc.out_dir} writes ckpt.pt for sample.py)")
        elif finished and trainer.master and tc.sample_tokens > 0:
            from sample import complete, default_prompt
            print("---- sample ----")
            print(complete(trainer.raw_model, trainer.tokenizer, default_prompt(trainer.tokenizer), tc.sample_tokens,
                           temperature=0.8, top_k=None, device=trainer.device)[0])
        return 0 if finished else 130
    except (UsageError, CheckpointError, PrepareError, ValueError, OSError) as e:
        if given.get("debug"):
            raise
        return report("train.py", e)
    except FloatingPointError as e:
        return report("train.py", e, code=1)
    finally:  # on every way out, errors and a second Ctrl-C included
        release_out_dirs()
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
