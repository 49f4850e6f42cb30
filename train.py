"""
Train a nanoMeSH model, from a 2-core laptop CPU to multi-node torchrun DDP.

    python train.py                                   # classroom MeSH model, Tiny Shakespeare chars, ~3 min on CPU
    python train.py config/classroom_base.json        # a JSON file of settings, then --key=value overrides
    python train.py --init_from=resume --out_dir=out  # continue exactly where a run stopped
    torchrun --standalone --nproc_per_node=8 train.py config/pythia-160m_mesh.json

Every setting is a field of TrainConfig below (`python train.py --help`). The batches
of optimizer step `it` are drawn from a generator seeded by (seed, it, micro-batch), so
they depend only on the seed and the step: never on the number of processes, and a
resumed run sees exactly the data it would have seen. Checkpoints (OUT_DIR/ckpt.pt) are
written atomically; Ctrl-C or SIGTERM finishes the current step, saves and exits.
"""

import dataclasses
import json
import math
import os
import signal
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from checkpoint import CheckpointError, load_checkpoint, load_hf, save_checkpoint
from configurator import UsageError, parse_flags, report, resolve_device, resolve_dtype
from data.prepare import PrepareError, Tokenizer, checkpoint_dataset, ensure_dataset, load_split, random_windows
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
    n_embd: int | None = None
    n_head: int | None = None
    block_size: int | None = None
    dropout: float | None = None
    # data and output
    dataset: str = "shakespeare_char"   # a folder of DATA_ROOT made by data/prepare.py
    data_root: str = "data"
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


MODEL_KEYS = ("layout", "scheme", "n_slots", "n_embd", "n_head", "block_size", "dropout")
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


def get_batch(data, tc, block_size, key, device):
    """A batch of `tc.batch_size` random windows of block_size + 1 tokens (inputs and targets); `key` (a
    tuple of ints) alone decides which."""
    xy = torch.from_numpy(random_windows(data, block_size + 1, tc.batch_size, [tc.seed, *key]))  # (B, T+1)
    xy = xy.to(device, non_blocking=True)
    return xy[:, :-1], xy[:, 1:]


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


