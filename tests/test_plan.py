"""
The memory plan (plan.py, `train.py --plan=true`): its activation formula against measured peak memory,
and the plan's table.

    python -m pytest tests/test_plan.py -q --all  # --all: its slow-marked tests too
"""

import os
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from tools import bench
import configurator
from support import files as plain, memory as plan
import train
from conftest import ROOT, listed
from mesh import PRESETS, Config, RecursiveGPT
from support.plan import choose

# (n_embd, block_size, batch_size, vocab_size): two sizes whose activations (100-350 MB) dwarf the
# parameters (under 1M) and the process's own memory noise
SIZES = [(128, 512, 8, 256), (96, 512, 16, 512)]
CASES = [(size, scheme, False) for size in SIZES for scheme in ("base", "mesh")] + [(SIZES[1], "mesh", True)]


def measured_activations(case):
    """Peak memory a train step adds (bench.peak_memory, in a fresh process) less what gradients and AdamW
    state hold (12 bytes a parameter), in bytes; and the plan's estimate."""
    (D, T, B, V), scheme, ckpt = case
    cfg = Config(vocab_size=V, block_size=T, n_embd=D, n_head=4, layout="1+1R2+1", scheme=scheme)
    bc = bench.BenchConfig(batch_size=B, device="cpu", dtype="float32", grad_checkpoint=ckpt)
    _, step_mb = bench.in_fresh_process(bench.peak_memory, cfg, bc)
    return step_mb * 2**20 - 12 * plan.param_counts(cfg)[0], plan.activation_bytes(cfg, B, ckpt, compute_bytes=4)


@pytest.mark.slow
def test_activation_estimate_within_25_percent_of_measured_peak(monkeypatch):
    # glibc keeps freed mid-sized blocks in its heap, so the resident set's peak would also count memory
    # already freed; served by mmap, freed memory leaves the resident set and the peak is the tensors'.
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")  # read by each fresh (spawned) child at start
    with ThreadPoolExecutor(2) as pool:  # two children at a time: each measures only its own memory
        results = list(pool.map(measured_activations, CASES))
    for case, (measured, estimate) in zip(CASES, results):
        assert measured > 50 * 2**20, case  # the child ran and stepped
        assert abs(estimate / measured - 1) < 0.25, (case, measured / 2**20, estimate / 2**20)


@pytest.mark.parametrize("layout, scheme, cycle", [("1+2R3+1", "mesh", "routed"), ("1+2R3+1", "mesh", "direct"),
                                                   ("2+1+1+2", "base", "routed"), ("5", "base", "routed")])
def test_param_counts_match_a_real_model(layout, scheme, cycle):
    """plan.param_counts counts from the shapes alone: the same numbers as a model built."""
    cfg = Config(vocab_size=64, block_size=16, n_embd=32, n_head=2, layout=layout, scheme=scheme,
                 **({"cycle": cycle} if scheme == "mesh" else {}))
    model = RecursiveGPT(cfg)
    total, root, block = plan.param_counts(cfg)
    assert total == sum(p.numel() for p in model.parameters())
    assert block == sum(p.numel() for p in [*model.prelude, *model.coda][0].parameters())
    outside = (model.wte, model.lm_head, model.ln_f, *([model.routers] if scheme == "mesh" else []))
    assert root == sum(p.numel() for m in outside for p in m.parameters())


def test_fsdp_shards_weights_gradients_and_optimizer_state():
    cfg = Config(vocab_size=64, block_size=16, n_embd=32, n_head=2, layout="1+2R3+1", scheme="mesh")
    ddp, one, four = (plan.memory(cfg, 4, n, fsdp, False, 2) for n, fsdp in ((4, False), (1, True), (4, True)))
    P = plan.param_counts(cfg)[0]
    assert ddp["weights"] == one["weights"] == 4 * P and ddp["optimizer"] == 8 * P
    assert four["weights"] == P and four["gradients"] == P and four["optimizer"] == 2 * P
    assert four["activations"] == ddp["activations"]  # the micro-batch per GPU is the same
    assert ddp["working"] == 6 * P  # all-reduce buckets and autocast's bf16 weight copies
    _, root, block = plan.param_counts(cfg)  # the root unit, the head's gradient, two bf16 blocks
    assert four["working"] == one["working"] == 4 * root + 4 * 64 * 32 + 2 * 2 * block


