"""
nanoMeSH: the whole model in one file.

MeSH (Memory-as-State-Highways for Recursive Transformers, Yu et al., arXiv
2510.07739) on a GPT-NeoX / Pythia backbone. A recursive transformer runs a
prelude, then one weight-shared core several times (the loop steps), then a
coda. How the hidden state travels from step to step is the "scheme":

    base        h(t+1) = f_t(h(t))
    residual    h(t+1) = f_t(h(t)) + h(t)
    anchor      h(t+1) = f_t(h(t)) + h(0)
    anchor_emb  h(t+1) = f_t(h(t)) + h_emb           (the paper's anchor*)
    mesh        a B-slot memory buffer with per-step write/read routers (Eq. 2-5)

Read top to bottom: Config and layouts, the GPT-NeoX Block, the Router and
buffer, the loss, the model (forward = the paper's Eq. 2-5), init, optimizer, KV cache and
generation, checkpoints, and a summary command:

    python mesh.py --model pythia-1.4b --layout 4+8R2+4 --scheme mesh

prints the paper's Table 5 numbers for any preset without allocating weights.
"""

import argparse
import difflib
import functools
import json
import math
import os
import re
import uuid
from dataclasses import asdict, dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

SCHEMES = ("base", "residual", "anchor", "anchor_emb", "mesh")

# Pythia shapes: width, heads, vanilla depth, peak LR, padded vocabulary.
PRESETS = {
    "pythia-14m": dict(n_embd=128, n_head=4, n_layer=6, lr=1e-3),
    "pythia-31m": dict(n_embd=256, n_head=8, n_layer=6, lr=1e-3),
    "pythia-70m": dict(n_embd=512, n_head=8, n_layer=6, lr=1e-3),
    "pythia-160m": dict(n_embd=768, n_head=12, n_layer=12, lr=6e-4),
    "pythia-410m": dict(n_embd=1024, n_head=16, n_layer=24, lr=3e-4),
    "pythia-1b": dict(n_embd=2048, n_head=8, n_layer=16, lr=2.5e-4),
    "pythia-1.4b": dict(n_embd=2048, n_head=16, n_layer=24, lr=2e-4),
    "pythia-2.8b": dict(n_embd=2560, n_head=32, n_layer=32, lr=1.6e-4),
    "pythia-6.9b": dict(n_embd=4096, n_head=32, n_layer=32, lr=1.2e-4, vocab_size=50432),
    "pythia-12b": dict(n_embd=5120, n_head=40, n_layer=36, lr=1.2e-4, vocab_size=50688),
    # Trains on a laptop CPU in minutes: 12 layers of compute, 8 unique.
    "classroom": dict(n_embd=128, n_head=4, layout="2+4R2+2", scheme="mesh", block_size=64,
                      vocab_size=65, lr=1e-3),
}


def closest(name, options):
    """' (did you mean X?)' for the nearest valid name, or '' when none is close."""
    match = difflib.get_close_matches(str(name), list(options), n=1, cutoff=0.5)
    return f" (did you mean {match[0]!r}?)" if match else ""


# -----------------------------------------------------------------------------
# Layouts (SPEC section 2): "P+CRN+Q", "24", "4+8+8+4"

LAYOUT_FORM = "'+'-separated block counts such as '24', '4+8R2+4' or '4+8+8+4'"


@dataclass(frozen=True)
class Layout:
    prelude: int   # blocks in f_pre
    cores: tuple   # block count of each unique core
    schedule: tuple  # for each loop step t, the index of the core it runs
    coda: int      # blocks in f_coda

    @property
    def depth(self):  # compute depth: blocks applied per forward (unrolled)
        return self.prelude + sum(self.cores[c] for c in self.schedule) + self.coda

    @property
    def unique(self):  # blocks that own parameters
        return self.prelude + sum(self.cores) + self.coda


def parse_layout(text):
    """'4+8R2+4' -> Layout(4, (8,), (0, 0), 4); '24' -> Layout(24, (), (), 0).

    The first segment is the prelude, the last the coda; each middle segment is
    'C' (one step with its own C blocks) or 'CRN' (N steps sharing one core)."""
    bad = f"bad layout {text!r}: expected {LAYOUT_FORM}"
    segments = str(text).split("+")
    if not all(segments):
        raise ValueError(f"{bad} (empty segment)")
    if len(segments) == 1:
        if not segments[0].isdigit() or int(segments[0]) < 1:
            raise ValueError(f"{bad} (a vanilla layout is one positive block count)")
        return Layout(int(segments[0]), (), (), 0)
    ends = (segments[0], segments[-1])
    if not all(s.isdigit() for s in ends):
        raise ValueError(f"{bad} (prelude and coda are plain block counts, got {ends[0]!r}, {ends[1]!r})")
    cores, schedule = [], []
    for seg in segments[1:-1]:
        m = re.fullmatch(r"(\d+)(?:R(\d+))?", seg)
        if not m:
            raise ValueError(f"{bad} (segment {seg!r} is not 'C' or 'CRN')")
        size, repeats = int(m[1]), int(m[2] or 1)
        if size < 1 or repeats < 1:
            raise ValueError(f"{bad} (segment {seg!r} needs at least one block and one step)")
        schedule += [len(cores)] * repeats
        cores.append(size)
    layout = Layout(int(ends[0]), tuple(cores), tuple(schedule), int(ends[1]))
    if layout.depth < 1:
        raise ValueError(f"{bad} (no blocks)")
    return layout


# -----------------------------------------------------------------------------
# Config