class Trainer:
    def __init__(self, tc, given, resume=None):
        self.tc = tc
        # Resolved below for this machine and run, but saved as given: a resume on another machine picks its
        # own dtype and compile, and a new --lr there brings its own 10% min_lr.
        self.as_given = {k: getattr(tc, k) for k in ("dtype", "compile", "lr", "min_lr")}
        self.ddp = int(os.environ.get("RANK", -1)) != -1
        self.rank, self.world = (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])) if self.ddp else (0, 1)
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
                data_dir = checkpoint_dataset(dataclasses.asdict(tc))
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
        vocab = self.tokenizer.vocab_size
        vocab = vocab if self.tokenizer.kind == "char" else -(-vocab // 64) * 64  # pad BPE to a multiple of 64

        # ---- model and optimizer: scratch, resume, or a Hugging Face GPT-NeoX import
        ckpt_path = os.path.join(tc.out_dir, "ckpt.pt")
        ckpt = None
        if tc.init_from == "resume":
            model, ckpt = resume  # its config was checked against the flags given in main()
        elif tc.init_from == "scratch":
            if os.path.exists(ckpt_path) and not tc.overwrite:
                raise UsageError(f"{ckpt_path} exists; continue it with --init_from=resume, or start over "
                                 f"with --overwrite=true, or choose another --out_dir")
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
            if self.master and self.tokenizer.kind == "gpt2":
                print("note: Pythia checkpoints use the GPT-NeoX tokenizer, not GPT-2's; the ids of a GPT-2 "
                      "dataset mean other tokens to them")
        else:
            raise UsageError(f"--init_from={tc.init_from} is not one of scratch, resume, hf:PATH")
        cfg = model.config
        if cfg.vocab_size < self.tokenizer.vocab_size:
            raise UsageError(f"dataset {tc.dataset!r} has {self.tokenizer.vocab_size} tokens but the model's "
                             f"vocabulary is {cfg.vocab_size}; use a dataset made with the model's tokenizer")
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
        if ckpt is not None:
            self.load_optimizer(ckpt)
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

        if self.master:
            os.makedirs(tc.out_dir, exist_ok=True)
            for name in os.listdir(tc.out_dir):  # temporary files of checkpoint writes that were killed
                if name.startswith(".ckpt-") and name.endswith(".tmp"):
                    os.remove(os.path.join(tc.out_dir, name))
            sharding.remove_unfinished(tc.out_dir)
            self.log_file = open(os.path.join(tc.out_dir, "log.jsonl"), "a" if ckpt else "w")
            print(f"model {tc.model} layout {cfg.layout} scheme {cfg.scheme}: "
                  f"{model.num_params():,} non-embedding params, compute depth {cfg.shape.depth}; "
                  f"dataset {tc.dataset} ({len(self.train_data):,} train tokens), device {self.device} {tc.dtype}, "
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
        if self.tc.fsdp:
            return self.checkpoint_sharded()
        if not self.master:
            return
        rng = {"torch": torch.get_rng_state()}
        if self.device_type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state()
        save_checkpoint({
            "model": self.raw_model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "model_config": self.raw_model.config.to_dict(),
            "train_config": {**dataclasses.asdict(self.tc), **self.as_given},
            "iter_num": self.iter_num,
            "best_val_loss": self.best_val,
            "rng": rng,  # the data needs no state: a step's batches depend only on (seed, step)
        }, os.path.join(self.tc.out_dir, "ckpt.pt"))

    def checkpoint_sharded(self):
        """Under FSDP: every rank writes its shards, rank 0 the plain data (fsdp.save_sharded)."""
        rng = {"torch": torch.get_rng_state()}
        if self.device_type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state()
        sharding.save_sharded(self.tc.out_dir, self.raw_model, self.optimizer, {
            "model_config": self.raw_model.config.to_dict(),
            "train_config": {**dataclasses.asdict(self.tc), **self.as_given},
            "iter_num": self.iter_num,
            "best_val_loss": self.best_val,
            "rng": sharding.rng_to_json(rng),
        }, self.master)

    def eval_and_save(self):
        losses = self.evaluate()
        self.best_val = min(self.best_val, losses["val"])
        self.log({"iter": self.iter_num, "train_loss": losses["train"], "val_loss": losses["val"]},
                 f"iter {self.iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        self.checkpoint()

    def step(self):
        """One optimizer step over the global batch; returns [mean loss, stop flag] agreed by all ranks."""
        tc, it = self.tc, self.iter_num
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
            last = os.path.join(tc.out_dir, sharding.POINTER if tc.fsdp else "ckpt.pt")
            raise FloatingPointError(f"loss is {state[0].item()} at iter {it}; stopped without saving, so "
                                     f"{last} is the last good checkpoint "
                                     f"(resume with --init_from=resume and a lower --lr)")
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

    def loop(self):
        tc = self.tc
        tokens_per_step = tc.batch_size * tc.grad_accum * self.raw_model.config.block_size
        peak = peak_bf16_flops(self.device, tc.dtype)
        resumed_at = self.iter_num
        t0, timed_from = time.time(), self.iter_num
        while self.iter_num < tc.max_iters:
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
                          f"python train.py --init_from=resume --out_dir={tc.out_dir}")
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
        return load_checkpoint(out_dir)
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
            resume = load_resume(given.get("out_dir", settings["out_dir"]), given)
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
            from sample import complete
            print("---- sample ----")
            print(complete(trainer.raw_model, trainer.tokenizer, "\n", tc.sample_tokens, temperature=0.8,
                           top_k=None, device=trainer.device)[0])
        return 0 if finished else 130
    except (UsageError, CheckpointError, PrepareError, ValueError, OSError) as e:
        if given.get("debug"):
            raise
        return report("train.py", e)
    except FloatingPointError as e:
        return report("train.py", e, code=1)
    finally:  # on every way out, errors and a second Ctrl-C included
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
