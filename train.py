"""
Train a nanoMeSH model, from a laptop CPU to multi-node torchrun DDP (FSDP2 past one GPU's memory).

    python train.py                                   # the classroom model: ~3 min on a CPU
    python train.py config/classroom_base.json        # settings from a JSON file, then flags
    python train.py --init_from=resume --out_dir=out  # continue exactly where a run stopped
    torchrun --standalone --nproc_per_node=8 train.py config/pythia-160m_mesh.json

Every setting is a field of TrainConfig (--help). train() reads top to bottom: settings, device,
data, model and optimizer, the loop, a closing sample. A step's batches depend on the step alone,
never on the process count, so a resume sees the data it would have seen. Each safety net is one
call into support/ (outdir, checkpoint, resume, guards, ddp, fsdp): a first reading skips them.
"""

import dataclasses
import math
import os
import sys
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from configurator import UsageError, setting
from data.loader import (check_fits, dataset_folder, dataset_record, load_split, random_windows,
                         sequential_windows)
from data.tokenizer import Tokenizer
from mesh import PRESETS, SCHEMES, Config, RecursiveGPT
from support import checkpoint, ddp, guards, machine, outdir, plan, runfiles


@dataclass
class TrainConfig:
    """Settings of one training run; model fields left at None take the preset's value."""
    # model
    model: str = setting("classroom", "a preset of mesh.PRESETS (listed below)")
    layout: str | None = setting(None, "blocks: P+CRN+Q as 2+4R2+2 or 4+8R2+4; 12 is vanilla")
    scheme: str | None = setting(None, "how the state passes between loop steps (listed below)")
    n_slots: int | None = setting(None, "mesh buffer slots; None means K+3")
    cycle: str | None = setting(None, "mesh transitional cycle: routed (default) or direct")
    router_init: str | None = setting(None, "mesh routers at init: uniform (default) or base")
    slot0: str | None = setting(None, "mesh slot 0: the scaled (default) or unscaled embedding")
    n_embd: int | None = setting(None, "width D")
    n_head: int | None = setting(None, "attention heads")
    block_size: int | None = setting(None, "context length T")
    dropout: float | None = setting(None, "dropout on attention and residual branches")
    # data and output
    dataset: str = setting("shakespeare_char", "a folder of data_root made by data/prepare.py, "
                           "or PATH/document (indexed)", path=True)
    data_root: str = setting("data", "the folder holding the datasets", path=True)
    data_order: str = setting("random", "random windows, or sequential: the data once, in order")
    epochs: int = setting(1, "sequential: passes over the data allowed before the run stops")
    out_dir: str = setting("out", "the run's folder: ckpt.pt, log.jsonl", path=True)
    overwrite: bool = setting(False, "let a scratch run replace the run in out_dir")
    init_from: str = setting("scratch", "scratch, resume, or hf:PATH (a GPT-NeoX folder)")
    # optimisation (Appendix B: AdamW (0.9, 0.95), wd 0.01 on matrices, clip 1.0, 1% linear
    # warmup, cosine to 10% of peak)
    batch_size: int = setting(16, "micro-batch per process")
    grad_accum: int = setting(1, "micro-batches per optimizer step, over all processes")
    max_iters: int = setting(1000, "optimizer steps")
    lr: float | None = setting(None, "peak learning rate; None means the preset's")
    min_lr: float | None = setting(None, "the cosine's floor; None means 10% of lr")
    warmup_iters: int | None = setting(None, "linear warmup; None means 1% of lr_decay_iters")
    lr_decay_iters: int | None = setting(None, "length of the cosine; None means max_iters")
    weight_decay: float = setting(0.01, "AdamW's, on matrices only")
    beta1: float = setting(0.9, "AdamW's first-moment decay")
    beta2: float = setting(0.95, "AdamW's second-moment decay")
    grad_clip: float = setting(1.0, "clip the gradient's norm to this; 0 disables")
    # evaluation, logging, sampling
    eval_interval: int = setting(250, "evaluate and save a checkpoint every this many steps")
    eval_iters: int = setting(20, "batches per split at each evaluation")
    log_interval: int = setting(50, "print the loss every this many steps")
    sample_tokens: int = setting(300, "tokens sampled from the trained model at the end; 0 skips")
    # system
    device: str = setting("auto", "auto: cuda, then mps, then cpu")
    dtype: str = setting("auto", "auto: bfloat16 autocast on GPUs that support it, else float32")
    compile: bool | None = setting(None, "torch.compile the model; None: on for CUDA only")
    grad_checkpoint: bool = setting(False, "recompute activations in backward to save memory")
    fsdp: bool = setting(False, "shard weights, gradients and AdamW state (FSDP2)")
    dist_timeout: float = setting(900.0, "torchrun: seconds to wait on another process, then stop")
    seed: int = setting(1337, "the data order and the initial weights")
    # memory plan (support/plan.py)
    plan: bool = setting(False, "print per-GPU memory under DDP and FSDP, then exit")
    plan_gpus: int | None = setting(None, "processes to plan for; None: WORLD_SIZE, else 8")
    gpu_memory: float = setting(80.0, "GiB per GPU, for the plan")
    debug: bool = setting(False, "show Python tracebacks for errors")

    def __post_init__(self):  # every setting is checked before anything is read or written
        guards.check_settings(self)  # each in its range, and with the others
        model_config(self, vocab_size=None)  # the model settings, by mesh.Config's own checks
        self.out_dir = outdir.held(self.out_dir)  # a link: its folder, held for good