@dataclass
class Config:
    vocab_size: int = 50304      # GPT-2's 50257 padded to a multiple of 64
    block_size: int = 2048       # context length
    n_embd: int = 768
    n_head: int = 12
    layout: str = "12"           # SPEC section 2
    scheme: str = "base"         # one of SCHEMES
    n_slots: int | None = None   # MeSH buffer slots B; None means K+3 (Appendix E.1)
    rotary_pct: float = 0.25     # fraction of each head's dims that get rotary
    rotary_base: float = 10000.0
    parallel_residual: bool = True   # GPT-NeoX: x + attn(ln_1 x) + mlp(ln_2 x)
    scale_embeddings: bool = True    # h_emb = wte(idx) * sqrt(D) (Appendix B); off for real Pythia weights
    dropout: float = 0.0

    def __post_init__(self):
        self.layout = str(self.layout)
        self.shape = parse_layout(self.layout)  # not a field: derived, not saved
        if self.scheme not in SCHEMES:
            raise ValueError(f"unknown scheme {self.scheme!r}{closest(self.scheme, SCHEMES)}; "
                             f"expected one of {', '.join(SCHEMES)}")
        if self.scheme != "base" and not self.shape.schedule:
            raise ValueError(f"scheme {self.scheme!r} needs loop steps, but layout {self.layout!r} has "
                             f"none; use a layout like '2+4R2+2' or scheme 'base'")
        if self.n_slots is not None and self.n_slots < 1:
            raise ValueError(f"n_slots={self.n_slots} must be at least 1 (or None for K+3)")
        for name in ("vocab_size", "block_size", "n_embd", "n_head"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be a positive integer")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}; "
                             f"pick n_head among the divisors of n_embd")
        if not 0.0 <= self.rotary_pct <= 1.0:
            raise ValueError(f"rotary_pct={self.rotary_pct} must be in [0, 1] (the share of each head that rotary "
                             f"rotates; GPT-NeoX uses 0.25)")
        if self.rotary_dims % 2:
            raise ValueError(f"rotary dims = int(head_dim {self.head_dim} x rotary_pct {self.rotary_pct}) "
                             f"= {self.rotary_dims} must be even; adjust rotary_pct or n_head")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout={self.dropout} must be in [0, 1)")

    @property
    def head_dim(self):
        return self.n_embd // self.n_head

    @property
    def rotary_dims(self):
        return int(self.head_dim * self.rotary_pct)

    @property
    def n_steps(self):  # K
        return len(self.shape.schedule)

    @property
    def slots(self):  # B, resolved
        return self.n_slots if self.n_slots is not None else self.n_steps + 3

    def to_dict(self):
        return asdict(self)  # plain data, saved with every checkpoint

    @classmethod
    def from_dict(cls, d):
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown config field(s) {', '.join(unknown)}; expected {', '.join(sorted(names))}")
        return cls(**d)

    @classmethod
    def from_preset(cls, name, **overrides):
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}{closest(name, PRESETS)}; expected one of {', '.join(PRESETS)}")
        p = {k: v for k, v in PRESETS[name].items() if k != "lr"}
        p.setdefault("layout", str(p.pop("n_layer", 0)))
        p.update({k: v for k, v in overrides.items() if v is not None})
        return cls.from_dict(p)


# -----------------------------------------------------------------------------
# The GPT-NeoX block

