"""
nanoMeSH: the whole model in one file. MeSH (Memory-as-State-Highways for Recursive Transformers,
Yu et al., arXiv 2510.07739) on a GPT-NeoX / Pythia backbone: a prelude, one weight-shared core
run several times (the loop steps), a coda. How the state travels from step to step is the
"scheme" (Section 3, Table 1), one entry each in SCHEMES; MeSH's is a B-slot memory buffer with
per-step write and read routers (Eq. 2-5, in RecursiveGPT.forward).

Read top to bottom: schemes, presets and layouts, Config, the GPT-NeoX Block, the Router and
buffer, the model, init, optimizer, KV cache and generation, and a summary of the paper's Table 5
that allocates no weights: `python mesh.py` (the classroom model; any other with tools/draw.py).
"""

import difflib
import math
import re
from contextlib import nullcontext
from dataclasses import asdict, dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

# h(t+1) from loop step t's output h_m = f_t(h(t)) (Eq. 4), its input h = h(t), h0 = h(0), h_emb:
# the project's one list of schemes; one more line adds one. MeSH's is its buffer's (forward).
SCHEMES = {
    "base": lambda h_m, h, h0, h_emb: h_m,                # h(t+1) = f_t(h(t))
    "residual": lambda h_m, h, h0, h_emb: h_m + h,        # h(t+1) = f_t(h(t)) + h(t)
    "anchor": lambda h_m, h, h0, h_emb: h_m + h0,         # h(t+1) = f_t(h(t)) + h(0)
    "anchor_emb": lambda h_m, h, h0, h_emb: h_m + h_emb,  # f_t(h(t)) + h_emb (the paper's anchor*)
    "mesh": None,                                         # Eq. 2-5: write h_m, read h(t+1)
}
MESH_CHOICES = {"cycle": ("routed", "direct"), "router_init": ("uniform", "base"),
                "slot0": ("scaled", "unscaled")}  # left open by the paper; first = default

# Pythia shapes (Biderman et al. 2023): width, heads, vanilla depth, peak LR, padded vocabulary.
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


class ConfigError(ValueError):
    """A setting the model cannot take. This file's own, so that it stands alone: train.py turns
    it into its one-line UsageError; anywhere else (a bug) it shows its traceback."""


def refuse(bad, message):
    """Every check of a setting: one line naming the problem and the fix."""
    if bad:
        raise ConfigError(message)


def one_of(kind, value, options):
    """Refuse a value not among options, naming the nearest one (if any) and all of them."""
    if value not in options:
        near = difflib.get_close_matches(str(value), list(options), n=1, cutoff=0.5)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise ConfigError(f"unknown {kind} {value!r}{hint}; expected one of {', '.join(options)}")


# -----------------------------------------------------------------------------
# Layouts (the paper's notation, Section 4.1): "P+CRN+Q", "24", "4+8+8+4" (Appendix E.5)

@dataclass(frozen=True)
class Layout:
    prelude: int     # blocks in f_pre
    cores: tuple     # block count of each unique core
    schedule: tuple  # for each loop step t, the index of the core it runs
    coda: int        # blocks in f_coda

    @property
    def depth(self):  # unrolled: a shared core counts once per loop step
        looped = sum(self.cores[c] for c in self.schedule)
        return self.prelude + looped + self.coda

    @property
    def unique(self):  # blocks with their own parameters
        return self.prelude + sum(self.cores) + self.coda