def test_a_plan_for_one_gpu_counts_no_all_reduce_buckets(capsys, monkeypatch):
    """One process runs without DDP: the plan's DDP rows on one GPU are what that run's own check
    counts (check_fits refuses a run at the plan's total less a byte, not at it)."""
    assert train.main(["--model=pythia-160m", "--plan=true", "--plan_gpus=1", "--block_size=1024"]) == 0
    row = capsys.readouterr().out.splitlines()[2].split()
    cfg = Config.from_preset("pythia-160m", block_size=1024)
    P, need = plan.param_counts(cfg)[0], plan.memory(cfg, 16, 1, False, False, 2)["total"]
    assert row[0] == "DDP" and row[4:7] == [f"{2 * P / 2**30:.2f}", row[5], f"{need / 2**30:.2f}"]
    monkeypatch.setattr(plan, "device_memory", lambda device: (need, "this GPU"))
    assert plan.check_fits(cfg, 16, "cuda", 2) is cfg
    monkeypatch.setattr(plan, "device_memory", lambda device: (need - 1, "this GPU"))
    with pytest.raises(configurator.UsageError, match="needs about"):
        plan.check_fits(cfg, 16, "cuda", 2)


def test_activation_bytes_is_its_docstrings_formula():
    """MeSH adds r (K + 1) (S D + D + 2 S) a token; with --grad_checkpoint the peak is the larger of the head's
    gradients and one recomputed block's (a small vocabulary here: the block's)."""
    mesh, base = (Config(vocab_size=64, block_size=16, n_embd=32, n_head=2, layout="1+2R3+1", scheme=scheme)
                  for scheme in ("mesh", "base"))
    D, H, V, L, S, K, tokens = 32, 2, 64, mesh.shape.depth, mesh.slots, mesh.n_steps, 4 * 16
    buffer = 4 * (K + 1) * (S * D + D + 2 * S)
    assert plan.activation_bytes(mesh, 4) - plan.activation_bytes(base, 4) == tokens * buffer
    block, backward = 4 * (D + H + 4) + 16 * 4 * D, 8 * 4 * D
    assert 4 * V + block + backward > 4 * 4 * V
    per_token = L * 4 * D + 2 * 4 * D + buffer + 4 * V + block + backward
    assert plan.activation_bytes(mesh, 4, grad_checkpoint=True) == tokens * per_token


def test_a_model_alone_is_refused_where_its_weights_twice_do_not_fit(monkeypatch):
    """batch_size=None (an imported model): a state dict and the model it is loaded into, 8 bytes a parameter."""
    cfg = Config(vocab_size=64, block_size=16, n_embd=32, n_head=2, layout="1+2R3+1", scheme="mesh")
    P = plan.param_counts(cfg)[0]
    monkeypatch.setattr(plan, "device_memory", lambda device: (8 * P, "this machine"))
    assert plan.check_fits(cfg, None, "cpu") is cfg
    monkeypatch.setattr(plan, "device_memory", lambda device: (8 * P - 1, "this machine"))
    with pytest.raises(configurator.UsageError, match=rf"^this model \(layout 1\+2R3\+1, n_embd 32, {P:,} "
                                                      r"parameters\) needs about 0\.0 GiB, more than the 0\.0 GiB "
                                                      r"of this machine; choose a smaller one$"):
        plan.check_fits(cfg, None, "cpu")