class Rotary(nn.Module):
    """NeoX rotary embedding on the first rotary_dims of each head; one table for the whole model.

    NeoX rotates x = (x1, x2, x_pass) to (x1, x2) * cos + (-x2, x1) * sin and leaves x_pass alone.
    Here that is one formula over the whole head, x * cos + (x @ R) * sin, with cos = 1 and sin = 0
    on the pass-through dims and R the signed permutation (x1, x2, x_pass) @ R = (-x2, x1, 0): no
    split, no concatenation (each one a copy, forward and backward), and exact, since every output
    of x @ R is one input times +-1. The model looks up cos and sin once per forward for its positions
    and every block uses them."""

    def __init__(self, cfg):
        super().__init__()
        hd, rot = cfg.head_dim, cfg.rotary_dims
        inv_freq = 1.0 / (cfg.rotary_base ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot))
        freqs = torch.outer(torch.arange(cfg.block_size, dtype=torch.float32), inv_freq)  # (L, rot/2)
        freqs = torch.cat((freqs, freqs), dim=-1)                                          # (L, rot)
        pad = torch.zeros(cfg.block_size, hd - rot)
        half = torch.arange(rot // 2)
        R = torch.zeros(hd, hd)
        R[half + rot // 2, half] = -1.0   # output j < rot/2 is -x2[j]
        R[half, half + rot // 2] = 1.0    # output rot/2 + j is x1[j]
        # derived from the config, so not saved (persistent=False)
        self.register_buffer("cos", torch.cat((freqs.cos(), pad + 1), dim=-1), persistent=False)  # (L, hd)
        self.register_buffer("sin", torch.cat((freqs.sin(), pad), dim=-1), persistent=False)      # (L, hd)
        self.register_buffer("R", R, persistent=False)                                            # (hd, hd)

    def forward(self, T, pos=None, dtype=torch.float32):
        """Tables for positions pos (T,), or 0..T-1 when pos is None, in dtype, the dtype q and k are
        computed in (RecursiveGPT.compute_dtype: cast here once per forward, not in every block)
        -> (cos, sin, R)."""
        cos, sin = (self.cos[:T], self.sin[:T]) if pos is None else (self.cos[pos], self.sin[pos])
        return cos.to(dtype), sin.to(dtype), self.R.to(dtype)   # (T, hd), (T, hd), (hd, hd)


class Linear(nn.Linear):
    """nn.Linear, except that under torch.compile the bias is a separate add. Inductor then fuses that add
    into the elementwise kernel that follows (rotary, GELU, the residual sum), where an addmm would first
    copy the bias into every row of its output, one more pass over it (Inductor makes this split itself
    on GPUs, not on CPU). Uncompiled, F.linear's addmm stays: there a separate add would be one more
    operator and pass of its own. The bias is cast to the product's dtype, as addmm does under
    autocast."""

    def forward(self, x):
        if self.bias is None or not torch.compiler.is_compiling():
            return super().forward(x)
        y = x @ self.weight.t()                 # (..., out_features)
        return y + self.bias.to(y.dtype)


class Attention(nn.Module):
    """Causal self-attention with a fused QKV and rotary positions (see Rotary)."""

    def __init__(self, cfg):
        super().__init__()
        self.n_head, self.head_dim, self.dropout = cfg.n_head, cfg.head_dim, cfg.dropout
        self.qkv = Linear(cfg.n_embd, 3 * cfg.n_embd)   # rows: [q | k | v], each head-major
        self.proj = Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x, rope, cache=None, layer=0):
        return self.attend(self.qkv(x), rope, cache, layer)

    def attend(self, qkv, rope, cache=None, layer=0):
        """forward after the projection: qkv (B, T, 3D) is self.qkv(x), or Block's decoding path's fused one."""
        B, T, C = qkv.size(0), qkv.size(1), self.n_head * self.head_dim
        cos, sin, R = rope
        qkv = qkv.view(B, T, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4)  # (3, B, H, T, hd)
        qk, v = qkv.split((2, 1))               # split, not indexing: its backward is one cat, no zero-filling
        qk = qk * cos + (qk @ R) * sin          # rotary on q and k at once
        q, k = qk.unbind(0)                     # (B, H, T, hd) each
        v = v.squeeze(0)                        # (B, H, T, hd)
        drop = self.dropout if self.training else 0.0
        if cache is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=drop)   # (B, H, T, hd)
        else:  # keys/values of all earlier positions come from the cache; the mask hides the rest
            k, v = cache.update(layer, k, v)                                              # (B, H, L, hd)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=cache.attn_mask, dropout_p=drop)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.fc = Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.proj = Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x)))  # exact (erf) GELU, as GPT-NeoX


class Block(nn.Module):
    """GPT-NeoX block. block(x, rope) works on a full causal sequence x of shape (B, T, D), with rope
    = model.rotary(T) (cos, sin and R for its positions; under autocast pass dtype=its dtype)."""

    def __init__(self, cfg):
        super().__init__()
        self.parallel, self.dropout = cfg.parallel_residual, cfg.dropout
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=1e-5)
        self.attn = Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=1e-5)
        self.mlp = MLP(cfg)

    def drop(self, x):  # residual dropout; skipped outright at p = 0 (one call less per branch)
        return F.dropout(x, self.dropout, self.training) if self.dropout else x

    def forward(self, x, rope, cache=None, layer=0):
        if cache is not None and self.parallel:  # decoding: one LayerNorm and one matmul feed both branches
            D = x.size(-1)
            qkv, h = F.linear(F.layer_norm(x, (D,), eps=self.ln_1.eps), *cache.inputs[layer]).split((3 * D, 4 * D), -1)
            # qkv (B, T, 3D), h (B, T, 4D): the projections of the two-matmul path below
            return x + self.drop(self.attn.attend(qkv, rope, cache, layer)) + self.drop(self.mlp.proj(F.gelu(h)))
        a = self.drop(self.attn(self.ln_1(x), rope, cache, layer))
        if self.parallel:
            return x + a + self.drop(self.mlp(self.ln_2(x)))
        x = x + a
        return x + self.drop(self.mlp(self.ln_2(x)))

    @torch.no_grad()
    def fused_inputs(self, dtype):
        """(weight (7D, D), bias (7D,)) with qkv(ln_1(x)) | mlp.fc(ln_2(x)) = linear(normalize(x), weight, bias).

        With a parallel residual both branches read the same normalized x, each through its own LayerNorm
        affine, which folds into the matmul after it: (xn * g + b) W^T + c = xn (W * g)^T + (W b + c). One
        normalization and one matmul instead of two of each: KVCache makes these for decoding, where a token's
        time goes to per-operator overhead (README, Speed). Equal to the two-matmul path up to float rounding."""
        halves = [(lin.weight * ln.weight, lin.weight @ ln.bias + lin.bias)
                  for ln, lin in ((self.ln_1, self.attn.qkv), (self.ln_2, self.mlp.fc))]
        return tuple(torch.cat(parts).to(dtype) for parts in zip(*halves))


# -----------------------------------------------------------------------------
# MeSH routers and buffer

class Router(nn.Module):
    """One router pair (Eq. 3): per-token softmax weights over the B slots for writing and reading.
    The two Linears run as one matmul that puts the slots first, (2S, B*T): on CPU a softmax over a leading
    dimension is several times faster than over a last dimension of a few slots, and one matmul is half
    the operators of two, forward and backward (README, Speed)."""

    def __init__(self, n_embd, n_slots):
        super().__init__()
        self.write = Linear(n_embd, n_slots)
        self.read = Linear(n_embd, n_slots)

    def forward(self, h):  # h (B, T, D) -> w_write, w_read, each (B, T, S), rows sum to 1
        S, D = self.write.weight.shape
        weight = torch.cat([self.write.weight, self.read.weight])                 # (2S, D)
        bias = torch.cat([self.write.bias, self.read.bias]).unsqueeze(-1)         # (2S, 1)
        logits = torch.addmm(bias, weight, h.reshape(-1, D).t())                  # (2S, B*T)
        w = logits.view(2, S, -1).softmax(1).permute(2, 0, 1).contiguous()       # (B*T, 2, S)
        w = w.view(*h.shape[:-1], 2, S)                                           # (B, T, 2, S)
        return w[..., 0, :], w[..., 1, :]


def float32_under_autocast(op):
    """[choice] The buffer, and every state read from it, stays float32 under bf16 autocast, like the
    residual stream of the other schemes (there x + a bf16 branch output promotes to float32). Autocast
    would run the buffer's batched matmuls in bf16, round the buffer at every write and hand the cores a
    bf16 stream: less precise than the baselines it is compared with."""
    @functools.wraps(op)
    def run(*tensors):
        device = tensors[0].device.type
        if not torch.is_autocast_enabled(device):
            return op(*tensors)
        with torch.autocast(device, enabled=False):
            return op(*(t.float() for t in tensors))
    return run


# The buffer's per-token contractions over slots, as batched matmuls over the B*T tokens (no loop over slots).

def slot_mix(w, mem):  # w (B, T, S), mem (B, T, S, D) -> (B, T, D): sum_b w_b m_b, a (1 x S) @ (S x D) per token
    S, D = mem.shape[-2:]
    return torch.bmm(w.reshape(-1, 1, S), mem.reshape(-1, S, D)).view(*mem.shape[:-2], D)