def parse_layout(text):
    """'4+8R2+4' -> Layout(4, (8,), (0, 0), 4); '24' -> Layout(24, (), (), 0). The first segment
    is the prelude, the last the coda; each middle one is 'C' (a step with its own C blocks) or
    'CRN' (N steps sharing one core of C blocks)."""
    bad = (f"bad layout {text!r}: expected '+'-separated block counts such as '24', '4+8R2+4' "
           f"or '4+8+8+4'")
    segments = str(text).split("+")
    refuse(not all(segments), f"{bad} (empty segment)")
    if len(segments) == 1:
        refuse(not segments[0].isdecimal() or int(segments[0]) < 1,
               f"{bad} (a vanilla layout is one positive block count)")
        return Layout(int(segments[0]), (), (), 0)
    ends = (segments[0], segments[-1])
    refuse(not all(s.isdecimal() for s in ends),
           f"{bad} (prelude and coda are plain block counts, got {ends[0]!r}, {ends[1]!r})")
    cores, schedule = [], []
    for seg in segments[1:-1]:
        m = re.fullmatch(r"(\d+)(?:R(\d+))?", seg)
        if not m:
            lower = re.fullmatch(r"\d+r\d+", seg)
            upper = f": the R of CRN is upper case, {seg.upper()!r}" if lower else ""
            raise ConfigError(f"{bad} (segment {seg!r} is not 'C' or 'CRN'{upper})")
        size, repeats = int(m[1]), int(m[2] or 1)
        refuse(size < 1 or repeats < 1,
               f"{bad} (segment {seg!r} needs at least one block and one step)")
        schedule += [len(cores)] * repeats
        cores.append(size)
    layout = Layout(int(ends[0]), tuple(cores), tuple(schedule), int(ends[1]))
    refuse(layout.depth < 1, f"{bad} (no blocks)")
    return layout


# -----------------------------------------------------------------------------
# Config