@pytest.mark.slow
def test_plan_prints_the_table_the_choice_and_the_time_and_allocates_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    assert train.main([os.path.join(ROOT, "config/pythia-6.9b_mesh.json"), "--plan=true", "--plan_gpus=8",
                       f"--out_dir={out}"]) == 0
    text = capsys.readouterr().out
    rows = {line[:18].strip(): line.split() for line in text.splitlines()[2:6]}
    assert "pythia-6.9b layout 5+11R2+5 scheme mesh" in text and "8 GPU(s) of 80 GiB and 989 TFLOPS (h100)" in text
    assert rows["DDP"][-1] == "no" and rows["FSDP + grad_ckpt"][-1] == "yes"  # 6.9B needs FSDP on 80 GB
    assert rows["FSDP"][-4:] == ["yes", "<-", "the", "choice"] and text.count("<- the choice") == 1
    assert float(rows["DDP"][1]) == pytest.approx(8 * float(rows["FSDP"][1]), rel=0.01)  # weights / 8
    # the time: 6 x the unrolled non-embedding parameters + the head + attention, per token, by hand
    D, L, V, T, tokens, steps = 4096, 32, 50432, 4096, 2 * 256 * 4096, 119209
    step = (6 * (L * (12 * D * D + 13 * D) + D * V) + 12 * L * D * T) * tokens
    days = step * steps / (8 * 989e12 * 0.4) / 86400
    assert f"time, as set: {step:.3g} FLOPs a step" in text
    assert f"{steps:,} steps: {days:,.1f} days on 8 GPU(s) at 40% MFU ({days * 24 * 8:,.0f} GPU-hours)" in text
    assert not out.exists()
    assert train.main([os.path.join(ROOT, "config/pythia-160m_mesh.json"), "--plan=true", "--gpu=a100",
                       "--gpu_tflops=100", "--gpu_memory=40"]) == 0
    text = capsys.readouterr().out
    assert "8 GPU(s) of 40 GiB and 100 TFLOPS (as given)" in text and "x 4/3 for grad_ckpt's recompute" in text
    # without --grad_accum (as the classroom's defaults): one micro-batch a process, 4 of them
    assert train.main(["--model=pythia-160m", "--plan=true", "--plan_gpus=4", "--block_size=1024"]) == 0
    D, L, V, T = 768, 12, 50304, 1024
    step = (6 * (L * (12 * D * D + 13 * D) + D * V) + 12 * L * D * T) * 4 * 16 * T  # vanilla 12
    assert f"time, as set: {step:.3g} FLOPs a step" in capsys.readouterr().out