def slot_dots(mem, x):  # mem (B, T, S, D), x (B, T, D) -> (B, T, S): m_b . x, a (1 x D) @ (D x S) per token
    S, D = mem.shape[-2:]
    return torch.bmm(x.reshape(-1, 1, D), mem.reshape(-1, S, D).transpose(1, 2)).view(mem.shape[:-1])


def outer(w, x):  # w (B, T, S), x (B, T, D) -> (B, T, S, D): w_b x for every slot b
    return w.unsqueeze(-1) * x.unsqueeze(-2)


@float32_under_autocast
def buffer_write(mem, w_write, h):
    """Eq. 5: m_b += w_write_b * h for every slot b at once, in one kernel. mem (B, T, S, D), w_write (B, T, S),
    h (B, T, D)."""
    return torch.addcmul(mem, w_write.unsqueeze(-1), h.unsqueeze(-2))


@float32_under_autocast
def buffer_read(mem, w_read):
    """h = sum_b w_read_b * m_b -> (B, T, D)."""
    return slot_mix(w_read, mem)


class BufferStart(torch.autograd.Function):
    """Eq. 2 and the transitional cycle: the buffer with slot 0 = h_emb and zeros elsewhere, h written into
    it (Eq. 5), and h(0) read from it. Forward returns (mem, h0) = (e_0 h_emb + w (x) h, r_0 h_emb + (r . w) h):
    the read needs no pass over the buffer, as only slot 0 held anything before the write. Backward, for
    the gradients G of mem (B, T, S, D) and g of h0 (B, T, D):
        d h_emb = G_0 + r_0 g          d h = sum_b w_b G_b + (r . w) g
        d w_b   = G_b . h + r_b (g . h)    d r_b = w_b (g . h) + [b = 0] (h_emb . g)
    two passes over the buffer-sized G, where autograd's graph of the same ops (F.pad, buffer_write,
    buffer_read) makes several more and keeps a buffer for backward (README, Speed); test_mesh.py checks
    both directions against that graph."""

    @staticmethod
    def forward(ctx, h_emb, w_write, w_read, h):
        mem = outer(w_write, h)                                                    # (B, T, S, D)
        mem[..., 0, :] += h_emb                                                    # slot 0 starts as h_emb
        rw = (w_read * w_write).sum(-1, keepdim=True)                              # (B, T, 1)
        h0 = torch.addcmul(w_read[..., :1] * h_emb, rw, h)                         # (B, T, D)
        ctx.save_for_backward(h_emb, w_write, w_read, h, rw)
        return mem, h0

    @staticmethod
    def backward(ctx, G, g):
        h_emb, w, r, h, rw = ctx.saved_tensors
        gh = (g * h).sum(-1, keepdim=True)                                         # (B, T, 1)
        d_h_emb = torch.addcmul(G[..., 0, :], r[..., :1], g)
        d_h = torch.addcmul(slot_mix(w, G), rw, g)
        d_w = torch.addcmul(slot_dots(G, h), r, gh)
        d_r = w * gh
        d_r[..., 0] += (h_emb * g).sum(-1)
        return d_h_emb, d_w, d_r, d_h


class BufferStep(torch.autograd.Function):
    """One loop step's write then read (Eq. 5): mem' = buffer_write(mem, w, h), h' = buffer_read(mem', r).
    Backward, for the gradients G of mem' and g of h': the buffer's gradient is G~ = G + r (x) g (the read
    adds r_b g to slot b), and then
        d mem = G~      d w_b = G~_b . h      d h = sum_b w_b G~_b      d r_b = m'_b . g
    one new buffer-sized tensor (G~) and three reads of one, where autograd's graph of the same ops writes
    two buffer gradients and their sum (checked against it in test_mesh.py)."""

    @staticmethod
    def forward(ctx, mem, w_write, w_read, h):
        mem = buffer_write(mem, w_write, h)                                        # (B, T, S, D)
        ctx.save_for_backward(mem, w_write, w_read, h)
        return mem, buffer_read(mem, w_read)

    @staticmethod
    def backward(ctx, G, g):
        mem, w, r, h = ctx.saved_tensors
        G = torch.addcmul(G, r.unsqueeze(-1), g.unsqueeze(-2))                    # (B, T, S, D)
        return G, slot_dots(G, h), slot_dots(mem, g), slot_mix(w, G)


class BufferFinalRead(torch.autograd.Function):
    """The last loop step's write then read, buffer_read(buffer_write(mem, w, h), r), without building the
    written buffer: nothing reads it again, so h' = sum_b r_b (m_b + w_b h) = sum_b r_b m_b + (r . w) h,
    one pass over the buffer. Backward, for the gradient g of h':
        d mem = r (x) g      d w_b = r_b (g . h)      d r_b = m_b . g + w_b (g . h)      d h = (r . w) g"""

    @staticmethod
    def forward(ctx, mem, w_write, w_read, h):
        rw = (w_read * w_write).sum(-1, keepdim=True)                             # (B, T, 1)
        ctx.save_for_backward(mem, w_write, w_read, h, rw)
        return torch.addcmul(slot_mix(w_read, mem), rw, h)                        # (B, T, D)

    @staticmethod
    def backward(ctx, g):
        mem, w, r, h, rw = ctx.saved_tensors
        gh = (g * h).sum(-1, keepdim=True)                                         # (B, T, 1)
        return outer(r, g), r * gh, torch.addcmul(slot_dots(mem, g), w, gh), rw * g


class NoGraph:
    """Stands in for autograd's ctx where autograd records nothing (run_function)."""

    @staticmethod
    def save_for_backward(*tensors):
        pass


def run_function(fn, *tensors):
    """fn.apply(*tensors); where autograd records nothing (generate runs under inference_mode), fn's forward
    alone: Function.apply's own bookkeeping costs more than the few small ops of a one-token step."""
    if torch.is_grad_enabled():
        return fn.apply(*tensors)
    return fn.forward(NoGraph, *tensors)


# The model calls the three through these: float32 under autocast, like buffer_write and buffer_read.

@float32_under_autocast
def buffer_start(h_emb, w_write, w_read, h):
    return run_function(BufferStart, h_emb, w_write, w_read, h)