def ceil_div(a, b):
    """a / b rounded up, for integers."""
    return -(-a // b)


def model_config(tc, vocab_size):
    """The model's Config: the preset's, with every model setting that was given."""
    shape = {k: getattr(tc, k) for k in Config.__dataclass_fields__ if hasattr(tc, k)}
    return Config.from_preset(tc.model, vocab_size=vocab_size, **shape)


def get_batch(data, tc, block_size, key, device):
    """(inputs, targets), (B, T) each, from tc.batch_size windows of block_size + 1 tokens, chosen
    by key alone: (0, step, micro-batch) to train, (split code, 0, k) to evaluate. Random: windows
    at starts seeded by (seed, *key); sequential (training): micro-batch m of step it is windows
    (it * grad_accum + m) * batch_size on (Pythia's data in Pythia's steps: data/README.md)."""
    if tc.data_order == "sequential" and key[0] == 0:
        _, it, m = key
        first = (it * tc.grad_accum + m) * tc.batch_size
        rows = sequential_windows(data, block_size + 1, first, tc.batch_size)
    else:
        rows = random_windows(data, block_size + 1, tc.batch_size, [tc.seed, *key])
    xy = torch.from_numpy(rows).to(device, non_blocking=True)  # (B, T+1)
    return xy[:, :-1], xy[:, 1:]


def get_lr(it, tc):
    """Linear warmup, a cosine from lr to min_lr at lr_decay_iters, then min_lr (Appendix B)."""
    warmup, decay = tc.warmup_iters, tc.lr_decay_iters
    if it < warmup:
        return tc.lr * (it + 1) / (warmup + 1)
    if it >= decay:
        return tc.min_lr
    ratio = (it - warmup) / max(1, decay - warmup)
    return tc.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (tc.lr - tc.min_lr)


def evaluate(model, splits, tc, device, autocast, rank=0, world=1):
    """{split: mean loss} over eval_iters fixed batches of each split (the same every time), shared
    out over the processes; each runs as many forwards as the others (FSDP gathers weights with
    all of them), the last round padded with batches whose losses are dropped."""
    out, n, T = {}, tc.eval_iters, model.config.block_size
    for code, (split, data) in enumerate(splits.items(), start=1):
        keys = range(rank, ceil_div(n, world) * world, world)
        batches = (get_batch(data, tc, T, (code, 0, k % n), device) for k in keys)
        losses = [loss for k, loss in zip(keys, model.evaluate(batches, autocast)) if k < n]
        total = torch.tensor([sum(losses), len(losses)], device=device, dtype=torch.float64)
        if world > 1:
            dist.all_reduce(total)
        out[split] = (total[0] / total[1]).item()
    return out


def prepared(tc):
    """--dataset, prepared first if it is not there (offline, shakespeare_char: pydoc's text)."""
    if dataset_folder(tc.data_root, tc.dataset):
        return tc.dataset
    from data.prepare import ensure_dataset  # the write side, loaded only to make a dataset
    return ensure_dataset(tc.dataset, tc.data_root)


def train(given):
    # ---- settings: the defaults, when resuming the run's own, then the flags given
    distributed, rank, world = machine.process_group()  # torchrun sets RANK and WORLD_SIZE
    master = rank == 0
    given = machine.restarted(given, given.get("out_dir", TrainConfig.out_dir), master)
    ckpt = None  # the checkpoint a resumed run continues from
    if given.get("init_from") == "resume":
        from support import resume  # continuing a run: its checkpoint, its checks, its RNG state
        out_dir = given.get("out_dir", TrainConfig.out_dir)
        if master and os.path.isdir(out_dir):  # before reading: a live run may be saving
            runfiles.own(out_dir)
        ckpt = resume.load(out_dir, sharded=bool(given.get("fsdp")))
    # a resume keeps the run's settings, but not its folder (it writes where it read) nor --fsdp
    tc = resume.settings(ckpt, TrainConfig, given) if ckpt else TrainConfig(**given)
    derived = ("dtype", "compile", "lr", "min_lr", "warmup_iters", "lr_decay_iters")
    as_given = {k: getattr(tc, k) for k in derived}  # saved as given: a resume derives them again
    if tc.plan:  # the memory plan: nothing is trained, loaded or allocated
        print(plan.plan(tc, ckpt["model"].config if ckpt else model_config(tc, vocab_size=None)))
        return 0
    spread = ddp  # the whole model on every process: one process, or DDP under torchrun
    if tc.fsdp:  # FSDP2: weights, gradients and AdamW state sharded over the processes
        from support import fsdp as spread
        spread.check_launch(distributed)
    if ckpt:  # every reason it cannot continue with these flags (its model, data, optimizer)
        data_dir = resume.check(ckpt, tc, given)
        if resume.finished(ckpt, tc):  # said so: a finished run is left as it is
            return 0
    elif tc.init_from == "scratch" and master:
        outdir.check_fresh(tc.out_dir, tc.overwrite)
    if tc.grad_accum % world:
        raise UsageError(f"--grad_accum={tc.grad_accum} does not divide by the world size "
                         f"{world}; use a multiple of {world}")

    # ---- device and dtype: resolved for this machine, but saved as given, so that a resume on
    # another machine picks its own (and a new --lr brings its own 10% min_lr)
    device = machine.start(tc.device, distributed, tc.dist_timeout)
    device_type = device.split(":")[0]
    tc.dtype = machine.resolve_dtype(tc.dtype, device)
    tc.compile = machine.resolve_compile(tc.compile, device_type, master)
    autocast = machine.autocast(device, tc.dtype)
    torch.manual_seed(tc.seed + rank)

    # ---- data: a folder of data/prepare.py's (made here on first use, by rank 0) or indexed
    if not ckpt:
        tc.dataset = machine.from_rank0(lambda: prepared(tc), distributed, master)
        data_dir = dataset_folder(tc.data_root, tc.dataset)
    runfiles.own(data_dir, "--dataset", note=False, shared=True)  # prepare.py waits for this run
    record, tokenizer = dataset_record(data_dir), Tokenizer.load(data_dir)  # what it reads
    train_data, val_data = load_split(data_dir, "train"), load_split(data_dir, "val")
    vocab = tokenizer.vocab_size  # a BPE's padded to a multiple of 64
    vocab = vocab if tokenizer.kind == "char" else ceil_div(vocab, 64) * 64

    # ---- model and optimizer: from scratch, the run's checkpoint, or a Hugging Face GPT-NeoX
    if tc.init_from == "scratch":  # refused first where it cannot fit in the device's memory
        model = RecursiveGPT(plan.check_run(model_config(tc, vocab), tc, device, world))
    elif ckpt:
        model = ckpt["model"]  # its config was checked against the flags given
    elif tc.init_from.startswith("hf:"):
        from support import hf
        model = hf.for_training(tc.init_from[3:], tc, given, tokenizer, master)
    else:
        raise UsageError(f"--init_from={tc.init_from} is not one of scratch, resume, hf:PATH")
    check_fits(model.config, tokenizer, train_data, val_data, tc.dataset)
    tc.lr = PRESETS[tc.model]["lr"] if tc.lr is None else tc.lr
    tc.min_lr = 0.1 * tc.lr if tc.min_lr is None else tc.min_lr
    tc.lr_decay_iters = tc.max_iters if tc.lr_decay_iters is None else tc.lr_decay_iters
    if tc.warmup_iters is None:
        tc.warmup_iters = max(1, tc.lr_decay_iters // 100)
    model.grad_checkpoint = tc.grad_checkpoint
    # raw_model: the plain module, saved and sampled; model: what trains (compiled, DDP, sharded)
    raw_model, model = spread.wrap(model, device, tc, scratch=ckpt is None)
    betas = (tc.beta1, tc.beta2)
    optimizer = raw_model.configure_optimizer(tc.weight_decay, tc.lr, betas, device_type)
    iter_num, best_val, saved_iter = 0, float("inf"), None  # saved_iter: the last good checkpoint
    if ckpt:
        spread.load(ckpt, raw_model, optimizer)  # AdamW's state (FSDP: the weights too, sharded)
        iter_num, best_val, saved_iter = ckpt["iter_num"], ckpt["best_val_loss"], ckpt["iter_num"]
        resume.restore_rng(ckpt, tc.seed, rank, world, device_type)
    cfg = raw_model.config
    tokens_per_step = tc.batch_size * tc.grad_accum * cfg.block_size

    # ---- all checked: now the run takes OUT_DIR (its lock, killed writes' leftovers, its log)
    log = None
    if master:
        log = outdir.start_run(tc.out_dir, ckpt is None, tc.overwrite, spread.CHECKPOINT, iter_num)
        print(f"model {tc.model} layout {cfg.layout} scheme {cfg.scheme}: "
              f"{raw_model.num_params():,} non-embedding params, compute depth {cfg.shape.depth}; "
              f"dataset {tc.dataset} ({len(train_data):,} train tokens, {tc.data_order} order), "
              f"device {device} {tc.dtype}, {world} process(es){spread.NAME}, "
              f"{tokens_per_step:,} tokens/step", flush=True)

    def save():
        nonlocal saved_iter
        spread.save(tc.out_dir, raw_model, optimizer, master, {
            "model_config": cfg.to_dict(), "train_config": {**dataclasses.asdict(tc), **as_given},
            "iter_num": iter_num, "best_val_loss": best_val,
            "rng": checkpoint.rng_state(device_type), "data": record,
            "saved_at": time.time(), "launch": machine.launch_id()})
        saved_iter = iter_num
        if master:
            log.commit()  # --overwrite: the new run replaces the old one with its first checkpoint

    def last_good():  # in words, for the error of a model that blew up
        return guards.last_good(os.path.join(tc.out_dir, spread.CHECKPOINT), saved_iter)

    # ---- the loop: evaluate and save, learning rate, accumulated micro-batches, clip, step, log
    stop = guards.Stop(rank, distributed)  # Ctrl-C, SIGTERM, SIGHUP, a lost torchrun: finish, save
    local = tc.grad_accum // world  # this process's micro-batches m = rank, rank + world, ...
    window = cfg.block_size + 1  # tokens of a training window: the inputs and one more
    windows, steps = len(train_data) // window, tc.max_iters
    if tc.data_order == "sequential":  # at most the steps of its --epochs passes over the data
        steps = min(steps, tc.epochs * windows // (tc.batch_size * tc.grad_accum))
    flops = machine.flops_per_token(cfg) * tokens_per_step
    peak = machine.peak_bf16_flops(device, tc.dtype)
    resumed_at, t0, timed_from = iter_num, time.time(), iter_num
    while True:
        done = iter_num >= steps
        if done and iter_num < tc.max_iters and master:  # sequential: its --epochs passes are read
            print(guards.ran_out(iter_num, tc, windows, window), flush=True)
        new_here = not ckpt or iter_num != resumed_at  # a resume evaluated this step already
        if done or (iter_num % tc.eval_interval == 0 and new_here):
            losses = evaluate(raw_model, {"train": train_data, "val": val_data}, tc, device,
                              autocast, rank, world)
            best_val = min(best_val, losses["val"])
            if master:
                row = {"iter": iter_num, "train_loss": losses["train"], "val_loss": losses["val"]}
                log.write(row, f"iter {iter_num}: train loss {losses['train']:.4f}, "
                               f"val loss {losses['val']:.4f}")
            guards.check_saveable(raw_model, optimizer, losses, iter_num, last_good, distributed)
            save()
            t0, timed_from = time.time(), iter_num  # evaluation stays out of ms/iter
        if done:
            break
        lr = get_lr(iter_num, tc)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss_sum = torch.zeros((), device=device)
        for j, m in enumerate(range(rank, tc.grad_accum, world)):
            x, y = get_batch(train_data, tc, cfg.block_size, (0, iter_num, m), device)
            with spread.sync(model, last=j == local - 1):  # DDP all-reduces at the last one
                with autocast:
                    _, loss = model(x, y)
                (loss / local).backward()  # the mean over the global batch, once the ranks average
            loss_sum += loss.detach().float()
        if tc.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(raw_model.parameters(), tc.grad_clip)
        requested = torch.tensor(float(stop.requested()), device=device)
        state = torch.stack([loss_sum / local, requested])
        if distributed:  # every rank sees the same loss and stops at the same step
            dist.all_reduce(state)  # summed, then divided: torch 2.7's gloo has no ReduceOp.AVG
        loss, stopping = state[0].item() / world, state[1].item() > 0
        if not math.isfinite(loss):
            raise FloatingPointError(f"loss is {loss} at iter {iter_num}; stopped without saving, "
                                     f"so {last_good()}")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        iter_num += 1
        if iter_num % tc.log_interval == 0 or iter_num == tc.max_iters or stopping:
            dt = (time.time() - t0) / (iter_num - timed_from)
            t0, timed_from = time.time(), iter_num
            mfu = flops / dt / (peak * world) if peak else None  # of all processes' peak
            eta = dt * (tc.max_iters - iter_num) / 60
            if master:  # the log keeps MFU's full precision (a tiny model's prints as 0.0%)
                log.write({"iter": iter_num, "loss": loss, "lr": lr, "ms": 1000 * dt,
                           **({"mfu": mfu} if peak else {})},
                          f"iter {iter_num}: loss {loss:.4f}, lr {lr:.2e}, {1000 * dt:.1f} "
                          f"ms/iter, {tokens_per_step / dt:,.0f} tok/s, eta {eta:.1f} min"
                          + (f", mfu {100 * mfu:.1f}%" if peak else ""))
        if stopping:
            save()
            if master:
                print(guards.stopped(iter_num, tc, world))
            return 130

    # ---- a closing sample (every rank decodes the same tokens: FSDP gathers weights)
    if tc.sample_tokens > 0:
        torch.manual_seed(tc.seed)
        idx = torch.tensor([tokenizer.encode(tokenizer.default_prompt) or [0]], device=device)
        out = raw_model.eval().generate(idx, tc.sample_tokens, temperature=0.8)  # idx (1, T)
        text = tokenizer.decode(out[0].tolist())
        if master:
            print(f"---- sample ----\n{text}")
    return 0


def main(argv):
    """python train.py: train() inside the guards (one-line errors, exit codes, locks released)."""
    notes = f"presets: {', '.join(PRESETS)}\nschemes: {', '.join(SCHEMES)}"
    return guards.command("train.py", TrainConfig, train, argv, notes)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
