"""
Train a nanoMeSH model, from a laptop CPU to multi-node torchrun DDP (FSDP2 past one GPU's memory).

    python train.py                                   # the classroom model: ~3 min on a CPU
    python train.py config/classroom_base.json        # settings from a JSON file, then flags
    python train.py --init_from=resume --out_dir=out  # continue exactly where a run stopped
    torchrun --standalone --nproc_per_node=8 train.py config/pythia-160m_mesh.json

Every setting is a field of TrainConfig (--help). train() reads top to bottom: settings, device,
data, model and optimizer, the run's folder, the loop, a closing sample. A step's batches depend on
the step alone, never on the process count. The safety nets stand behind four objects a first
reading can skip: the Dataset (data/), the Run, the Spread and the Device (support/).
"""

import math
import os
import sys
import time
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # even if PYTHONSAFEPATH=1
from configurator import UsageError, check_ranges, setting
from data.dataset import Dataset, get_batch
from mesh import PRESETS, SCHEMES, Config, ConfigError, RecursiveGPT
from support import command
from support.device import Device
from support.distributed import spread_over
from support.run import Run, resolve


# The settings' ranges: (names, the test each value must pass, the range in words); None passes
RANGES = [
    ("batch_size grad_accum eval_interval eval_iters log_interval epochs lr_decay_iters plan_gpus "
     "threads", lambda v: v >= 1, "at least 1"),
    ("max_iters sample_tokens warmup_iters keep_every", lambda v: v >= 0, "0 or more"),
    ("seed", lambda v: v >= 0, "0 or more (numpy's generators take no negative seed)"),
    ("lr gpu_tflops", lambda v: v > 0, "a finite number above 0"),
    ("gpu_memory", lambda v: v > 0, "a finite number of GiB above 0"),
    ("dist_timeout", lambda v: v > 0, "a finite number of seconds above 0"),
    ("min_lr weight_decay", lambda v: v >= 0, "a finite number, 0 or more"),
    ("grad_clip", lambda v: v >= 0, "a finite number, 0 or more (0 disables clipping)"),
    ("beta1 beta2", lambda v: 0 <= v < 1, "in [0, 1)"),
]


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
    data_order: str = setting("random", "random windows, or sequential: the data once, in order",
                              choices=("random", "sequential"))
    epochs: int = setting(1, "sequential: passes over the data allowed before the run stops")
    out_dir: str = setting("out", "the run's folder: ckpt.pt, log.jsonl", path=True)
    overwrite: bool = setting(False, "let a scratch run replace the run in out_dir")
    init_from: str = setting("scratch", "scratch, resume, or loop a vanilla:OUT_DIR or hf:PATH")
    core_init: str = setting("stepwise", "a looped source's cores: stepwise or average layers",
                             choices=("stepwise", "average"))
    # optimisation: the paper's recipe (Appendix B)
    batch_size: int = setting(16, "micro-batch per process")
    grad_accum: int | None = setting(None, "micro-batches a step, all processes; None: one each")
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
    keep_every: int = setting(0, "keep the checkpoint of every N-th step too, ckpt_N.pt; 0: none")
    eval_iters: int = setting(20, "batches per split at each evaluation")
    log_interval: int = setting(50, "print the loss every this many steps")
    sample_tokens: int = setting(300, "tokens sampled from the trained model at the end; 0 skips")
    wandb_log: bool = setting(False, "log to Weights & Biases too, on rank 0 (pip install wandb)")
    wandb_project: str = setting("nanomesh", "the wandb project")
    wandb_run_name: str | None = setting(None, "the wandb run's name; None: out_dir's name")
    # system
    device: str = setting("auto", "auto: cuda, then mps, then cpu")
    dtype: str = setting("auto", "auto: bfloat16 autocast on GPUs that support it, else float32")
    threads: int | None = setting(None, "CPU threads for torch; None: torch's (one per core)")
    compile: bool | None = setting(None, "torch.compile the model; None: on for CUDA only")
    grad_checkpoint: bool = setting(False, "recompute activations in backward to save memory")
    fsdp: bool = setting(False, "shard weights, gradients and AdamW state (FSDP2)")
    dist_timeout: float = setting(900.0, "torchrun: seconds to wait on another process, then stop")
    seed: int = setting(1337, "the data order and the initial weights")
    # memory plan (support/plan.py)
    plan: bool = setting(False, "print per-GPU memory under DDP and FSDP and the time, then exit")
    plan_gpus: int | None = setting(None, "processes to plan for; None: WORLD_SIZE, else 8")
    gpu: str = setting("h100", "the GPU planned for: a100 or h100 (its memory and bf16 peak)")
    gpu_memory: float | None = setting(None, "GiB per GPU, for the plan; None: --gpu's")
    gpu_tflops: float | None = setting(None, "peak TFLOPS per GPU, for the plan; None: --gpu's")
    debug: bool = setting(False, "show Python tracebacks for errors")

    def __post_init__(self):
        """The settings' checks, before any read or write (the model's: mesh.Config's)."""
        check_ranges(self, RANGES)
        model_config(self, vocab_size=None)  # first: a known preset, whose lr is the default
        lr = self.lr or PRESETS[self.model]["lr"]
        if self.min_lr is not None and self.min_lr > lr:
            preset = "" if self.lr else f", the {self.model} preset's"
            raise UsageError(f"--min_lr={self.min_lr} is above --lr={lr}{preset}; "
                             f"the cosine decays from lr to min_lr")
        decay = self.max_iters if self.lr_decay_iters is None else self.lr_decay_iters
        source = " from --max_iters" if self.lr_decay_iters is None else ""
        if self.warmup_iters is not None and self.warmup_iters > decay:
            raise UsageError(f"--warmup_iters={self.warmup_iters} ends after the cosine does "
                             f"(--lr_decay_iters={decay}{source}); warm up for at most {decay} "
                             f"steps, or raise --lr_decay_iters")
        world = os.environ.get("WORLD_SIZE", "1")  # torchrun's processes share out grad_accum
        if self.grad_accum and world.isdigit() and self.grad_accum % int(world):
            raise UsageError(f"--grad_accum={self.grad_accum} does not divide by the world size "
                             f"{world}; use a multiple of {world}")
        if self.keep_every % self.eval_interval:
            raise UsageError(f"--keep_every={self.keep_every} keeps checkpoints, which are saved "
                             f"every --eval_interval={self.eval_interval} steps: give a multiple")
        kind, _, path = self.init_from.partition(":")
        if self.init_from not in ("scratch", "resume") and (kind not in ("vanilla", "hf")
                                                            or not path):
            raise UsageError(f"--init_from={self.init_from} is not one of scratch, resume, "
                             f"vanilla:OUT_DIR, hf:PATH")