def test_torchrun_prints_the_plan_once(capsys, monkeypatch):
    """Under torchrun every process reads the flags; rank 0 alone prints the plan."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank, printed in (("1", ""), ("0", "plan: classroom layout 2+4R2+2 scheme mesh, ")):
        monkeypatch.setenv("RANK", rank)
        assert train.main(["--plan=true"]) == 0
        assert capsys.readouterr().out[:44] == printed


@pytest.mark.parametrize("flags, message", [
    (["--plan_gpus=0"], "--plan_gpus=0 must be at least 1"),
    (["--gpu=v100"], "--gpu=v100 is not one of a100, h100; name one, or give --gpu_memory=GIB and --gpu_tflops=TFLOPS"),
    (["--gpu_tflops=0"], "--gpu_tflops=0.0 must be a finite number above 0"),
    (["--dtype=float16"], "--dtype=float16 is not supported; use auto, float32 or bfloat16"),
    (["--grad_accum=4", "--plan_gpus=8"],
     "--grad_accum=4 does not divide by the 8 GPU(s) planned for; use a multiple of 8, or another --plan_gpus"),
    (["--grad_accum=3", "--plan_gpus=2"],
     "--grad_accum=3 does not divide by the 2 GPU(s) planned for; use a multiple of 2, or another --plan_gpus")])
def test_plan_bad_input_is_one_line(flags, message, capsys):
    assert train.main(["--plan=true", *flags]) == 2
    assert capsys.readouterr().err == f"train.py: error: {message}\n"


def test_a_plan_of_an_hf_source_reads_its_config_alone_and_plans_the_preset_it_is(tmp_path, capsys):
    """--init_from=hf:PATH --plan=true loads no weights (Pythia-6.9b's: 27 GiB; here none are there): its
    config.json's model, looped, is planned as config/pythia-6.9b_mesh.json plans the preset."""
    (tmp_path / "config.json").write_text(
        '{"model_type": "gpt_neox", "hidden_size": 4096, "num_attention_heads": 32, '
        '"num_hidden_layers": 32, "vocab_size": 50432, "intermediate_size": 16384}')
    config = os.path.join(ROOT, "config", "pythia-6.9b_mesh.json")
    assert train.main([config, "--plan=true"]) == 0
    preset = capsys.readouterr().out.splitlines()
    assert train.main([config, "--plan=true", f"--init_from=hf:{tmp_path}"]) == 0
    looped = capsys.readouterr().out.splitlines()
    assert looped[0] == preset[0].replace("pythia-6.9b", f"hf:{tmp_path}")
    assert looped[1:] == preset[1:] and "4,642,246,686 params" in looped[0]


def test_a_gpu_not_listed_is_planned_from_the_memory_and_tflops_given(capsys):
    """--gpu=v100 is refused with "give --gpu_memory and --gpu_tflops": with both given, it is planned as given."""
    assert train.main(["--plan=true", "--gpu=v100", "--gpu_memory=32", "--gpu_tflops=125"]) == 0
    assert "GPU(s) of 32 GiB and 125 TFLOPS (as given)" in capsys.readouterr().out
    assert train.main(["--plan=true", "--gpu=v100", "--gpu_memory=32"]) == 2  # its TFLOPS unknown
    assert "--gpu=v100 is not one of a100, h100" in capsys.readouterr().err


def test_a_plan_says_as_given_when_the_memory_alone_is_given_and_fits_up_to_the_whole_gpu(capsys):
    """--gpu=h100 --gpu_memory=40: not an h100's 80 GiB, so "as given". A row fits up to the GPU's whole memory;
    the choice keeps HEADROOM free: 160m's DDP fits on an h100 but is not chosen."""
    assert train.main(["--plan=true", "--gpu=h100", "--gpu_memory=40"]) == 0
    assert "GPU(s) of 40 GiB and 989 TFLOPS (as given)" in capsys.readouterr().out
    assert train.main([os.path.join(ROOT, "config/pythia-160m_mesh.json"), "--plan=true", "--plan_gpus=8"]) == 0
    rows = {line[:18].strip(): line.split() for line in capsys.readouterr().out.splitlines()[2:6]}
    assert rows["DDP"][-1] == "yes" and rows["DDP + grad_ckpt"][-3:] == ["<-", "the", "choice"]


@pytest.mark.skipif(not hasattr(os, "sysconf"), reason="Windows has no cgroups")
def test_a_containers_memory_limit_is_the_memory_a_run_has(tmp_path, monkeypatch):
    """A container's cgroup limit (v2 memory.max, v1 memory.limit_in_bytes) below the machine's memory is what a
    run is checked against; "max" (v2), v1's huge number or a file that cannot be read is no limit. A process
    in a cgroup below the top (a Slurm job's, as /proc/self/cgroup names it) has the lowest limit on its way up."""
    machine = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    proc, limit = tmp_path / "cgroup", tmp_path / "memory.max"
    monkeypatch.setattr(plan, "CGROUP", (str(proc), str(tmp_path)))
    proc.write_text("0::/\n")
    for text, total in (("1048576\n", 1 << 20), ("max\n", machine), (f"{2**63 - 4096}\n", machine)):
        limit.write_text(text)
        assert plan.physical_memory() == total
    job = tmp_path / "system.slice" / "job_7"
    (job / "step_0").mkdir(parents=True)
    (job / "memory.max").write_text("2097152\n")
    (job / "step_0" / "memory.max").write_text("max\n")
    proc.write_text("0::/system.slice/job_7/step_0\n")
    assert plan.physical_memory() == 2 << 20
    (tmp_path / "memory" / "job_7").mkdir(parents=True)  # cgroup v1's memory controller; others left out
    (tmp_path / "memory" / "job_7" / "memory.limit_in_bytes").write_text("3145728\n")
    (tmp_path / "cpu" / "job_7").mkdir(parents=True)
    (tmp_path / "cpu" / "job_7" / "memory.limit_in_bytes").write_text("1024\n")
    proc.write_text("4:memory:/job_7\n3:cpu,cpuacct:/job_7\n1:name=systemd:/\n")
    assert plan.physical_memory() == 3 << 20
    proc.unlink()  # no /proc (macOS): no cgroups, the machine's memory
    assert plan.physical_memory() == machine
    proc.write_text("0::/\n")
    with monkeypatch.context() as m:  # a limit file this process may not read: the machine's memory
        read, denied = plan.Path.read_text, (_ for _ in ()).throw
        m.setattr(plan.Path, "read_text", lambda self: read(self) if self == proc else denied(PermissionError(13, "")))
        assert plan.physical_memory() == machine
    cfg = Config(vocab_size=64, block_size=16, n_embd=32, n_head=2, layout="1+2R3+1", scheme="mesh")
    limit.write_text("1048576")
    with pytest.raises(configurator.UsageError, match=r"GiB, more than the 0\.0 GiB of this machine; "):
        plan.check_fits(cfg, 64, "cpu")


def test_torchrun_processes_on_a_cpu_share_its_memory(monkeypatch):
    """Under torchrun on a CPU every process of a machine (LOCAL_WORLD_SIZE) holds its own model in that machine's
    memory: a run fits where all of them do. On CUDA each process has its own GPU."""
    from types import SimpleNamespace
    cfg = Config(vocab_size=64, block_size=16, n_embd=32, n_head=2, layout="1+2R3+1", scheme="mesh")
    tc = SimpleNamespace(batch_size=4, fsdp=False, grad_checkpoint=False, n_slots=None, init_from="scratch")
    need = plan.memory(cfg, 4, 4, False, False, 4)["total"]
    monkeypatch.setattr(plan, "physical_memory", lambda: 2 * need)
    cpu = SimpleNamespace(name="cpu", dtype="float32")
    assert plan.check_run(cfg, tc, cpu, 4) is cfg  # one process a machine (four machines)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert plan.device_memory("cpu") == (2 * need // 4, "this machine per process (4 share it)")
    with pytest.raises(configurator.UsageError, match=r"more than the 0\.0 GiB of this machine per process "
                                                      r"\(4 share it\); use smaller settings"):
        plan.check_run(cfg, tc, cpu, 4)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(total_memory=need))
    assert plan.device_memory("cuda:3") == (need, "cuda:3")
    monkeypatch.setattr(plan, "physical_memory", lambda: None)  # unknown: no check, for any number of processes
    assert plan.device_memory("cpu") == (None, "this machine")


