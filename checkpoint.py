"""
Checkpoints: the one writer and the one loader that train.py, sample.py, probe.py, table1.py and
lm_eval_mesh.py share, and the import of Hugging Face GPT-NeoX / Pythia folders.

    from checkpoint import load_checkpoint, load_hf
    model, ckpt = load_checkpoint("out")            # OUT_DIR/ckpt.pt, written by train.py
    model = load_hf("path/to/pythia-160m")          # a vanilla RecursiveGPT with Pythia's weights

A checkpoint is a torch.save'd dict of tensors and plain data (model_config, train_config, ...),
written atomically and loaded with weights_only=True: loading never runs code. Loading also checks
the zip's CRC-32s and that the weights are finite, so a damaged file is refused, not used.
"""

import json
import os
import shlex
import uuid
import zipfile

import torch

from configurator import why_write_failed
from mesh import Config, RecursiveGPT


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
    except BaseException as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        if isinstance(e, (OSError, RuntimeError)):  # the zip writer reports a full disk as a RuntimeError
            raise CheckpointError(f"could not write {path}: {why_write_failed(e, folder)}; the previous "
                                  f"checkpoint there, if any, is unchanged") from None
        raise


def load_checkpoint(out_dir, device="cpu"):
    """Load OUT_DIR/ckpt.pt (weights_only: loading never runs code) -> (model, checkpoint dict)."""
    path = os.path.join(out_dir, "ckpt.pt")
    if not os.path.isfile(path):
        raise CheckpointError(f"no checkpoint at {path}; train one with: "
                              f"python train.py {shlex.quote('--out_dir=' + out_dir)}")
    try:
        # torch.load does not check the zip's CRC-32s: a flipped bit in a tensor would load silently
        with zipfile.ZipFile(path) as z:
            damaged = z.testzip()
        if damaged:
            raise ValueError(f"{damaged} fails its CRC-32 check")
        ckpt = torch.load(path, map_location=device, weights_only=True)
        missing = {"model", "model_config", "train_config"} - set(ckpt)
        if missing:
            raise KeyError(f"no {', '.join(sorted(missing))}")
        model = RecursiveGPT(Config.from_dict(ckpt["model_config"]))
        model.load_state_dict(ckpt["model"])
        bad = next((k for k, v in ckpt["model"].items() if v.is_floating_point() and not v.isfinite().all()), None)
        if bad:  # train.py never saves one; an older or foreign file may hold one, and sampling would crash
            raise ValueError(f"weight {bad} is not finite")
    except Exception as e:  # truncated zip, foreign file, missing keys, ...
        raise CheckpointError(f"{path} is corrupt or not a nanoMeSH checkpoint "
                              f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                              f"delete it or point --out_dir at another run") from None
    return model.to(device), ckpt


def check_resumable(ckpt, path, optimizer=None):
    """Raise CheckpointError unless ckpt (loaded from path) holds what a resumed run needs: iter_num,
    best_val_loss, rng and optimizer, whose state (given the new `optimizer`) matches its parameters' shapes."""
    problem = None
    kinds = {"iter_num": int, "best_val_loss": float, "rng": dict, "optimizer": dict}
    missing = [k for k, kind in kinds.items() if not isinstance(ckpt.get(k), kind)]
    if missing:
        problem = f"no valid {', '.join(missing)}"
    elif not torch.is_tensor(ckpt["rng"].get("torch")) or ckpt["rng"]["torch"].dtype != torch.uint8:
        problem = "no torch RNG state"
    elif optimizer is not None:
        problem = _optimizer_mismatch(ckpt["optimizer"], optimizer)
    if problem:
        raise CheckpointError(f"{path} cannot be resumed: {problem}; it is damaged or was not written by "
                              f"train.py (sample.py can still use its weights)")


def _optimizer_mismatch(saved, optimizer):
    """What in a saved optimizer state_dict does not fit `optimizer`'s parameters, or None."""
    groups, state = saved.get("param_groups"), saved.get("state")
    if not isinstance(groups, list) or not isinstance(state, dict):
        return "the optimizer state has no param_groups or state"
    ours = optimizer.param_groups
    if len(groups) != len(ours) or any(len(g.get("params", ())) != len(o["params"]) for g, o in zip(groups, ours)):
        return "the optimizer's parameter groups differ from the model's"
    params = {i: p for g, o in zip(groups, ours) for i, p in zip(g["params"], o["params"])}
    for i, entry in state.items():
        if i not in params or not isinstance(entry, dict):
            return f"optimizer state for an unknown parameter {i!r}"
        for k, v in entry.items():
            if torch.is_tensor(v) and v.dim() > 0 and v.shape != params[i].shape:
                return (f"the optimizer's {k} of parameter {i} has shape {tuple(v.shape)}, the parameter "
                        f"{tuple(params[i].shape)}")
    return None


# -----------------------------------------------------------------------------
# Importing Hugging Face GPT-NeoX / Pythia checkpoints, without transformers

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
    # Tied embeddings: our lm_head is untied, as Pythia's, so it starts as a copy of wte and trains apart.
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


def load_hf(path, device="cpu"):
    """A Hugging Face GPT-NeoX checkpoint folder (a Pythia download is one) as a vanilla RecursiveGPT:
    layout 'L', scheme 'base', scale_embeddings off, so its logits are the original model's. Its config
    is a plain Config, so training can continue. See from_hf_neox."""
    cfg, state = from_hf_neox(path)
    model = RecursiveGPT(cfg)
    model.load_state_dict(state)
    return model.to(device)
