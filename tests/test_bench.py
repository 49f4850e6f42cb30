"""
Smoke tests for bench.py: a tiny run end to end prints the table and writes valid JSON lines,
and bad flags are one-line usage errors. No timing assertions: timing belongs to bench.py.

    python -m pytest tests/test_bench.py --all  # marked slow: the fast tier leaves it out
"""

import contextlib
import errno
import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from conftest import HANG, ROOT, small_disk
from support import spawn
from tools import bench
from mesh import Config, RecursiveGPT

pytestmark = pytest.mark.slow  # processes, real training runs: python -m pytest --all

TINY = dict(layout="1+1R2+1", n_embd=32, n_head=2, block_size=16)
FLAGS = [f"--{k}={v}" for k, v in TINY.items()] + ["--batch_size=2", "--iters=3", "--warmup=1", "--threads=1"]
KEYS = {"kind", "variant", "scheme", "layout", "compute_depth", "non_embedding_params", "n_slots", "batch_size",
        "block_size", "device", "dtype", "compile", "ms_per_step", "tokens_per_s", "flops_per_token", "flops_per_s",
        "peak_fraction", "time_vs_vanilla", "time_vs_base", "peak_mb", "step_mb", "recompiles"}
DECODE = {"decode_tok_s_cache", "decode_tok_s_no_cache", "decode_speedup"}