@dataclass
class Config:
    vocab_size: int = 50304      # GPT-2's 50257 padded to a multiple of 64
    block_size: int = 2048       # context length
    n_embd: int = 768
    n_head: int = 12
    layout: str = "12"           # see parse_layout
    scheme: str = "base"         # one of SCHEMES
    n_slots: int | None = None   # MeSH buffer slots B; None means K+3 (Appendix E.1)
    cycle: str = "routed"        # MeSH transitional cycle: "routed" or "direct" (see forward)
    router_init: str = "uniform"  # MeSH routers at init: "uniform" or "base" (see _init_weights)
    slot0: str = "scaled"        # MeSH slot 0: h_emb "scaled" by sqrt(D) or "unscaled" (forward)
    rotary_pct: float = 0.25     # fraction of each head's dims that get rotary
    rotary_base: float = 10000.0
    parallel_residual: bool = True   # GPT-NeoX: x + attn(ln_1 x) + mlp(ln_2 x)
    scale_embeddings: bool = True    # h_emb = wte(idx) * sqrt(D) (Appendix B); off for Pythia's
    dropout: float = 0.0

    def __post_init__(self):
        self.layout = str(self.layout)
        self.shape = parse_layout(self.layout)  # not a field: derived, not saved
        one_of("scheme", self.scheme, SCHEMES)
        refuse(self.scheme != "base" and not self.shape.schedule,
               f"scheme {self.scheme!r} needs loop steps, but layout {self.layout!r} has none; "
               f"use a layout like '2+4R2+2' or scheme 'base'")
        refuse(self.n_slots is not None and self.n_slots < 1,
               f"n_slots={self.n_slots} must be at least 1 (or None for K+3)")
        mesh = self.scheme == "mesh"
        for name, options in MESH_CHOICES.items():
            value = getattr(self, name)
            one_of(name, value, options)
            refuse(value != options[0] and not mesh, f"{name}={value!r} is a MeSH setting, but "
                   f"scheme is {self.scheme!r}; drop it or use scheme 'mesh'")
        refuse(mesh and self.cycle == "direct" and self.slots < 2, f"cycle='direct' writes the "
               f"prelude output into slot 1, so it needs n_slots >= 2, not {self.slots}")
        refuse(mesh and self.router_init == "base" and self.slots < self.n_steps + 2,
               f"router_init='base' gives each of the {self.n_steps} loop steps a slot after "
               f"slots 0 and 1, so it needs n_slots >= K+2 = {self.n_steps + 2}, not {self.slots}")
        for name in ("vocab_size", "block_size", "n_embd", "n_head"):
            value = getattr(self, name)
            refuse(value < 1, f"{name}={value} must be a positive integer")
        refuse(self.n_embd % self.n_head, f"n_embd={self.n_embd} is not divisible by "
               f"n_head={self.n_head}; pick n_head among the divisors of n_embd")
        refuse(not 0.0 <= self.rotary_pct <= 1.0,
               f"rotary_pct={self.rotary_pct} must be in [0, 1] (GPT-NeoX: 0.25)")
        refuse(self.rotary_dims % 2, f"rotary dims = int(head_dim {self.head_dim} x rotary_pct "
               f"{self.rotary_pct}) = {self.rotary_dims} must be even; "
               f"adjust rotary_pct or n_head")
        refuse(not 0.0 <= self.dropout < 1.0, f"dropout={self.dropout} must be in [0, 1)")

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
    def slots(self):  # B
        if self.n_slots is None:
            return self.n_steps + 3
        return self.n_slots

    def to_dict(self):
        """Plain data, saved with every checkpoint."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d):
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        refuse(unknown, f"unknown config field(s) {', '.join(unknown)}; "
               f"expected {', '.join(sorted(names))}")
        return cls(**d)

    @classmethod
    def from_preset(cls, name, **overrides):
        one_of("preset", name, PRESETS)
        p = {k: v for k, v in PRESETS[name].items() if k != "lr"}
        p.setdefault("layout", str(p.pop("n_layer", 0)))
        p.update({k: v for k, v in overrides.items() if v is not None})
        return cls.from_dict(p)


# -----------------------------------------------------------------------------
# The GPT-NeoX block

class Rotary(nn.Module):
    """GPT-NeoX rotary embedding of each head's first rotary_dims: one table for all blocks."""

    def __init__(self, cfg):
        super().__init__()
        rot = cfg.rotary_dims
        inv_freq = 1.0 / (cfg.rotary_base ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot))
        freqs = torch.outer(torch.arange(cfg.block_size, dtype=torch.float32), inv_freq)
        freqs = torch.cat((freqs, freqs), dim=-1)  # (L, rot): each of the (L, rot/2) twice
        # derived from the config, so not saved (persistent=False)
        self.register_buffer("cos", freqs.cos(), persistent=False)
        self.register_buffer("sin", freqs.sin(), persistent=False)

    def forward(self, T, pos=None, dtype=torch.float32):
        """(cos, sin), each (T, rotary_dims), at positions pos (T,) or 0..T-1, in q's dtype."""
        cos, sin = (self.cos[:T], self.sin[:T]) if pos is None else (self.cos[pos], self.sin[pos])
        return cos.to(dtype), sin.to(dtype)


def apply_rotary(x, cos, sin):
    """x (..., T, hd): NeoX's rotate-half on the first rot = cos.size(-1) dims of each head,
    (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin); the other dims pass through."""
    rot = cos.size(-1)
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    x1, x2 = x_rot[..., :rot // 2], x_rot[..., rot // 2:]
    return torch.cat((x_rot * cos + torch.cat((-x2, x1), dim=-1) * sin, x_pass), dim=-1)


class Attention(nn.Module):
    """Causal self-attention with a fused QKV and rotary positions."""

    def __init__(self, cfg):
        super().__init__()
        self.n_head, self.head_dim, self.dropout = cfg.n_head, cfg.head_dim, cfg.dropout
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)   # rows: [q | k | v], each head-major
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x, rope, cache=None, layer=0):
        B, T, C = x.shape
        qkv = self.qkv(x).view(B, T, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k = apply_rotary(qkv[:2], *rope).unbind(0)  # qkv (3, B, H, T, hd): q, k rotated at once
        v = qkv[2]
        drop = self.dropout if self.training else 0.0
        if cache is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=drop)
        else:  # keys/values of all earlier positions come from the cache; the mask hides the rest
            k, v = cache.update(layer, k, v)  # (B, H, L, hd)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=cache.attn_mask, dropout_p=drop)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))  # y (B, H, T, hd) -> (B, T, D)


