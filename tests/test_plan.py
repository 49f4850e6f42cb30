"""
The memory plan (plan.py, `train.py --plan=true`): its activation formula against measured peak memory,
and the plan's table.

    python -m pytest tests/test_plan.py -q --all  # --all: its slow-marked tests too
"""

import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from tools import bench
import configurator
from support import device as plan, files as plain
import train
from mesh import Config, RecursiveGPT

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


@pytest.mark.slow
def test_plan_prints_the_table_and_allocates_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    assert train.main([os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "config/pythia-6.9b_mesh.json"),
                       "--plan=true", "--plan_gpus=8", "--gpu_memory=80", f"--out_dir={out}"]) == 0
    text = capsys.readouterr().out
    rows = {line[:18].strip(): line.split() for line in text.splitlines()[2:6]}
    assert "pythia-6.9b layout 5+11R2+5 scheme mesh" in text and "8 GPU(s) of 80 GiB" in text
    assert rows["DDP"][-1] == "no" and rows["FSDP + grad_ckpt"][-1] == "yes"  # 6.9B needs FSDP on 80 GB
    assert float(rows["DDP"][1]) == pytest.approx(8 * float(rows["FSDP"][1]), rel=0.01)  # weights / 8
    assert not out.exists()


def test_plan_bad_input_is_one_line(capsys):
    assert train.main(["--plan=true", "--plan_gpus=0"]) == 2
    assert "--plan_gpus=0 must be at least 1" in capsys.readouterr().err


@pytest.mark.slow
def test_every_shipped_config_fits_8_gpus_of_80_gib_as_it_is_set():
    """Each config/ file's own choice (DDP or --fsdp, with or without --grad_checkpoint) fits its plan on one
    node of 8 x 80 GiB, and one that DDP cannot fit sets fsdp: 6.9B does."""
    folder = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "config")
    sharded = []
    for name in sorted(os.listdir(folder)):
        given = configurator.parse_flags(train.TrainConfig, [os.path.join(folder, name)], "train.py",
                                         read_config=plain.read_config)
        tc = train.TrainConfig(**given)
        cfg = train.model_config(tc, vocab_size=None)
        own = plan.memory(cfg, tc.batch_size, 8, tc.fsdp, tc.grad_checkpoint, 4 if tc.dtype == "float32" else 2)
        ddp = plan.memory(cfg, tc.batch_size, 8, False, tc.grad_checkpoint, 4 if tc.dtype == "float32" else 2)
        assert own["total"] <= 80 * plan.GiB, name
        assert tc.fsdp == (ddp["total"] > 80 * plan.GiB), name
        sharded += [name] if tc.fsdp else []
    assert sharded == ["pythia-6.9b_mesh.json"]