def model_config(tc, vocab_size):
    """The model's Config: the preset's, with every model setting that was given. One the model
    cannot take (mesh.py's own ConfigError, so that the file stands alone) is bad input here."""
    own = ("n_embd", "n_head") if tc.init_from != "scratch" else ()  # a resume's or source's own
    shape = {k: getattr(tc, k) for k in Config.__dataclass_fields__
             if hasattr(tc, k) and k not in own}
    try:
        return Config.from_preset(tc.model, vocab_size=vocab_size, **shape)
    except ConfigError as e:
        raise UsageError(str(e)) from None


def get_lr(it, lr, min_lr, warmup, decay):
    """Linear warmup, a cosine from lr to min_lr at step `decay`, then min_lr (Appendix B)."""
    if it < warmup:
        return lr * (it + 1) / (warmup + 1)
    if it >= decay:
        return min_lr
    ratio = (it - warmup) / max(1, decay - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


def evaluate(model, splits, tc, device, autocast, rank=0, world=1):
    """{split: mean loss} over eval_iters fixed batches of each split (the same every time), shared
    out over the processes; each runs as many forwards as the others (FSDP gathers weights with
    all of them), the last round padded with batches whose losses are dropped."""
    n, T = tc.eval_iters, model.config.block_size
    out = {}
    for code, (split, data) in enumerate(splits.items(), start=1):
        keys = range(rank, math.ceil(n / world) * world, world)  # whole rounds of world batches
        batches = (get_batch(data, tc, T, (code, 0, k % n), device) for k in keys)
        losses = [loss for k, loss in zip(keys, model.evaluate(batches, autocast)) if k < n]
        total = torch.tensor([sum(losses), len(losses)], device=device, dtype=torch.float64)
        if world > 1:
            dist.all_reduce(total)
        out[split] = (total[0] / total[1]).item()
    return out


def train(given):
    # ---- settings: the flags given over a resumed run's own; torchrun's processes join and agree
    tc, ckpt = resolve(TrainConfig, given)  # ckpt: a resume's checkpoint, or a source to loop
    if tc.plan:  # the memory plan: nothing is trained or allocated
        from support.plan import plan
        plan(tc, ckpt["model"].config if ckpt else model_config(tc, vocab_size=None), ckpt)
        return 0
    launched = dist.is_initialized()  # by torchrun: its processes have joined their group
    rank, world = (dist.get_rank(), dist.get_world_size()) if launched else (0, 1)
    master, resumed = rank == 0, ckpt if tc.init_from == "resume" else None
    if resumed:  # a finished run is left as it is (support/resume.py: read only for a resume)
        from support.resume import finished, restore
        if finished(resumed, tc):
            return 0

    # ---- device and dtype, resolved for this machine (the checkpoint keeps them as given)
    device = Device(tc, master)  # under torchrun, GPU LOCAL_RANK
    torch.manual_seed(tc.seed + rank)

    # ---- data: a folder of data/prepare.py's (made here on first use, by rank 0) or indexed
    data = Dataset.open(tc.data_root, tc.dataset, resumed and (resumed.get("data") or {}))
    tc.data_root, tc.dataset = data.root, data.name  # where it is; offline, a stand-in's name

    # ---- model and optimizer: from scratch, the run's checkpoint, or a pretrained vanilla model
    spread = spread_over(tc.fsdp, launched)  # one process, DDP, or FSDP2 (--fsdp)
    from support.memory import check_run  # a model that cannot fit is refused before it moves
    if tc.init_from == "scratch":
        model = RecursiveGPT(check_run(model_config(tc, data.vocab_size), tc, device, world))
    else:  # the run's checkpoint, or vanilla:OUT_DIR or hf:PATH looped to --layout and --scheme
        from support import pretrained
        model = ckpt["model"] if resumed else pretrained.loop(ckpt, tc, data)
        check_run(model.config, tc, device, world)
    data.check_fits(model.config)
    source, ckpt = (ckpt or {}).get("source"), None  # its record; the source's model freed
    # the schedule's settings left unset (Appendix B), derived here: the checkpoint keeps them so
    lr = tc.lr or PRESETS[tc.model]["lr"]
    min_lr = 0.1 * lr if tc.min_lr is None else tc.min_lr
    decay = tc.lr_decay_iters or tc.max_iters
    warmup = max(1, decay // 100) if tc.warmup_iters is None else tc.warmup_iters
    model.grad_checkpoint = tc.grad_checkpoint
    # raw_model: the plain module, saved and sampled; model: what trains (compiled, DDP, sharded)
    raw_model, model = spread.wrap(model, device, scratch=resumed is None)
    optimizer = raw_model.configure_optimizer(tc.weight_decay, lr, (tc.beta1, tc.beta2),
                                              device.type)
    run = Run(tc, resumed, spread, device.type)  # OUT_DIR, from start to end
    iter_num, best_val = 0, float("inf")
    if resumed:  # AdamW's state (FSDP: the weights too, sharded)
        restore(run, raw_model, optimizer)
        iter_num, best_val = resumed["iter_num"], resumed["best_val_loss"]
    cfg = raw_model.config
    tokens_per_step = tc.batch_size * tc.grad_accum * cfg.block_size

    # ---- all checked: now the run takes OUT_DIR (its lock, killed writes' leftovers, its log)
    run.start()
    if master:
        print(f"model {tc.model} layout {cfg.layout} scheme {cfg.scheme}: "
              f"{raw_model.num_params():,} non-embedding params, compute depth {cfg.shape.depth}; "
              f"dataset {tc.dataset} ({len(data.train):,} train tokens, {tc.data_order} order), "
              f"device {device.name} {device.dtype}, {world} process(es){spread.name}, "
              f"{tokens_per_step:,} tokens/step, {torch.get_num_threads()} threads", flush=True)

    def save(losses):  # what a checkpoint keeps besides the weights and AdamW's state
        run.save(raw_model, optimizer, {
            "model_config": cfg.to_dict(), "train_config": asdict(tc),
            "iter_num": iter_num, "best_val_loss": best_val, "data": data.record,
            **({"source": source} if source else {})}, losses)

    # ---- the loop: evaluate and save, learning rate, accumulated micro-batches, clip, step, log
    stop = command.Stop.poll(launched)  # Ctrl-C, SIGTERM, SIGHUP, a lost launcher: finish, save
    local = tc.grad_accum // world  # this process's micro-batches m = rank, rank + world, ...
    steps = data.steps(tc, cfg.block_size)  # sequential: at most those of its --epochs passes
    t0, timed_from, stopping = time.perf_counter(), iter_num, False
    while True:
        done = iter_num >= steps
        if done and iter_num < tc.max_iters and master:  # sequential: its --epochs passes are read
            print(data.ran_out(iter_num, tc, cfg.block_size), flush=True)
        new_here = iter_num != run.saved_iter  # a resume evaluated this step already
        if (done or iter_num % tc.eval_interval == 0) and new_here:  # a stop here too: as ever
            splits = {"train": data.train, "val": data.val}
            losses = evaluate(raw_model, splits, tc, device.name, device.autocast, rank, world)
            best_val = min(best_val, losses["val"])
            record = {"iter": iter_num, "train_loss": losses["train"], "val_loss": losses["val"]}
            run.write(record, f"iter {iter_num}: train loss {losses['train']:.4f}, "
                              f"val loss {losses['val']:.4f}")
            save(losses)  # unless the model blew up
            t0, timed_from = time.perf_counter(), iter_num  # evaluation stays out of ms/iter
        elif stopping:
            save({})
        if done or stopping:
            break
        lr_now = get_lr(iter_num, lr, min_lr, warmup, decay)
        for group in optimizer.param_groups:
            group["lr"] = lr_now
        loss_sum = torch.zeros((), device=device.name)
        for j, m in enumerate(range(rank, tc.grad_accum, world)):
            torch.manual_seed(hash((tc.seed, iter_num, m)))  # dropout keyed as the batch is
            x, y = get_batch(data.train, tc, cfg.block_size, (0, iter_num, m), device.name)
            with spread.sync(model, last=j == local - 1):  # DDP all-reduces at the last one
                with device.autocast:
                    _, loss = model(x, y)
                (loss / local).backward()  # the mean over the global batch, once the ranks average
            loss_sum += loss.detach().float()
        if tc.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(raw_model.parameters(), tc.grad_clip)
        requested = torch.tensor(float(stop.requested()), device=device.name)
        state = torch.stack([loss_sum / local, requested])
        if world > 1:  # every rank sees the same loss and stops at the same step
            dist.all_reduce(state)  # summed, then divided: torch 2.7's gloo has no ReduceOp.AVG
        loss = state[0].item() / world
        stopping = state[1].item() > 0
        if not math.isfinite(loss):
            raise FloatingPointError(f"loss is {loss} at iter {iter_num}; stopped without saving, "
                                     f"so {run.last_good()}")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        iter_num += 1
        if iter_num % tc.log_interval == 0 or iter_num == steps or stopping:
            dt = (time.perf_counter() - t0) / (iter_num - timed_from)
            t0, timed_from = time.perf_counter(), iter_num
            eta = dt * (steps - iter_num) / 60
            record = {"iter": iter_num, "loss": loss, "lr": lr_now, "ms": 1000 * dt}
            text = (f"iter {iter_num}: loss {loss:.4f}, lr {lr_now:.2e}, {1000 * dt:.1f} ms/iter, "
                    f"{tokens_per_step / dt:,.0f} tok/s, eta {eta:.1f} min")
            mfu = device.mfu(cfg, tokens_per_step, dt, world)  # of all processes' peak, or None
            if mfu is not None:  # the log keeps its full precision (a tiny model's prints as 0.0%)
                record["mfu"] = mfu
                text += f", mfu {100 * mfu:.1f}%"
            run.write(record, text + device.pace(dt))  # with why, when far slower than at first
    if stopping and iter_num < steps:
        run.stopped(iter_num, world)
        return 130

    # ---- a closing sample (every rank decodes the same tokens: FSDP gathers weights)
    if stop.finished() and tc.sample_tokens > 0:  # saved: a signal now ends the sample at once
        torch.manual_seed(tc.seed)
        tok = data.tokenizer
        prompt = torch.tensor([tok.encode(tok.default_prompt) or [0]], device=device.name)
        out = raw_model.eval().generate(prompt, tc.sample_tokens, temperature=0.8)[0]
        if master:
            print(f"---- sample ----\n{tok.decode(out.tolist())}")
    return 0


def main(argv):
    notes = f"presets: {', '.join(PRESETS)}\nschemes: {', '.join(SCHEMES)}"
    stopped = ("so at once: a checkpoint being written, if any, was dropped, the one before it "
               "is as it was")
    return command.main("train.py", train, argv, TrainConfig, notes, stopped=stopped)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
