"""
Small models the model's tests and the CUDA tier share (test_mesh.py, tests/test_cuda.py): every
scheme's case, a small Config, a built model (scrambled so that equalities mean something), tokens.
"""

import torch

import mesh
from mesh import Config, RecursiveGPT

V = 67  # small vocabulary, not a power of two on purpose

# (scheme, layout): every scheme of mesh.SCHEMES on a looped layout, base also on a vanilla one and mesh also
# on mixed shared / unshared steps (two cores).
CASES = [("base", "4")] + [(s, "1+2R2+1") for s in mesh.SCHEMES] + [("mesh", "1+1+1R2+1")]
IDS = [f"{s}-{l}" for s, l in CASES]


def small(scheme="mesh", layout="1+2R2+1", **kw):
    return Config(**{**dict(vocab_size=V, block_size=32, n_embd=64, n_head=4, layout=layout, scheme=scheme), **kw})


def build(cfg, seed=0, scramble=False):
    """A model in eval mode. scramble: replace the (near-uniform) init with larger random weights, so
    logits depend strongly on context and routers route unevenly: equalities then mean something."""
    torch.manual_seed(seed)
    model = RecursiveGPT(cfg).eval()
    if scramble:
        with torch.no_grad():
            for name, p in model.named_parameters():
                noise = 0.1 * torch.randn_like(p)
                p.copy_(1 + noise if ".ln_" in f".{name}" and name.endswith("weight") else noise)
    return model


def tokens(B=2, T=32, seed=1):
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))
