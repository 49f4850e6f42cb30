"""
The CUDA tier: what only a GPU can show (CUDA kernels, bf16 autocast as CUDA does it, NCCL, compiled
kernels from Triton). Every test here skips, with the reason, where CUDA is missing; tools/gpu_check.py
runs this tier on a machine that has it.

    CUBLAS_WORKSPACE_CONFIG=:4096:8 python -m pytest -q tests/test_cuda.py -rs

cuBLAS reads CUBLAS_WORKSPACE_CONFIG once, when this process first uses it, so the bit-for-bit
resume test needs it set before the process starts (tools/gpu_check.py sets it for the tier);
without it that test skips, saying so. The tests run in this file's order in one process: none
changes a global setting that a later one depends on (deterministic algorithms are switched back
off).

Tolerances: float32 results on the GPU equal the CPU's to 1e-4 relative (||gpu - cpu|| / ||cpu||), the
kernels differ in summation order (matmul in TF32 is off: PyTorch's default for float32 matmuls).
"""

import os
import re
import subprocess
import sys

import pytest
import torch

from tools import bench
from support.capture import capture
import mesh
import train
from tests.models import CASES, IDS, build, small, tokens
from conftest import HANG, ROOT, TINY, losses

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")
CUDA_TINY = [f for f in TINY if not f.startswith("--batch_size")] + ["--batch_size=8", "--device=cuda"]