@float32_under_autocast
def buffer_step(mem, w_write, w_read, h):
    return run_function(BufferStep, mem, w_write, w_read, h)


@float32_under_autocast
def buffer_final_read(mem, w_write, w_read, h):
    return run_function(BufferFinalRead, mem, w_write, w_read, h)


# -----------------------------------------------------------------------------
# The loss

class CrossEntropy(torch.autograd.Function):
    """F.cross_entropy(logits, targets, ignore_index=-1), the mean over the targets that are not -1, with
    fewer passes over the logits. F.cross_entropy writes the log-softmax (as large as the logits), then in
    backward a zero-filled one-hot gradient and the log-softmax's gradient: three fresh (N, V) tensors.
    Here forward reads the logits (logsumexp, and the target's logit) and writes nothing of their size,
    and backward writes the one gradient, softmax(logits) - onehot(target), scaled. Same values to
    rounding (tested against F.cross_entropy); the log-softmax is no longer kept for backward (400 MB
    at pythia-70m width with 8 x 256 tokens: README, Speed)."""

    @staticmethod
    def forward(ctx, logits, targets):  # logits (N, V) float, targets (N,) ids or -1 -> scalar
        keep = targets != -1                                                    # (N,)
        # -1 reads column 0, then drops; any other id outside [0, V) makes gather raise, as F.cross_entropy does
        index = targets.masked_fill(~keep, 0).unsqueeze(1)                      # (N, 1)
        # logsumexp makes two temporaries as large as its input (x - max and its exp). On CPU each would be
        # fresh memory the kernel has to fault in and zero, so it goes ~1M logits (4 MB) at a time and the
        # temporaries stay in cache. On GPUs it goes 2^28 logits (1 GiB) at a time, which bounds the
        # temporaries of an uncompiled evaluation (16 x 4096 tokens x 50k vocabulary would be 13 GB each).
        # torch.compile fuses logsumexp into one pass (unrolling the blocks would only slow compilation).
        block = 2**20 if logits.device.type == "cpu" else 2**28
        rows = logits.size(0) if torch.compiler.is_compiling() else max(1, block // logits.size(1))
        lse = torch.cat([torch.logsumexp(chunk, dim=-1) for chunk in logits.split(rows)])   # (N,)
        nll = lse - logits.gather(1, index).squeeze(1)                          # (N,)  -log softmax[target]
        count = keep.sum()
        ctx.save_for_backward(logits, index, keep, count)
        return torch.where(keep, nll, 0.0).sum() / count

    @staticmethod
    def backward(ctx, grad):
        logits, index, keep, count = ctx.saved_tensors
        scale = (keep * (grad / count)).unsqueeze(1)                            # (N, 1)
        dlogits = torch.softmax(logits, dim=-1).mul_(scale)                     # (N, V)
        return dlogits.scatter_add_(1, index, -scale), None


# -----------------------------------------------------------------------------
# The model

class RecursiveGPT(nn.Module):
    """wte -> prelude -> loop steps over shared cores (state passed by `scheme`) -> coda -> ln_f -> lm_head."""

    def __init__(self, cfg):
        super().__init__()
        self.config = cfg
        shape = cfg.shape
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.rotary = Rotary(cfg)
        self.prelude = nn.ModuleList(Block(cfg) for _ in range(shape.prelude))
        self.cores = nn.ModuleList(nn.ModuleList(Block(cfg) for _ in range(n)) for n in shape.cores)
        self.schedule = list(shape.schedule)  # loop step t runs cores[schedule[t]]
        self.coda = nn.ModuleList(Block(cfg) for _ in range(shape.coda))
        if cfg.scheme == "mesh":  # K+1 pairs: [0] the transitional cycle, [t+1] loop step t
            self.routers = nn.ModuleList(Router(cfg.n_embd, cfg.slots) for _ in range(cfg.n_steps + 1))
        self.ln_f = nn.LayerNorm(cfg.n_embd, eps=1e-5)
        self.lm_head = Linear(cfg.n_embd, cfg.vocab_size, bias=False)  # untied, as Pythia
        self.grad_checkpoint = False  # recompute block activations in backward (train.py --grad_checkpoint)
        self.apply(self._init_weights)

    def _init_weights(self, module):
        """All init, one place (SPEC section 4, Appendix B):
        - Linear weights and embeddings: normal(0, 0.02); biases zero; LayerNorm weight 1, bias 0.
        - Output projections of attention and MLP (`attn.proj`, `mlp.proj`): std 0.02 / sqrt(2 * N),
          N = compute depth (unrolled block count), so the residual stream's variance does not
          grow with depth however often a shared core is reused.
        - Routers [choice]: like every Linear, weights normal(0, 0.02) and zero bias, so each
          router starts near uniform (w ~ 1/B for every slot) and no slot or step is favoured
          before training; the routers learn any preference from the loss alone.
        """
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
        elif isinstance(module, (Attention, MLP)):  # visited after its Linears (apply is post-order)
            nn.init.normal_(module.proj.weight, mean=0.0, std=0.02 / math.sqrt(2 * self.config.shape.depth))

    def compute_dtype(self, device_type):
        """The dtype the Linear layers compute in, so also q, k and v: autocast's where it is on, else the
        weights'. The rotary tables and the KV cache are made in it."""
        if torch.is_autocast_enabled(device_type):
            return torch.get_autocast_dtype(device_type)
        return self.lm_head.weight.dtype

    def num_params(self, non_embedding=True):
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.wte.weight.numel() + self.lm_head.weight.numel()
        return n

    def applied_blocks(self):
        """Every block in the order the forward pass applies it (the KV cache has one layer per entry)."""
        steps = [blk for c in self.schedule for blk in self.cores[c]]
        return list(self.prelude) + steps + list(self.coda)

    def run(self, blocks, x, layer, rope, cache):
        """Apply `blocks` in order; `layer` counts applied blocks so each gets its own KV cache entry."""
        for block in blocks:
            if self.grad_checkpoint and self.training:
                x = checkpoint(block, x, rope, cache, layer, use_reentrant=False)
            else:
                x = block(x, rope, cache, layer)
            layer += 1
        return x, layer

    def forward(self, idx, targets=None, pos=None, cache=None, capture=None):
        """idx (B, T) token ids -> (logits (B, T, V), loss or None).

        pos (T,) and cache (a KVCache) are for incremental decoding; capture, a dict, is filled with
        the states, block (input, output) pairs and router weights that probe.py studies. Neither
        changes the result.
        """
        cfg = self.config
        if idx.size(1) > cfg.block_size:
            raise ValueError(f"idx has {idx.size(1)} positions but block_size is {cfg.block_size}; "
                             f"pass at most the last {cfg.block_size} tokens (as generate does)")
        rope = self.rotary(idx.size(1), pos, self.compute_dtype(idx.device.type))  # once for every block
        if cache is not None:
            cache.seek(pos)
        x = self.wte(idx)                                                   # (B, T, D)
        if cfg.scale_embeddings:
            x = x * math.sqrt(cfg.n_embd)                                   # Appendix B
        h_emb = x
        h, layer = self.run(self.prelude, h_emb, 0, rope, cache)            # f_pre(h_emb)
        record = capture is not None
        if record:
            capture.update(states=[("h_emb", h_emb)], blocks=[("prelude", h_emb, h)], routers=[])
        if cfg.scheme == "mesh":
            # Eq. 2: slot 0 starts as h_emb, the other B-1 slots as zeros. Transitional cycle [choice]:
            # route on the prelude output, write it, read h(0).
            w_write, w_read = self.routers[0](h)                            # (B, T, S) each
            mem, h = buffer_start(h_emb, w_write, w_read, h)                # (B, T, S, D), (B, T, D)
            if record:
                capture["routers"].append(("cycle", w_write, w_read))
        h0 = h                                                              # h(0)
        for t, c in enumerate(self.schedule):
            if record:
                capture["states"].append((f"h{t}", h))
            h_m, layer = self.run(self.cores[c], h, layer, rope, cache)     # Eq. 4: h_m = f_t(h(t))
            if record:
                capture["blocks"].append((f"step{t}", h, h_m))
            if cfg.scheme == "base":
                h = h_m
            elif cfg.scheme == "residual":
                h = h_m + h
            elif cfg.scheme == "anchor":
                h = h_m + h0
            elif cfg.scheme == "anchor_emb":
                h = h_m + h_emb
            else:  # mesh: route on h(t), write h_m (Eq. 5), read h(t+1)
                w_write, w_read = self.routers[t + 1](h)
                if t + 1 < cfg.n_steps:
                    mem, h = buffer_step(mem, w_write, w_read, h_m)
                else:  # the final read: no one reads this buffer again, so it is never written out
                    h = buffer_final_read(mem, w_write, w_read, h_m)
                if record:
                    capture["routers"].append((f"step{t}", w_write, w_read))
        x, layer = self.run(self.coda, h, layer, rope, cache)               # f_coda(h(K))
        if record:
            capture["states"] += [(f"h{cfg.n_steps}", h), ("out", x)]
            if self.coda:
                capture["blocks"].append(("coda", h, x))
        logits = self.lm_head(self.ln_f(x))                                 # (B, T, V)
        loss = None
        if targets is not None:
            loss = CrossEntropy.apply(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss

    def configure_optimizer(self, weight_decay, lr, betas=(0.9, 0.95), device_type="cpu"):
        """AdamW with weight decay on matrices (Linear weights, embeddings, router weights) only:
        biases and LayerNorm parameters (1-d) are never decayed. Fused (one kernel over all parameters)
        on CUDA and CPU: on CPU about 3x faster than the default per-parameter loop."""
        params = [p for p in self.parameters() if p.requires_grad]
        decay = [p for p in params if p.dim() >= 2]
        no_decay = [p for p in params if p.dim() < 2]
        assert len(decay) + len(no_decay) == len(params)
        assert not {id(p) for p in decay} & {id(p) for p in no_decay}
        groups = [dict(params=decay, weight_decay=weight_decay), dict(params=no_decay, weight_decay=0.0)]
        return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=device_type in ("cuda", "cpu"))

    @classmethod
    def from_pretrained(cls, path, device="cpu"):
        """Load a Hugging Face GPT-NeoX checkpoint folder (a Pythia download is one) as a vanilla
        RecursiveGPT: layout 'L', scheme 'base', scale_embeddings off, so its logits are the original
        model's. Its config is a plain Config, so training can continue. See from_hf_neox."""
        cfg, state = from_hf_neox(path)
        model = cls(cfg)
        model.load_state_dict(state)
        return model.to(device)

    # ---- generation --------------------------------------------------------

    @torch.inference_mode()  # like no_grad, and also skips autograd's version counters: ~10% faster decoding
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, use_cache=True):
        """Append max_new_tokens sampled tokens to idx (B, T). temperature 0 is greedy.

        With use_cache (the default) the prompt is prefilled once and each new token is one
        position through the network. Positions are absolute, so once the sequence outgrows
        block_size the last block_size tokens are re-prefilled at every step: the result is the
        same as full recompute (use_cache=False) either way.

        One-position steps run with oneDNN off (only that flag; restored after). On CPU its only
        effect here is GELU: oneDNN sets up a kernel on every call, which costs several times
        ATen's own GELU on one token's 4 x n_embd activations, while on whole sequences (training,
        prefill) oneDNN's is the faster one. Both compute exact GELU."""
        if not temperature >= 0 or top_k is not None and top_k < 1:  # (not >= also refuses nan)
            raise ValueError(f"temperature={temperature} must be 0 (greedy) or more and top_k={top_k} "
                             f"at least 1 (or None for no limit)")
        L = self.config.block_size
        cache = None
        for _ in range(max_new_tokens):
            T = idx.size(1)
            if not use_cache:
                logits, _ = self(idx[:, -L:])
            elif cache is None or T > L:  # (re-)prefill
                cache = KVCache(self, idx.size(0), L) if cache is None else cache
                ctx = idx[:, -L:]
                logits, _ = self(ctx, pos=torch.arange(ctx.size(1), device=idx.device), cache=cache)
            else:  # decode one position, with oneDNN off (see above)
                onednn, torch.backends.mkldnn.enabled = torch.backends.mkldnn.enabled, False
                try:
                    logits, _ = self(idx[:, -1:], pos=torch.tensor([T - 1], device=idx.device), cache=cache)
                finally:
                    torch.backends.mkldnn.enabled = onednn
            idx = torch.cat((idx, sample(logits[:, -1, :], temperature, top_k)), dim=1)
        return idx