def test_a_runs_check_counts_its_dtype_processes_and_spread(monkeypatch):
    """check_run refuses a run at memory()'s total for its compute dtype, its world and its spread, not a byte
    sooner; a --n_slots a resumed base run carries is kept, not refused."""
    from types import SimpleNamespace
    cfg = Config(vocab_size=64, block_size=16, n_embd=32, n_head=2, layout="1+2R3+1", scheme="mesh")
    tc = SimpleNamespace(batch_size=4, fsdp=True, grad_checkpoint=False, n_slots=None, init_from="scratch")
    need = plan.memory(cfg, 4, 4, True, False, 2)["total"]
    bf16 = SimpleNamespace(name="cpu", dtype="bfloat16")
    monkeypatch.setattr(plan, "physical_memory", lambda: need)
    assert plan.check_run(cfg, tc, bf16, 4) is cfg
    monkeypatch.setattr(plan, "physical_memory", lambda: need - 1)
    with pytest.raises(configurator.UsageError, match=r"^the run \(layout 1\+2R3\+1, n_embd 32, "):
        plan.check_run(cfg, tc, bf16, 4)
    base = Config(vocab_size=64, block_size=16, n_embd=32, n_head=2, layout="1+2R3+1", scheme="base")
    monkeypatch.setattr(plan, "physical_memory", lambda: None)
    resumed = SimpleNamespace(batch_size=4, fsdp=False, grad_checkpoint=False, n_slots=5, init_from="resume")
    assert plan.check_run(base, resumed, bf16, 1) is base


# -----------------------------------------------------------------------------
# config/: every variant of the paper's Table 1 at every Pythia size, on one recipe

# The paper's layouts by size (Section 4, Table 1); 2.8b and 6.9b keep about two thirds of vanilla's blocks too
LAYOUTS = {"pythia-160m": ["2+4R2+2"], "pythia-410m": ["4+8R2+4", "3+6R3+3"], "pythia-1b": ["3+5R2+3"],
           "pythia-1.4b": ["4+8R2+4"], "pythia-2.8b": ["5+11R2+5"], "pythia-6.9b": ["5+11R2+5"]}
# vanilla's non-embedding parameters (Pythia's own counts)
VANILLA = {"pythia-160m": 85_056_000, "pythia-410m": 302_311_424, "pythia-1b": 805_736_448,
           "pythia-1.4b": 1_208_602_624, "pythia-2.8b": 2_517_652_480, "pythia-6.9b": 6_444_163_072}
# Appendix B: 512 sequences of 4096 tokens a step, 119,209 steps (250B tokens) of the Pile once, in order
RECIPE = dict(block_size=4096, dataset="data/pile/document", data_order="sequential", max_iters=119209,
              weight_decay=0.01, beta1=0.9, beta2=0.95, grad_clip=1.0, min_lr=None, warmup_iters=None,
              lr_decay_iters=None, eval_interval=1000, eval_iters=100, log_interval=10, dtype="bfloat16",
              compile=True, keep_every=10000, seed=1337, sample_tokens=0, init_from="scratch", data_root="data",
              epochs=1, n_slots=None, cycle=None, router_init=None, slot0=None, n_embd=None, n_head=None,
              dropout=None)