def relative(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("scheme, layout", CASES, ids=IDS)
def test_gpu_float32_equals_cpu(scheme, layout):
    cpu = build(small(scheme, layout), scramble=True).train()
    gpu = build(small(scheme, layout), scramble=True).train().cuda()
    idx, targets = tokens(), tokens(seed=2)
    results = []
    for model, device in ((cpu, "cpu"), (gpu, "cuda")):
        logits, loss = model(idx.to(device), targets.to(device))
        loss.backward()
        results.append([logits, loss] + [p.grad for p in model.parameters()])
    names = ["logits", "loss"] + [n for n, _ in cpu.named_parameters()]
    for name, a, b in zip(names, results[1], results[0], strict=True):
        assert relative(a.cpu(), b) < 1e-4, name


@pytest.mark.parametrize("scheme", mesh.SCHEMES)
def test_a_bf16_step_is_finite_and_the_state_stays_float32(scheme):
    """Under CUDA's bf16 autocast the matmuls run in bf16, while the states passed between steps (for mesh: read
    from its buffer) stay float32, as the residual stream does; the loss, every gradient and AdamW's step are finite."""
    model = build(small(scheme, "1+2R2+1"), scramble=True).train().cuda()
    opt = model.configure_optimizer(0.01, 1e-3, device_type="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        with capture(model) as cap:
            logits, loss = model(tokens().cuda(), tokens(seed=2).cuda())
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32 and torch.isfinite(loss)
    assert {name: h.dtype for name, h in cap["states"] if name != "h_emb"} == \
        {name: torch.float32 for name, _ in cap["states"] if name != "h_emb"}
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    opt.step()
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize("scheme, layout", CASES, ids=IDS)
def test_kv_cache_decoding_equals_full_recompute_on_cuda(scheme, layout):
    model = build(small(scheme, layout, block_size=16), scramble=True).cuda()
    idx = tokens(2, 10).cuda()
    with_cache = model.generate(idx, 20, temperature=0, use_cache=True)  # past block_size: prefilled again
    assert torch.equal(with_cache, model.generate(idx, 20, temperature=0, use_cache=False))


@pytest.mark.parametrize("scheme", ["base", "mesh"])
def test_compiled_trains_and_decodes_without_recompiles(scheme):
    """torch.compile (inductor, Triton kernels): train steps and cached decoding build their graphs
    (3) once; further steps and a longer decode build none. base and mesh are the loop's two code
    paths; residual, anchor and anchor_emb are base plus one addition (mesh.SCHEMES), run on the
    GPU by the tests above, and compiling them too would cost the GPU check 9 more graphs."""
    torch._dynamo.reset()
    model = build(small(scheme, "1+2R2+1"), scramble=True).train().cuda()
    model.compile()
    opt = model.configure_optimizer(0.01, 1e-3, device_type="cuda")
    idx, targets = tokens().cuda(), tokens(seed=2).cuda()
    for _ in range(2):  # warm-up: the train step's graphs
        model(idx, targets)[1].backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    model.eval().generate(idx[:1, :4], 3, temperature=0)  # and decoding's: a prefill and a one-token step
    built = bench.graphs()
    model.train()
    for _ in range(3):
        model(idx, targets)[1].backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    model.eval().generate(idx[:1, :4], 12, temperature=0)
    assert bench.graphs() == built


def test_train_py_on_cuda_bf16_compiled_resumes_bit_for_bit(data_root, tmp_path):
    """A short train.py run on the GPU (bf16 autocast, compiled, fused AdamW) and the same run stopped halfway and
    resumed: the same losses, bit for bit (deterministic kernels, as a resume's promise needs)."""
    if os.environ.get("CUBLAS_WORKSPACE_CONFIG") not in (":4096:8", ":16:8"):
        pytest.skip("deterministic cuBLAS needs CUBLAS_WORKSPACE_CONFIG=:4096:8 set before this "
                    "process starts (cuBLAS reads it once); tools/gpu_check.py sets it there")
    torch.use_deterministic_algorithms(True)
    try:
        flags = [*CUDA_TINY, f"--data_root={data_root}", "--dtype=bfloat16", "--compile=true", "--eval_interval=3",
                 "--lr_decay_iters=6"]
        assert train.main([*flags, f"--out_dir={tmp_path / 'a'}", "--max_iters=6"]) == 0
        assert train.main([*flags, f"--out_dir={tmp_path / 'b'}", "--max_iters=3"]) == 0
        assert train.main(["--init_from=resume", f"--out_dir={tmp_path / 'b'}", "--max_iters=6"]) == 0
    finally:
        torch.use_deterministic_algorithms(False)
    assert losses(tmp_path / "a") == losses(tmp_path / "b")
    ckpt = torch.load(tmp_path / "a" / "ckpt.pt", weights_only=True)
    assert ckpt["train_config"]["dtype"] == "bfloat16" 


def test_train_py_logs_an_mfu_below_100_percent(data_root, tmp_path, capsys):
    """log.jsonl holds each logged step's MFU at full precision (the tiny model's, far under 0.1%,
    prints as 0.0%): above 0 and below 1; the printed one is it, rounded."""
    if machine_peak() is None:
        pytest.skip(f"{torch.cuda.get_device_name()} is not in machine.PEAK_BF16_FLOPS: no MFU is quoted for it")
    assert train.main([*CUDA_TINY, f"--data_root={data_root}", "--dtype=bfloat16", f"--out_dir={tmp_path / 'o'}",
                       "--max_iters=4", "--eval_interval=4"]) == 0
    mfus = [m for _, m in losses(tmp_path / "o", key="mfu")]
    assert len(mfus) == 4 and all(0 < m < 1 for m in mfus), mfus
    printed = re.findall(r"mfu ([0-9.]+)%", capsys.readouterr().out)
    assert printed == [f"{100 * m:.1f}" for m in mfus]


def machine_peak():
    from support import device as machine
    return machine.peak_bf16_flops("cuda:0", "bfloat16")


@pytest.mark.parametrize("fsdp", [False, True], ids=["ddp", "fsdp"])
def test_torchrun_on_one_gpu_with_nccl_and_a_checkpoint_sample_py_reads(fsdp, data_root, tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
           os.path.join(ROOT, "train.py"), *CUDA_TINY, f"--data_root={data_root}", f"--out_dir={out}",
           "--max_iters=4", "--eval_interval=2", f"--fsdp={fsdp}"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=HANG)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"device cuda:0 bfloat16, 1 process(es){' (FSDP)' if fsdp else ''}" in r.stdout
    if fsdp:  # the sharded checkpoint, consolidated for sample.py
        r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "consolidate.py"), f"--out_dir={out}"], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run([sys.executable, os.path.join(ROOT, "sample.py"), f"--out_dir={out}", "--start=Then",
                        "--max_new_tokens=10", "--device=cuda"], capture_output=True, text=True, timeout=HANG)
    assert r.returncode == 0 and r.stdout.startswith("Then"), r.stderr[-3000:]