class MLP(nn.Module):
    def __init__(self, cfg):  # D -> 4D -> D
        super().__init__()
        self.fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x)))  # exact (erf) GELU, as GPT-NeoX


class Block(nn.Module):
    """GPT-NeoX block on x (B, T, D), with rope = model.rotary(T) shared by every block."""

    def __init__(self, cfg):
        super().__init__()
        self.parallel = cfg.parallel_residual
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=1e-5)
        self.attn = Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=1e-5)
        self.mlp = MLP(cfg)
        # residual dropout on each branch's output; at p = 0 (Pythia's) an Identity: free to decode
        self.drop = nn.Dropout(cfg.dropout) if cfg.dropout else nn.Identity()

    def forward(self, x, rope, cache=None, layer=0):
        a = self.drop(self.attn(self.ln_1(x), rope, cache, layer))
        if self.parallel:  # GPT-NeoX / Pythia: both branches read the same x
            return x + a + self.drop(self.mlp(self.ln_2(x)))
        x = x + a
        return x + self.drop(self.mlp(self.ln_2(x)))


# -----------------------------------------------------------------------------
# MeSH: routers and the memory buffer (Eq. 2-5). [choice] Precision: autocast leaves the buffer's
# elementwise ops alone, so under bf16 it and every state read from it stay float32, as the other
# schemes' residual stream does.

class Router(nn.Module):
    """One router pair (Eq. 3): per token, softmax weights over the B slots to write, to read."""

    def __init__(self, n_embd, n_slots):
        super().__init__()
        self.write = nn.Linear(n_embd, n_slots)
        self.read = nn.Linear(n_embd, n_slots)

    def forward(self, h):  # h (B, T, D) -> w_write, w_read, each (B, T, S) with rows summing to 1
        return F.softmax(self.write(h), dim=-1), F.softmax(self.read(h), dim=-1)


def buffer_write(mem, w_write, h):
    """Eq. 5, the write: m_b += w_write_b * h for every slot b.
    mem (B, T, S, D), w_write (B, T, S), h (B, T, D) -> (B, T, S, D), in one pass."""
    return torch.addcmul(mem, w_write.unsqueeze(-1), h.unsqueeze(-2))


def buffer_read(mem, w_read):
    """Eq. 5, the read: h = sum_b w_read_b m_b. mem (B, T, S, D), w_read (B, T, S) -> (B, T, D)."""
    return (w_read.unsqueeze(-1) * mem).sum(dim=-2)


# -----------------------------------------------------------------------------
# The model