def sample(logits, temperature=1.0, top_k=None):
    """logits (B, V) -> next token ids (B, 1); temperature 0 means argmax."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits.float()
    # shift the maximum to 0 before dividing: softmax is unchanged, and a tiny temperature gives -inf, not inf/inf
    logits = (logits - logits.amax(dim=-1, keepdim=True)) / temperature
    if top_k is not None:
        v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
        logits[logits < v[:, [-1]]] = -float("inf")
    return torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)


class KVCache:
    """Keys and values of every applied block (so `4+8R2+4` caches 24 layers, not 16), for max_len
    positions, preallocated so shapes never change while decoding. The model calls seek(pos) once per
    forward; each block then writes its keys/values at those positions and attends through attn_mask.

    With a parallel residual it also holds each applied block's fused input matmul (Block.fused_inputs),
    made from the weights as they are when the cache is made: make a new cache after they change
    (generate makes one per call)."""

    def __init__(self, model, batch_size, max_len):
        cfg, device = model.config, model.lm_head.weight.device
        dtype = model.compute_dtype(device.type)  # keys and values as the blocks make them: no cast per update
        blocks = model.applied_blocks()
        unique = {id(b): b for b in blocks} if cfg.parallel_residual else {}  # a shared core's blocks once
        fused = {key: b.fused_inputs(dtype) for key, b in unique.items()}
        self.inputs = [fused.get(id(b)) for b in blocks]  # per layer: (weight (7D, D), bias (7D,)) or None
        shape = (len(blocks), batch_size, cfg.n_head, max_len, cfg.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)  # (layers, B, H, L, hd)
        self.v = torch.zeros_like(self.k)
        self.layers = list(zip(self.k.unbind(0), self.v.unbind(0)))  # per-layer views, made once
        causal = torch.ones(max_len, max_len, dtype=torch.bool, device=device).tril()
        # additive (0 or -inf) rather than boolean: SDPA would convert a boolean mask in every block
        self.mask = torch.zeros(max_len, max_len, device=device, dtype=dtype).masked_fill(~causal, -math.inf)
        self.pos = self.attn_mask = None

    def seek(self, pos):  # pos (T,): the positions of this forward's tokens
        if pos is None:
            raise ValueError("decoding with a KVCache needs pos, the positions (T,) of the tokens in idx")
        self.pos, self.attn_mask = pos, self.mask[pos]  # (T,), (T, L): each token sees positions <= its own

    def update(self, layer, k, v):  # k, v (B, H, T, hd) at positions self.pos -> all keys, values (B, H, L, hd)
        keys, values = self.layers[layer]
        keys.index_copy_(2, self.pos, k)
        values.index_copy_(2, self.pos, v)
        return keys, values


# -----------------------------------------------------------------------------
# Checkpoints: one writer and one loader, shared by train / sample / probe / bench

class CheckpointError(ValueError):
    pass


def save_checkpoint(obj, path):
    """torch.save to a temporary file in the same folder, fsync, then os.replace: a crash at any
    moment leaves either the previous checkpoint or the new one, never half of one."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    # a fresh name opened exclusively ("x"); not mkstemp, whose file is private (0600) where a plain save is not
    tmp = os.path.join(folder, f".ckpt-{os.getpid()}-{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "xb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def load_checkpoint(out_dir, device="cpu"):
    """Load OUT_DIR/ckpt.pt (weights_only: loading never runs code) -> (model, checkpoint dict)."""
    path = os.path.join(out_dir, "ckpt.pt")
    if not os.path.isfile(path):
        raise CheckpointError(f"no checkpoint at {path}; train one with: python train.py --out_dir={out_dir}")
    try:
        ckpt = torch.load(path, map_location=device, weights_only=True)
        missing = {"model", "model_config", "train_config"} - set(ckpt)
        if missing:
            raise KeyError(f"no {', '.join(sorted(missing))}")
        model = RecursiveGPT(Config.from_dict(ckpt["model_config"]))
        model.load_state_dict(ckpt["model"])
    except Exception as e:  # truncated zip, foreign file, missing keys, ...
        raise CheckpointError(f"{path} is corrupt or not a nanoMeSH checkpoint "
                              f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                              f"delete it or point --out_dir at another run") from None
    return model.to(device), ckpt


# -----------------------------------------------------------------------------
# Importing Hugging Face GPT-NeoX / Pythia checkpoints (SPEC section 1), without transformers

def from_hf_neox(path):
    """config.json plus model.safetensors or pytorch_model.bin (or a sharded *.index.json) -> (Config,
    RecursiveGPT state_dict). A setting that our GPT-NeoX block cannot express is refused by name."""
    where = f"cannot import {path}"
    try:
        with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
            hf = json.load(f)
        D, H, L = hf["hidden_size"], hf["num_attention_heads"], hf["num_hidden_layers"]
    except (OSError, ValueError, KeyError) as e:
        raise CheckpointError(f"{where}: no GPT-NeoX config.json there ({type(e).__name__}: {e})") from None
    rope = hf.get("rope_parameters") or {}  # transformers >= 5 moved rotary_pct / rotary_emb_base here
    for field, found, ours in [("model_type", hf.get("model_type"), "gpt_neox"),
                               ("intermediate_size", hf.get("intermediate_size", 4 * D), 4 * D),
                               ("hidden_act", hf.get("hidden_act", "gelu"), "gelu"),  # exact (erf) GELU
                               ("layer_norm_eps", hf.get("layer_norm_eps", 1e-5), 1e-5),
                               ("attention_bias", hf.get("attention_bias", True), True),
                               ("rope_scaling", hf.get("rope_scaling"), None),
                               ("rope_type", rope.get("rope_type", "default"), "default")]:
        if found != ours:
            raise CheckpointError(f"{where}: {field}={found!r} is not supported (nanoMeSH has {field}={ours!r})")
    try:
        cfg = Config(vocab_size=hf.get("vocab_size", 0), block_size=hf.get("max_position_embeddings", 2048),
                     n_embd=D, n_head=H, layout=str(L), scale_embeddings=False,
                     rotary_pct=rope.get("partial_rotary_factor", hf.get("rotary_pct", 0.25)),
                     rotary_base=float(rope.get("rope_theta", hf.get("rotary_emb_base", 10000.0))),
                     parallel_residual=hf.get("use_parallel_residual", True))
    except ValueError as e:
        raise CheckpointError(f"{where}: {e}") from None
    try:  # optional: a pytorch_model.bin needs only torch
        from safetensors.torch import load_file
    except ImportError:
        load_file = None
    for name in ("model.safetensors", "pytorch_model.bin") if load_file else ("pytorch_model.bin",):
        files = [name] if os.path.isfile(os.path.join(path, name)) else []
        if os.path.isfile(os.path.join(path, name + ".index.json")):  # sharded: the index names the shards
            with open(os.path.join(path, name + ".index.json"), encoding="utf-8") as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        if files:
            break
    else:
        raise CheckpointError(f"{where}: no weights; expected model.safetensors (needs `pip install safetensors`) "
                              f"or pytorch_model.bin, or a sharded *.index.json")
    sd = {}
    for file in (os.path.join(path, f) for f in files):  # a .bin loads with weights_only: never runs code
        sd.update(load_file(file) if file.endswith(".safetensors") else
                  torch.load(file, map_location="cpu", weights_only=True))
    # Tied embeddings: our lm_head is untied (SPEC 1), so it starts as a copy of wte and trains apart.
    head = ("gpt_neox.embed_in.weight" if hf.get("tie_word_embeddings") else
            "embed_out.weight" if "embed_out.weight" in sd else "lm_head.weight")  # on disk / in memory
    names = {"wte.weight": "gpt_neox.embed_in.weight", "lm_head.weight": head,
             "ln_f.weight": "gpt_neox.final_layer_norm.weight", "ln_f.bias": "gpt_neox.final_layer_norm.bias"}
    for i in range(L):  # a vanilla layout: every layer is a prelude block
        for ours, theirs in [("ln_1", "input_layernorm"), ("ln_2", "post_attention_layernorm"),
                             ("attn.qkv", "attention.query_key_value"), ("attn.proj", "attention.dense"),
                             ("mlp.fc", "mlp.dense_h_to_4h"), ("mlp.proj", "mlp.dense_4h_to_h")]:
            names.update({f"prelude.{i}.{ours}.{k}": f"gpt_neox.layers.{i}.{theirs}.{k}" for k in ("weight", "bias")})
    absent = [theirs for theirs in names.values() if theirs not in sd]
    if absent:
        raise CheckpointError(f"{where}: {len(absent)} weight(s) missing, e.g. {absent[0]}")
    if sd[names["wte.weight"]].shape != (cfg.vocab_size, D):
        raise CheckpointError(f"{where}: vocab_size={cfg.vocab_size} in config.json, but embed_in has shape "
                              f"{tuple(sd[names['wte.weight']].shape)}")
    state = {ours: sd[theirs] for ours, theirs in names.items()}
    for i in range(L):  # NeoX fuses QKV per head, [head][q|k|v][head_dim]; our rows are [q | k | v], head-major
        w, b = f"prelude.{i}.attn.qkv.weight", f"prelude.{i}.attn.qkv.bias"
        state[w] = state[w].view(H, 3, D // H, D).transpose(0, 1).reshape(3 * D, D)   # (3D, D)
        state[b] = state[b].view(H, 3, D // H).transpose(0, 1).reshape(3 * D)         # (3D,)
    return cfg, state


# -----------------------------------------------------------------------------
# Summary (the paper's Table 5), on the meta device: no weights are allocated

def summary(cfg):
    with torch.device("meta"):
        model = RecursiveGPT(cfg)
        vanilla = RecursiveGPT(Config(**{**cfg.to_dict(), "layout": str(cfg.shape.depth), "scheme": "base"}))
    s = cfg.shape
    lines = [f"layout {cfg.layout}, scheme {cfg.scheme}" + (f", {cfg.slots} slots" if cfg.scheme == "mesh" else "")]
    first = 0

    def span(n):
        nonlocal first
        first += n
        return f"blocks {first - n}-{first - 1}" if n else "(none)"

    lines.append(f"  prelude  {span(s.prelude)}")
    core_spans = [span(n) for n in s.cores]
    for t, c in enumerate(s.schedule):
        shared = " (shared)" if s.schedule.index(c) != t else ""
        lines.append(f"  step {t:<3} core {c}: {core_spans[c]}{shared}")
    lines.append(f"  coda     {span(s.coda)}")
    ne, vne = model.num_params(), vanilla.num_params()
    routers = sum(p.numel() for n, p in model.named_parameters() if n.startswith("routers."))
    lines += [
        f"compute depth {s.depth}, unique layers {s.unique}",
        f"total params          {model.num_params(False):>15,}",
        f"non-embedding params  {ne:>15,}  ({100 * ne / vne:.2f}% of vanilla {s.depth}-layer: {vne:,})",
        f"router params         {routers:>15,}",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="Print a model's layout and parameter counts (no weights allocated).")
    ap.add_argument("--model", default="classroom", help=f"preset: {', '.join(PRESETS)}")
    ap.add_argument("--layout")
    ap.add_argument("--scheme")
    ap.add_argument("--n_slots", type=int)
    ap.add_argument("--vocab_size", type=int)
    ap.add_argument("--block_size", type=int)
    a = ap.parse_args()
    try:
        config = Config.from_preset(a.model, layout=a.layout, scheme=a.scheme, n_slots=a.n_slots,
                                    vocab_size=a.vocab_size, block_size=a.block_size)
    except ValueError as e:
        ap.exit(2, f"mesh.py: error: {e}\n")
    print(summary(config))