def pythia_configs():
    """{file name: its TrainConfig} of every config/pythia-*.json."""
    folder = os.path.join(ROOT, "config")
    return {name: train.TrainConfig(**configurator.parse_flags(
        train.TrainConfig, [os.path.join(folder, name)], "train.py", read_config=plain.read_config))
        for name in listed(folder) if name.startswith("pythia-")}


def test_every_table1_variant_at_every_size_is_a_config_on_one_recipe():
    """vanilla, base, anchor and mesh for each of the paper's layouts at each size, named for it; every setting
    the recipe's, the peak learning rate Pythia's for its size, 512 x 4096 tokens a step."""
    configs = pythia_configs()
    expected = {}
    for model, layouts in LAYOUTS.items():
        expected[f"{model}_vanilla.json"] = (model, str(PRESETS[model]["n_layer"]), "base")
        for i, layout in enumerate(layouts):
            for scheme in ("base", "anchor", "mesh"):
                expected[f"{model}_{layout + '_' if i else ''}{scheme}.json"] = (model, layout, scheme)
    assert sorted(configs) == sorted(expected)
    for name, tc in configs.items():
        assert (tc.model, tc.layout, tc.scheme) == expected[name], name
        assert {k: getattr(tc, k) for k in RECIPE} == RECIPE, name
        assert tc.lr == PRESETS[tc.model]["lr"] and tc.batch_size * tc.grad_accum == 512, name
        assert tc.out_dir == "out-" + name[:-len(".json")].replace("_", "-"), name


def test_every_layout_keeps_the_vanilla_depth_and_its_share_of_the_parameters():
    """Each recursive layout applies as many blocks as vanilla has (the same compute depth) from fewer unique ones:
    about two thirds of vanilla's non-embedding parameters (11 of 16 blocks at 1b, 21 of 32 at 2.8b and 6.9b),
    half for 3+6R3+3; plus the final LayerNorm and, for MeSH, its routers ((K+1) x 2 x (D B + B), Table 5)."""
    for name, tc in pythia_configs().items():
        cfg = train.model_config(tc, vocab_size=None)
        D, depth, unique = cfg.n_embd, PRESETS[tc.model]["n_layer"], cfg.shape.unique
        non_embedding = plan.param_counts(cfg)[0] - 2 * cfg.vocab_size * D
        routers = (cfg.n_steps + 1) * 2 * (D * cfg.slots + cfg.slots) if tc.scheme == "mesh" else 0
        assert cfg.shape.depth == depth, name
        assert non_embedding == (VANILLA[tc.model] - 2 * D) // depth * unique + 2 * D + routers, name
        share = 1 if name.endswith("_vanilla.json") else 1 / 2 if tc.layout == "3+6R3+3" else 2 / 3
        assert unique / depth == pytest.approx(share, abs=0.025), name


def test_every_config_spreads_as_its_plan_chooses():
    """Each config/ file's fsdp and grad_checkpoint are its plan's choice on 8 h100s: DDP unless the model's state
    needs sharding, activations recomputed only where they do not fit in 80% of the memory. 160m's 76.7 GiB
    without recomputing is too close to 80; 1.4b's mesh, at 63.0, is not."""
    folder = os.path.join(ROOT, "config")
    chosen = {}
    for name in listed(folder):
        tc = train.TrainConfig(**configurator.parse_flags(train.TrainConfig, [os.path.join(folder, name)], "train.py",
                                                          read_config=plain.read_config))
        cfg = train.model_config(tc, vocab_size=None)
        spread = choose(cfg, tc.batch_size, 8, 80, 4 if tc.dtype == "float32" else 2)
        assert (tc.fsdp, tc.grad_checkpoint) == spread[1:], name
        chosen[name] = spread[0]
    assert chosen["pythia-160m_mesh.json"] == "DDP + grad_ckpt" and chosen["pythia-1.4b_mesh.json"] == "DDP"
    assert chosen["pythia-6.9b_mesh.json"] == "FSDP" and chosen["classroom.json"] == "DDP"