class RecursiveGPT(nn.Module):
    """wte -> prelude -> loop steps over shared cores (state passed by `scheme`) -> coda -> head"""

    def __init__(self, cfg):
        super().__init__()
        self.config, shape = cfg, cfg.shape
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.rotary = Rotary(cfg)
        self.prelude = nn.ModuleList(Block(cfg) for _ in range(shape.prelude))
        self.cores = nn.ModuleList(nn.ModuleList(Block(cfg) for _ in range(n))
                                   for n in shape.cores)
        self.schedule = list(shape.schedule)  # loop step t runs cores[schedule[t]]
        self.coda = nn.ModuleList(Block(cfg) for _ in range(shape.coda))
        if cfg.scheme == "mesh":  # K+1 pairs (Table 5): the transitional cycle's, then each step's
            n_routers = cfg.n_steps  # one per loop step
            if cfg.cycle == "routed":  # and the cycle's (cycle="direct" has none)
                n_routers += 1
            self.routers = nn.ModuleList(Router(cfg.n_embd, cfg.slots) for _ in range(n_routers))
        self.ln_f = nn.LayerNorm(cfg.n_embd, eps=1e-5)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)  # untied, as Pythia
        self.grad_checkpoint = False  # recompute activations in backward (--grad_checkpoint)
        self.apply(self._init_weights)

    def _init_weights(self, module):
        """All init, one place (Appendix B): Linear weights and embeddings normal(0, 0.02), biases
        0, LayerNorms 1 and 0; attn.proj and mlp.proj std 0.02 / sqrt(2 N), N the compute depth, so
        the residual stream's variance does not grow however often a shared core is reused.
        Routers [choice]: "uniform" as every Linear, so each starts near w = 1/B for every slot;
        "base" starts MeSH as the base scheme (Appendix D): the cycle writes and reads slot 1, step
        t slot t+2, each with weight 0.9 (bias ln(9(B-1))). Both measured: results/README.md."""
        cfg = self.config
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
        elif isinstance(module, (Attention, MLP)):  # visited after its Linears (post-order)
            std = 0.02 / math.sqrt(2 * cfg.shape.depth)
            nn.init.normal_(module.proj.weight, mean=0.0, std=std)
        elif module is self and cfg.scheme == "mesh" and cfg.router_init == "base":  # visited last
            bias = math.log(9 * (cfg.slots - 1))
            slot = 1 if cfg.cycle == "routed" else 2  # the slot of the first router
            with torch.no_grad():
                for i, router in enumerate(self.routers):
                    router.write.bias[slot + i] = bias
                    router.read.bias[slot + i] = bias

    def compute_dtype(self, device_type):
        """The dtype the Linear layers compute in, so also q, k and v (the rotary tables and the
        KV cache are made in it): autocast's where it is on, else the weights'."""
        on = torch.is_autocast_enabled(device_type)
        return torch.get_autocast_dtype(device_type) if on else self.lm_head.weight.dtype

    def num_params(self, non_embedding=True):  # non-embedding: all but wte and lm_head
        n = sum(p.numel() for p in self.parameters())
        return n - (self.wte.weight.numel() + self.lm_head.weight.numel() if non_embedding else 0)

    def run(self, blocks, x, layer, rope, cache):
        """Apply `blocks` in order; `layer` counts applied blocks, each its own KV cache entry."""
        for block in blocks:
            if self.grad_checkpoint and self.training:
                x = checkpoint(block, x, rope, cache, layer, use_reentrant=False)
            else:
                x = block(x, rope, cache, layer)
            layer += 1
        return x, layer

    def forward(self, idx, targets=None, pos=None, cache=None):
        """idx (B, T) token ids -> (logits (B, T, V), loss or None); pos (T,), cache: decoding."""
        cfg = self.config
        T = idx.size(1)
        if T > cfg.block_size:  # (refuse's message, made every call, would pin T when compiled)
            raise ConfigError(f"idx has {T} positions but block_size is {cfg.block_size}; "
                              f"pass at most the last {cfg.block_size} tokens (as generate does)")
        rope = self.rotary(T, pos, self.compute_dtype(idx.device.type))  # one for every block
        if cache is not None:
            cache.seek(pos)
        tok = self.wte(idx)                                                   # (B, T, D)
        h_emb = tok * math.sqrt(cfg.n_embd) if cfg.scale_embeddings else tok  # Appendix B
        x, layer = self.run(self.prelude, h_emb, 0, rope, cache)              # f_pre(h_emb)
        h = x
        step0 = 0  # the router of loop step 0: routers[0], unless the cycle has its own
        if cfg.scheme == "mesh":
            # Eq. 2: the buffer (B, T, S, D), S slots the shape of the state: slot 0 holds h_emb,
            # the others zero. [choice] slot0: h_emb scaled by sqrt(D) (Appendix B) or wte(idx).
            slot0 = h_emb if cfg.slot0 == "scaled" else tok
            mem = torch.stack([slot0] + [torch.zeros_like(h_emb)] * (cfg.slots - 1), dim=2)
            # [choice] The cycle "processes the prelude output" x: "routed" routes on x, writes it,
            # reads h(0) (K+1 router pairs, Table 5); "direct": h(0) = x, put in slot 1 (K pairs).
            if cfg.cycle == "routed":
                w_write, w_read = self.routers[0](x)                          # Eq. 3: (B, T, S)
                mem = buffer_write(mem, w_write, x)
                h = buffer_read(mem, w_read)
                step0 = 1
            else:
                mem[:, :, 1] = x                                              # h(0) = x, set above
        h0 = h
        for t, c in enumerate(self.schedule):
            h_m, layer = self.run(self.cores[c], h, layer, rope, cache)       # Eq. 4: f_t(h(t))
            if cfg.scheme == "mesh":  # route on h(t) (Eq. 3), write h_m, read h(t+1) (Eq. 5)
                w_write, w_read = self.routers[step0 + t](h)
                mem = buffer_write(mem, w_write, h_m)
                h = buffer_read(mem, w_read)
            else:  # the scheme's update rule, from the table at the top
                h = SCHEMES[cfg.scheme](h_m, h, h0, h_emb)
        out, layer = self.run(self.coda, h, layer, rope, cache)               # f_coda(h(K))

        logits = self.lm_head(self.ln_f(out))                                 # (B, T, V)
        loss = None
        if targets is not None:  # -1: a position without a target; autocast does this in float32
            loss = F.cross_entropy(logits.flatten(0, 1), targets.reshape(-1), ignore_index=-1)
        return logits, loss

    @torch.no_grad()
    def evaluate(self, batches, autocast=nullcontext()):
        """The mean loss of each (inputs, targets) batch in eval mode: train.py's, table1.py's."""
        training, losses = self.training, []
        self.eval()
        for x, y in batches:
            with autocast:
                losses.append(self(x, y)[1].float().item())
        self.train(training)
        return losses

    def configure_optimizer(self, weight_decay, lr, betas=(0.9, 0.95), device_type="cpu"):
        """AdamW with weight decay on matrices (Linear weights, embeddings) only, never on biases
        and LayerNorms (1-d): Appendix B; fused (one kernel for all) on CUDA and CPU. [choice] The
        routers' matrices decay too, as matrices; routers without decay: unmeasured."""
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [dict(params=[p for p in params if p.dim() >= 2], weight_decay=weight_decay),
                  dict(params=[p for p in params if p.dim() < 2], weight_decay=0.0)]
        return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=device_type in ("cuda", "cpu"))

    @torch.inference_mode()  # like no_grad, and also skips autograd's version counters
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, use_cache=True):
        """Append max_new_tokens sampled tokens to idx (B, T); temperature 0 is greedy. use_cache:
        the prompt is prefilled once, then each new token is one position; positions are absolute,
        so past block_size the last block_size are prefilled again each step. Same as without."""
        if not temperature >= 0 or (top_k is not None and top_k < 1):  # (not >= refuses nan)
            raise ConfigError(f"temperature={temperature} must be 0 (greedy) or more and "
                             f"top_k={top_k} at least 1 (or None for no limit)")
        L, cache = self.config.block_size, None
        for _ in range(max_new_tokens):
            T = idx.size(1)
            if not use_cache:
                logits, _ = self(idx[:, -L:])
            elif cache is None or T > L:  # (re-)prefill
                cache = KVCache(self, idx.size(0), L) if cache is None else cache
                pos = torch.arange(min(T, L), device=idx.device)
                logits, _ = self(idx[:, -L:], pos=pos, cache=cache)
            else:  # one new position
                pos = torch.tensor([T - 1], device=idx.device)
                logits, _ = self(idx[:, -1:], pos=pos, cache=cache)
            idx = torch.cat((idx, sample(logits[:, -1, :], temperature, top_k)), dim=1)
        return idx