def run(*args):
    return subprocess.run([sys.executable, "tools/bench.py", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=HANG)


def test_tiny_run_end_to_end(tmp_path):
    out = tmp_path / "bench.jsonl"
    r = run(*FLAGS, "--schemes=vanilla,base,mesh", f"--json={out}")
    assert r.returncode == 0, r.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [x["kind"] for x in records] == ["variant"] * 3 + ["machine"]
    rows, machine = {x["variant"]: x for x in records[:3]}, records[3]
    assert list(rows) == ["vanilla", "base", "mesh"]
    assert {"torch", "device", "device_name", "threads", "peak_flops", "peak_source", "other_processes_cpus",
            "settings", "command"} <= set(machine)
    assert machine["threads"] == 1 and machine["peak_flops"] > 0 and machine["device"] == "cpu"
    for name, row in rows.items():
        assert KEYS | DECODE <= set(row), name
        scheme = "base" if name == "vanilla" else name
        cfg = Config.from_preset("classroom", scheme=scheme, layout="4" if name == "vanilla" else TINY["layout"],
                                 **{k: v for k, v in TINY.items() if k != "layout"})
        assert (row["scheme"], row["layout"], row["compute_depth"]) == (scheme, cfg.layout, 4)
        assert row["non_embedding_params"] == RecursiveGPT(cfg).num_params()
        # one FLOP count for every variant of a depth: 6 x (the unrolled vanilla model's blocks + lm_head) +
        # attention, counted here from the vanilla model's parameters (its ln_f, 2D, is not a block)
        vanilla = RecursiveGPT(Config(**{**cfg.to_dict(), "layout": "4", "scheme": "base"}))
        D, V, T = cfg.n_embd, cfg.vocab_size, cfg.block_size
        assert row["flops_per_token"] == 6 * (vanilla.num_params() - 2 * D + D * V) + 12 * 4 * D * T
        assert row["tokens_per_s"] == pytest.approx(2 * 16 / (row["ms_per_step"] / 1000))
        assert row["flops_per_s"] == pytest.approx(row["flops_per_token"] * row["tokens_per_s"])
        assert row["peak_fraction"] == pytest.approx(row["flops_per_s"] / machine["peak_flops"])
        assert min(row["ms_per_step"], row["peak_mb"], row["decode_tok_s_cache"], row["decode_tok_s_no_cache"],
                   row["decode_speedup"]) > 0  # how they are derived: test_decode_rounds_interleave_variants
        assert row["recompiles"] is None and row["compile"] is False and row["dtype"] == "float32"
        assert f"| {name} | {cfg.layout} | {row['non_embedding_params']:,} |" in r.stdout
    # ratios are paired per round: with an odd number of rounds, vanilla/base is exactly 1 / (base/vanilla)
    assert rows["vanilla"]["time_vs_base"] == pytest.approx(1 / rows["base"]["time_vs_vanilla"], rel=1e-12)
    assert rows["mesh"]["n_slots"] == 5 and rows["base"]["n_slots"] is None  # K + 3
    assert rows["mesh"]["non_embedding_params"] > rows["base"]["non_embedding_params"]  # its routers

    # --decode=0 skips decoding, and --json appends
    r = run(*FLAGS, "--schemes=base", "--decode=0", f"--json={out}")
    assert r.returncode == 0, r.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [x["kind"] for x in records[4:]] == ["variant", "machine"]
    assert not DECODE & set(records[4]) and "time_vs_vanilla" not in records[4] and records[4]["time_vs_base"] == 1.0


def test_decode_rounds_interleave_variants(monkeypatch):
    """Decoding is timed like the train steps: each round times every variant's cached and full-recompute
    generate(), in an order rotated by the round; tok/s are medians, the speedup is paired per round."""
    clock, calls = [0.0], []
    seconds = {("a", True): [1.0, 4.0, 1.5], ("a", False): [8.0, 8.0, 9.0],   # per timed round
               ("b", True): [2.0, 2.0, 2.0], ("b", False): [5.0, 7.0, 6.0]}

    class Model:
        config = Config(n_embd=16, n_head=2, layout="1", vocab_size=7, block_size=8)

        def __init__(self, name):
            self.name = name

        def eval(self):
            pass

        def generate(self, prompt, n, temperature, use_cache):
            assert prompt.shape == (1, bench.PROMPT) and temperature == 0
            calls.append((self.name, use_cache, n))
            if n == bench.NEW_TOKENS:  # timed (not compiled, so warm-up asks for 8 tokens)
                clock[0] += seconds[self.name, use_cache][sum(c[:2] == (self.name, use_cache) for c in calls) - 2]

    monkeypatch.setattr(bench.time, "perf_counter", lambda: clock[0])
    speeds = bench.decode_speeds({"a": Model("a"), "b": Model("b")}, "cpu", bench.BenchConfig(compile=False))
    warm = [("a", True, 8), ("a", False, 8), ("b", True, 8), ("b", False, 8)]
    aT, aF, bT, bF = ("a", True, 200), ("a", False, 200), ("b", True, 200), ("b", False, 200)
    assert calls == warm + [aT, aF, bT, bF] + [aF, bT, bF, aT] + [bT, bF, aT, aF]
    assert speeds["a"] == (200 / 1.5, 200 / 8.0, 6.0, 0)   # median of 8/1, 8/4, 9/1.5
    assert speeds["b"] == (200 / 2.0, 200 / 6.0, 3.0, 0)   # median of 5/2, 7/2, 6/2


def test_decoding_runs_after_the_training_models_are_freed(monkeypatch):
    """Decode models are built once every training model and optimizer is gone (on a GPU, the memory)."""
    seen = {}

    def decode_speeds(models, device, bc):
        gc.collect()
        alive = [o for o in gc.get_objects() if issubclass(type(o), (RecursiveGPT, torch.optim.Optimizer))]
        seen.update(models=models, alive=alive)
        return {name: (1.0, 1.0, 1.0, 0) for name in models}

    monkeypatch.setattr(bench, "decode_speeds", decode_speeds)
    monkeypatch.setattr(bench, "in_fresh_process", lambda fn, cfg, bc: (1.0, 1.0))
    flags = dict(TINY, schemes="base,mesh", batch_size=2, iters=1, warmup=1, threads=torch.get_num_threads())
    rows, _ = bench.run(bench.BenchConfig(**flags))
    assert [r["decode_speedup"] for r in rows] == [1.0, 1.0]
    assert list(seen["models"]) == ["base", "mesh"]
    assert sorted(map(id, seen["alive"])) == sorted(map(id, seen["models"].values()))  # the decode models only
    assert all(m.config.block_size == bench.DECODE_BLOCK for m in seen["models"].values())


def test_memory_without_a_second_compile():
    """On CUDA bench.py measures memory in the timing process: train_step(eager=True) runs a
    compiled model's own forward, building no graph, while the compiled call builds one;
    held_bytes is what the model and AdamW keep between steps: 4 bytes a weight, 8 of AdamW
    moments, a 4-byte step count per tensor."""
    torch._dynamo.reset()
    cfg = Config(**{**Config().to_dict(), **TINY, "vocab_size": 64, "scheme": "mesh"})
    model, opt = bench.build(cfg, bench.BenchConfig(), "cpu")
    model.compile(backend="eager")  # dynamo alone: it counts graphs without inductor's C++ builds
    x, y = torch.randint(64, (2, 2, 16))
    before, weights = bench.graphs(), [p.detach().clone() for p in model.parameters()]
    bench.train_step(model, opt, x, y, contextlib.nullcontext(), eager=True)
    assert bench.graphs() == before and not any(map(torch.equal, weights, model.parameters()))
    params = list(model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    held = 12 * sum(p.numel() for p in params) + 4 * len(params) + buffers
    assert bench.held_bytes(model, opt) == held
    bench.train_step(model, opt, x, y, contextlib.nullcontext())
    assert bench.graphs() > before


def test_the_fit_check_counts_grad_checkpoint(monkeypatch):
    """--grad_checkpoint=true is what makes some settings fit: the check before anything is built counts its memory
    (plan.py's), and refuses in one line only what does not fit even with it, before even the batch is made (16
    bytes a token: a batch alone can outgrow the machine)."""
    from configurator import UsageError
    from support import memory

    class Built(Exception):
        pass

    cfg = bench.variants(bench.BenchConfig(**TINY, schemes="mesh"))[0][1]
    needs = [memory.memory(cfg, 64, 1, False, ckpt, 4)["total"] for ckpt in (True, False)]
    assert needs[0] < needs[1]
    monkeypatch.setattr(memory, "device_memory", lambda device: (sum(needs) / 2, "this machine"))  # fits with it only
    monkeypatch.setattr(bench, "build", lambda *args: (_ for _ in ()).throw(Built))  # past the check
    monkeypatch.setattr(torch, "randint", lambda *args, **kw: (_ for _ in ()).throw(Built))  # the batch
    flags = dict(TINY, schemes="mesh", batch_size=64, device="cpu", dtype="float32")
    with pytest.raises(Built):
        bench.run(bench.BenchConfig(**flags, grad_checkpoint=True))
    with pytest.raises(UsageError, match="^scheme mesh .* needs about .* GiB of this machine; use smaller settings$"):
        bench.run(bench.BenchConfig(**flags, grad_checkpoint=False))


def test_profile_steps_counts_the_profiled_steps_only():
    """Matmul FLOPs are exact: the 3 profiled steps' products (2 m n k each, for every matmul operator), not the
    warm-up step's; attention is the SDPA operators' time, zero in a step without attention."""
    a, b, bias = torch.randn(32, 16), torch.randn(16, 8), torch.randn(8)
    a3, b3, c3 = torch.randn(4, 32, 16), torch.randn(4, 16, 8), torch.randn(4, 32, 8)
    q = torch.randn(1, 2, 8, 4)
    flops = 2 * 32 * 16 * 8

    def step(attention):
        a @ b, torch.addmm(bias, a, b), torch.bmm(a3, b3), torch.baddbmm(c3, a3, b3), torch.exp(a)
        if attention:
            torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)

    with_attention, without = bench.profile_steps(lambda: step(True), 3), bench.profile_steps(lambda: step(False), 3)
    for p in (with_attention, without):
        assert p["matmul_flops"] == 3 * (2 * flops + 2 * 4 * flops)
        assert 0 < p["matmul"] + p["attention"] < p["wall"]
    assert with_attention["attention"] > 0 and without["attention"] == 0


def test_profile_columns(monkeypatch, capsys):
    """--profile adds each variant's matmul and attention shares of a step and the matmuls' share of the peak,
    derived from profile_steps' seconds; bench.py refuses it on a GPU."""
    seen = []

    def profile_steps(step):
        seen.append(real(step))
        return seen[-1]

    real = bench.profile_steps
    monkeypatch.setattr(bench, "profile_steps", profile_steps)
    monkeypatch.setattr(bench, "in_fresh_process", lambda fn, cfg, bc: (1.0, 1.0))
    flags = dict(TINY, schemes="base,mesh", batch_size=2, iters=1, warmup=1, decode=False, profile=True)
    rows, info = bench.run(bench.BenchConfig(**flags, threads=torch.get_num_threads()))
    assert len(seen) == bench.PROFILE_ROUNDS * 2 and [r["variant"] for r in rows] == ["base", "mesh"]
    for row in rows:  # summed over the rounds, which rotate the variants
        orders = [["base", "mesh"], ["mesh", "base"]]  # each round rotates the variants
        mine = [p for k, p in enumerate(seen) if orders[k // 2 % 2][k % 2] == row["variant"]]
        p = {key: sum(q[key] for q in mine) for key in mine[0]}
        expect = dict(matmul_share=p["matmul"] / p["wall"], attention_share=p["attention"] / p["wall"],
                      matmul_peak_fraction=p["matmul_flops"] / p["matmul"] / info["peak_flops"])
        assert {key: row[key] for key in expect} == pytest.approx(expect, rel=1e-12)
        assert 0 < row["matmul_share"] + row["attention_share"] < 1
    assert "| % matmul | matmul % of peak | % attention |" in bench.table(rows, info)
    monkeypatch.setattr(bench, "resolve_device", lambda name: "cuda")
    assert bench.main(["--profile=true"]) == 2
    assert "--profile times CPU operators, but --device=auto runs on cuda; use --device=cpu" in capsys.readouterr().err


def test_a_runs_ratios_and_plan_are_its_own(monkeypatch):
    """In one round, a variant's time against base is its step time over base's; the plan is plan.py's at the
    run's --grad_checkpoint."""
    from support import memory
    monkeypatch.setattr(bench, "in_fresh_process", lambda fn, cfg, bc: (1.0, 1.0))
    flags = dict(TINY, schemes="base,mesh", batch_size=2, iters=1, warmup=0, decode=False, grad_checkpoint=True)
    bc = bench.BenchConfig(**flags, threads=torch.get_num_threads())
    rows, _ = bench.run(bc)
    assert rows[1]["time_vs_base"] == pytest.approx(rows[1]["ms_per_step"] / rows[0]["ms_per_step"], rel=1e-12)
    cfgs = dict(bench.variants(bc))
    assert [r["plan_mb"] for r in rows] == [memory.memory(cfgs[r["variant"]], 2, 1, False, True, 4)["total"] / 2**20
                                            for r in rows]


def test_the_table_shows_each_measured_column_and_what_it_ran_on():
    same = dict(dtype="float32", compile=False, batch_size=2, block_size=16, n_embd=32, vocab_size=64)
    rows = [dict(variant="vanilla", layout="4", non_embedding_params=1000, ms_per_step=10.0, **same),
            dict(variant="base", layout="1+1R2+1", non_embedding_params=500, ms_per_step=12.0, time_vs_vanilla=1.2,
                 **same)]
    info = dict(device="cpu", device_name="A CPU", threads=2, torch="2.x", peak_flops=2.5e12,
                peak_source="measured", other_processes_cpus=0.5, cpus=4)
    assert bench.table(rows, info) == (
        "| variant | layout | non-emb params | ms/step | vs vanilla |\n|---|---|---|---|---|\n"
        "| vanilla | 4 | 1,000 | 10.0 | - |\n| base | 1+1R2+1 | 500 | 12.0 | 1.200 |\n\n"
        "A CPU (cpu, torch threads 2, torch 2.x), float32; batch 2 x 16 tokens, D=32, V=64; peak 2,500.0 GFLOP/s "
        "(measured)\nOther processes kept 0.50 of the 4 CPUs busy during the timed steps.\n"
        "Not measured on this system: peak memory (no /proc/self/status).")
    assert "\nOther processes kept 0.00 of the 4 CPUs" in bench.table(rows, dict(info, other_processes_cpus=0.0))


def dies(conn):
    os._exit(1)


def test_a_fresh_process_that_dies_measures_nothing():
    """Killed (out of memory, say): its memory figures are left empty, not bench.py's error."""
    assert bench.in_fresh_process(dies) == (None, None)


@pytest.mark.parametrize("args, needle", [
    (["--schemes=vanilla,mehs"], "unknown scheme 'mehs' in --schemes (did you mean 'mesh'?)"),
    (["--schemes=,"], "--schemes is empty"),
    (["--model=pythia-14m", "--schemes=base,mesh"], "scheme 'mesh' needs loop steps, but layout '6' has none"),
    (["--layout=2+xR2"], "bad layout '2+xR2'"),
    (["--n_embd=30", "--n_head=4"], "n_embd=30 is not divisible by n_head=4"),
    (["--dtype=float16"], "--dtype=float16 is not supported"),
    (["--iters=0"], "--iters=0 must be at least 1"),
    (["--iter=3"], "unknown setting 'iter' in the command line (did you mean --iters?)"),
    (["--device=tpu"], "unknown --device=tpu"),
    (["--threads=0"], "--threads=0 must be at least 1"),
    (["--warmup=-1"], "--warmup=-1 must be 0 or more"),
    ([f"--json={__file__}/b.jsonl"], f"cannot write --json={__file__}/b.jsonl: no permission, or a file where a "
                                     f"folder should be"),
    (["--json=/tmp"], "--json=/tmp is a folder; give a file name"),
])
def test_bad_input(args, needle, capsys):
    assert bench.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("bench.py: error: ") and needle in err and len(err.strip().splitlines()) == 1


def test_a_scheme_named_twice_runs_once():
    """--schemes=base,mesh,base runs base once: one model, one row a variant."""
    todo = bench.variants(bench.BenchConfig(**TINY, schemes="base,mesh,base"))
    assert [name for name, _ in todo] == ["base", "mesh"]


def test_json_that_fails_later_is_not_created(tmp_path, capsys):
    """--json is checked before the run without creating the file: a run refused later leaves nothing."""
    out = tmp_path / "b.jsonl"
    assert bench.main([f"--json={out}", "--dtype=float16"]) == 2
    assert "--dtype=float16 is not supported" in capsys.readouterr().err and not out.exists()


def test_json_on_a_disk_that_fills_is_appended_whole_or_not_at_all(tmp_path, capsys, monkeypatch):
    """--json on a full disk, a real one (a small tmpfs, where this machine lets us mount one: the kernel
    writes what fits, then ENOSPC) or else simulated so: one line that says so, exit 2, and the file as it
    was, ending in a whole line; once there is room the same records append whole."""
    disk, mounted = small_disk(tmp_path, 256 * 1024)
    try:
        out = disk / "b.jsonl"
        out.write_text('{"kind": "variant", "variant": "earlier"}\n')
        before = out.read_bytes()
        rows = [dict(kind="variant", variant="base", padding="x" * 200_000)]
        monkeypatch.setattr(bench, "run", lambda bc: (rows, dict(kind="machine")))
        monkeypatch.setattr(bench, "table", lambda rows, info: "the table")
        if mounted:
            (disk / "filler").write_bytes(b"\0" * (shutil.disk_usage(disk).free - 8192))
        else:
            real_write = os.write

            def full(fd, data):
                if bytes(data[:9]) != b'{"kind": ':  # only the records meet the full disk
                    return real_write(fd, data)
                real_write(fd, bytes(data[:len(data) // 2]))
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            monkeypatch.setattr(os, "write", full)
        assert bench.main([f"--json={out}"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"bench.py: error: could not append to --json={out}: the disk is full (") and \
            err.endswith("bytes free); it is as it was: free some space, then run again\n"), err
        assert out.read_bytes() == before
        monkeypatch.undo()
        os.remove(disk / "filler") if mounted else None
        monkeypatch.setattr(bench, "run", lambda bc: (rows, dict(kind="machine")))
        monkeypatch.setattr(bench, "table", lambda rows, info: "the table")
        assert bench.main([f"--json={out}"]) == 0
        records = [json.loads(line) for line in out.read_text().splitlines()]
        assert [r["variant"] for r in records[:2]] == ["earlier", "base"] and records[2]["kind"] == "machine"
    finally:
        if mounted:
            subprocess.run(["umount", str(disk)], check=True)


def deaf(folder, conn):
    """A fresh process's measurement, deaf to the group's signals as bench.py's is: it marks its start and end."""
    spawn.helper()
    (folder / "started").touch()
    time.sleep(30)
    (folder / "ended").touch()


def test_a_signal_ends_benchs_fresh_process_at_once(tmp_path):
    """A signal to bench.py while a fresh process measures (which leaves the group's signals to bench.py): it is
    ended at once, its measurement dropped. Sent SIGTERM, which it ignores, it went on to the end."""
    def interrupt():
        while not (tmp_path / "started").exists():
            time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGINT)  # as Ctrl-C: KeyboardInterrupt here (conftest.py)
    threading.Thread(target=interrupt, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        bench.in_fresh_process(deaf, tmp_path)
    assert (tmp_path / "started").exists() and not (tmp_path / "ended").exists()


def seen(arg, conn):
    """A fresh process's measurement, deaf to the group's signals as bench.py's is: whether it ignores them."""
    spawn.helper()
    conn.send([signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)] == [signal.SIG_IGN] * 2)


def interrupted():
    """Unpickled in a fresh process's first moment, before it can ignore signals: it sends that process a
    Ctrl-C and a SIGTERM then, as a terminal or `kill -TERM -PGID` can."""
    os.kill(os.getpid(), signal.SIGINT)
    os.kill(os.getpid(), signal.SIGTERM)


class SignalledAtStart:
    def __reduce__(self):
        return interrupted, ()


# in a fresh process (Python's resource tracker not yet started: its start unblocked signals), a fresh process
# signalled in its first moment measures; then bench.py's own signals, which it blocked as it started
SIGNALLED = """import signal
from tools import bench
from test_bench import SignalledAtStart, seen
print(bench.in_fresh_process(seen, SignalledAtStart()), signal.pthread_sigmask(signal.SIG_BLOCK, []))"""


@pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="needs POSIX signals")
def test_benchs_fresh_process_ignores_signals_from_its_first_moment():
    """It starts with Ctrl-C and SIGTERM blocked, then ignores them. One that came before it could ignore them
    printed its KeyboardInterrupt's traceback, and the measurement was lost."""
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "tests")}
    r = subprocess.run([sys.executable, "-c", SIGNALLED], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=HANG)
    assert (r.stderr, r.stdout, r.returncode) == ("", "True set()\n", 0)


def test_benchs_fresh_process_starts_where_signals_cannot_be_blocked(monkeypatch):
    """Windows has no pthread_sigmask (nor SIG_BLOCK): the fresh process starts, unblocked."""
    for name in ("pthread_sigmask", "SIG_BLOCK", "SIG_SETMASK"):
        monkeypatch.delattr(signal, name, raising=False)
    assert bench.in_fresh_process(seen, None) is True


class Helper:
    """A helper process that starts, or whose start fails (out of processes); what befell it."""
    def __init__(self, starts, seen):
        self.starts, self.seen, self.pid = starts, seen, None

    def start(self):
        if not self.starts:
            raise OSError(errno.EAGAIN, "Resource temporarily unavailable")
        self.pid = 12345

    def kill(self):
        self.seen.append(("killed", self.pid))

    def join(self):
        self.seen.append(("joined", self.pid))


def test_a_failed_start_ends_the_helpers_started_and_unblocks_signals():
    """spawn.start: the second of two helpers cannot start; the first is ended (killed, joined),
    the signals blocked for their start are unblocked, and the error passes on."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, []) if hasattr(signal, "pthread_sigmask") else 0
    seen = []
    with pytest.raises(OSError, match="Resource temporarily unavailable"):
        spawn.start([Helper(True, seen), Helper(False, seen), Helper(True, seen)])
    assert seen == [("killed", 12345), ("joined", 12345)]
    if hasattr(signal, "pthread_sigmask"):
        assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before


@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_signal_stops_bench_in_one_line(how, tmp_path):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it), SIGTERM or SIGHUP while the variants
    are timed: one line, exit 130 (every script's, support/command.py), nothing written, no traceback."""
    out = tmp_path / "b.jsonl"
    p = subprocess.Popen([sys.executable, "tools/bench.py", *FLAGS[:-3], "--iters=1000000", "--warmup=1",
                          "--threads=1", f"--json={out}"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    try:
        first = p.stderr.readline()
        assert first.startswith(f"bench.py: timing {len(bench.VARIANTS)} variant(s)"), first
        sig = getattr(signal, how)
        os.killpg(p.pid, sig) if how == "SIGINT" else p.send_signal(sig)
        stdout, stderr = p.communicate(timeout=HANG)
    finally:
        p.kill()
        p.wait()
    assert p.returncode == 130, stderr
    assert stderr.strip() == (f"bench.py: stopped by {how}, before the table was done; nothing was printed or "
                              f"written") and stdout == ""
    assert not out.exists()