def sample(logits, temperature=1.0, top_k=None):
    """logits (B, V) -> next token ids (B, 1); temperature 0 means argmax."""
    if temperature < 1e-38:  # 0, or 0 in float32 (as 1e-320 is)
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits.float()
    # the maximum shifted to 0 first: the same softmax, and a tiny temperature gives -inf, not nan
    logits = (logits - logits.amax(dim=-1, keepdim=True)) / temperature
    if top_k is not None:
        v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
        logits[logits < v[:, [-1]]] = -float("inf")
    return torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)


class KVCache:
    """Keys and values of every applied block (`4+8R2+4` caches 24 layers, not 16), preallocated
    so shapes never change while decoding; MeSH's buffer and routers act per position, so only
    attention needs one. forward calls seek(pos); each block writes there, attends by attn_mask."""

    def __init__(self, model, batch_size, max_len):
        cfg, device = model.config, model.lm_head.weight.device
        dtype = model.compute_dtype(device.type)  # as the blocks make them: no cast per update
        shape = (cfg.shape.depth, batch_size, cfg.n_head, max_len, cfg.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)  # (layers, B, H, L, hd)
        self.v = torch.zeros_like(self.k)
        causal = torch.ones(max_len, max_len, dtype=torch.bool, device=device).tril()
        # additive (0 or -inf), not boolean: SDPA would convert a boolean mask in every block
        self.mask = torch.zeros_like(causal, dtype=dtype).masked_fill(~causal, -math.inf)
        self.pos = self.attn_mask = None

    def seek(self, pos):  # pos (T,): the positions of this forward's tokens
        refuse(pos is None, "decoding with a KVCache needs pos, the positions (T,) of idx")
        self.pos, self.attn_mask = pos, self.mask[pos]  # (T,), (T, L): each sees positions <= own

    def update(self, layer, k, v):  # k, v (B, H, T, hd) at self.pos -> all of them (B, H, L, hd)
        self.k[layer].index_copy_(2, self.pos, k)
        self.v[layer].index_copy_(2, self.pos, v)
        return self.k[layer], self.v[layer]


def summary(cfg):
    """The layout, block by block, and the parameter counts of the paper's Table 5 (no weights)."""
    plain = {k: v for k, v in cfg.to_dict().items() if k not in MESH_CHOICES}  # base takes none
    vanilla_cfg = Config(**{**plain, "layout": str(cfg.shape.depth), "scheme": "base"})
    with torch.device("meta"):
        model, vanilla = RecursiveGPT(cfg), RecursiveGPT(vanilla_cfg)
    s, spans = cfg.shape, []
    start = 0  # the first block of each part
    for n in (s.prelude, *s.cores, s.coda):  # the unique blocks in order: prelude, each core, coda
        spans.append(f"blocks {start}-{start + n - 1}" if n else "(none)")
        start += n
    slots = f", {cfg.slots} slots" if cfg.scheme == "mesh" else ""
    lines = [f"layout {cfg.layout}, scheme {cfg.scheme}{slots}", f"  prelude  {spans[0]}"]
    for t, c in enumerate(s.schedule):
        shared = s.schedule.index(c) != t  # a core an earlier step ran already
        lines.append(f"  step {t:<3} core {c}: {spans[1 + c]}" + (" (shared)" if shared else ""))
    ne, vne = model.num_params(), vanilla.num_params()
    routers = sum(p.numel() for n, p in model.named_parameters() if n.startswith("routers."))
    lines += [f"  coda     {spans[-1]}", f"compute depth {s.depth}, unique layers {s.unique}",
              f"total params          {model.num_params(False):>15,}",
              f"non-embedding params  {ne:>15,}  "
              f"({100 * ne / vne:.2f}% of vanilla {s.depth}-layer: {vne:,})",
              f"router params         {routers:>15,}"]
    return "\n".join(lines)


if __name__ == "__main__":  # any other model: python tools/draw.py --model=... --layout=...
    print(summary(Config.from_preset("classroom")))
