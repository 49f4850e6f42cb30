"""
A model from a pretrained vanilla one (this project's run, or a Hugging Face GPT-NeoX / Pythia
checkpoint), as itself or looped into a recursive model:

    model = pretrained.load_hf("path/to/pythia-160m")  # layout 'L', scheme 'base', unscaled
    python train.py --init_from=hf:path/to/pythia-160m --dataset=...   # fine-tune it
    python train.py --init_from=vanilla:out --layout=2+4R2+2 --scheme=mesh  # loop a run, uptrain

The fused query_key_value weight, [head][q|k|v][head_dim], becomes our [q | k | v] rows.
"""

import json
import os
import warnings

import torch

from support.files import plain_name, read_json
from support.memory import check_fits
from support.checkpoint import CheckpointError, build
from support.tool import load_run
from configurator import UsageError
from mesh import PRESETS, Config, ConfigError, RecursiveGPT

SHAPE = ("n_embd", "n_head")  # the source's, which flags cannot change
LOOPED = ("layout", "scheme", "n_slots", "cycle", "router_init", "slot0", "block_size", "dropout")
TOKENS = ("tokenizer", "encoding", "chars", "tokenizer_sha256")  # the same ids
# what each config.json field read must be (a bool is no number)
SIZE = (lambda x: type(x) is int and x > 0, "an integer above 0")
SHARE = (lambda x: type(x) in (int, float) and 0 <= x <= 1, "a number from 0 to 1")
ABOVE_0 = (lambda x: type(x) in (int, float) and 0 < x < float("inf"), "a finite number above 0")
FLAG = (lambda x: type(x) is bool, "true or false")  # text: compared below
FIELDS = {**dict.fromkeys(("hidden_size", "num_attention_heads", "num_hidden_layers",
                           "vocab_size", "max_position_embeddings", "intermediate_size"), SIZE),
          **dict.fromkeys(("rotary_pct", "partial_rotary_factor"), SHARE),
          **dict.fromkeys(("rotary_emb_base", "rope_theta", "layer_norm_eps"), ABOVE_0),
          **dict.fromkeys(("use_parallel_residual", "tie_word_embeddings", "attention_bias"),
                          FLAG),
          "rope_parameters": (lambda x: type(x) is dict, "an object")}


def from_hf_neox(path, weights=True):
    """A GPT-NeoX folder -> (Config, RecursiveGPT state_dict), refusing what we cannot express;
    weights=False: (Config, None), config.json's alone (a plan's: nothing loaded)."""
    where = f"cannot import {path}"
    hf = {}
    try:
        hf = read_json(os.path.join(path, "config.json"))
        D, H, L = hf["hidden_size"], hf["num_attention_heads"], hf["num_hidden_layers"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        if isinstance(hf, dict) and hf.get("model_type") == "nanomesh":  # tools/export_hf.py's
            raise CheckpointError(f"{where}: it holds a nanoMeSH model run by its own code "
                                  f"(mesh.py, trust_remote_code); hf: reads GPT-NeoX folders "
                                  f"only (Pythia's, or a vanilla run's export)") from None
        raise CheckpointError(f"{where}: no GPT-NeoX config.json there "
                              f"({type(e).__name__}: {e})") from None
    # transformers >= 5 moved rotary_pct / rotary_emb_base here
    rope = hf.get("rope_parameters", {})
    for config, within in [(hf, ""), (rope, "rope_parameters.")]:
        for field, (test, words) in FIELDS.items():
            if field in config and not test(config[field]):
                raise CheckpointError(f"{where}: config.json's {within}{field} is "
                                      f"{json.dumps(config[field])[:40]}, not {words}")
    for config, field, ours in [(hf, "model_type", "gpt_neox"), (hf, "intermediate_size", 4 * D),
                                (hf, "hidden_act", "gelu"),  # exact (erf)
                                (hf, "layer_norm_eps", 1e-5), (hf, "attention_bias", True),
                                (hf, "rope_scaling", None), (rope, "rope_type", "default")]:
        found = config.get(field, None if field == "model_type" else ours)
        if found != ours:
            raise CheckpointError(f"{where}: {field}={found!r} is not supported "
                                  f"(nanoMeSH has {field}={ours!r})")
    try:
        cfg = Config(vocab_size=hf.get("vocab_size", 0),
                     block_size=hf.get("max_position_embeddings", 2048), n_embd=D, n_head=H,
                     layout=str(L), scale_embeddings=False,
                     rotary_pct=rope.get("partial_rotary_factor", hf.get("rotary_pct", 0.25)),
                     rotary_base=float(rope.get("rope_theta", hf.get("rotary_emb_base", 10000.0))),
                     parallel_residual=hf.get("use_parallel_residual", True))
        if not weights:
            return cfg, None
        check_fits(cfg, None, "cpu", what="its config.json's model", fix="import a smaller one")
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{where}: {e}") from None
    try:  # optional: a pytorch_model.bin needs only torch
        from safetensors.torch import load_file
    except ImportError:
        load_file = None
    for name in ("model.safetensors", "pytorch_model.bin") if load_file else ["pytorch_model.bin"]:
        files = [name] if os.path.isfile(os.path.join(path, name)) else []
        index = os.path.join(path, name + ".index.json")
        if os.path.isfile(index):
            try:
                files = sorted(set(read_json(index)["weight_map"].values()))
                outside = next((f for f in files if not plain_name(f)), None)
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
                raise CheckpointError(f"{where}: {index} is not a weight index "
                                      f"({type(e).__name__}: {e})") from None
            if outside is not None:
                raise CheckpointError(f"{where}: {index} names {outside!r:.60}, "
                                      f"not a file of {path}")
        if files:
            break
    else:
        raise CheckpointError(f"{where}: no weights; expected model.safetensors "
                              f"(needs `pip install safetensors`) "
                              f"or pytorch_model.bin, or a sharded *.index.json")
    sd = {}
    for file in (os.path.join(path, f) for f in files):
        try:  # torch's warnings said only if it loads
            with warnings.catch_warnings(record=True) as said:
                sd.update(load_file(file) if file.endswith(".safetensors") else
                          torch.load(file, map_location="cpu", weights_only=True))
        # not a weights file, or a pickle that would run code (weights_only refuses it)
        except Exception as e:
            why = (str(e).strip() or type(e).__name__).splitlines()[0][:120]
            if type(e).__name__ == "UnpicklingError":
                why = "it holds objects other than tensors"
            raise CheckpointError(f"{where}: {file} is not a file of weights nanoMeSH reads "
                                  f"({why}; loading never runs code)") from None
        for w in said:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    # tied: lm_head read from wte's (load_hf copies it)
    head = ("gpt_neox.embed_in.weight" if hf.get("tie_word_embeddings") else
            "lm_head.weight" if "lm_head.weight" in sd else "embed_out.weight")  # memory, disk
    names = neox_names(L, head)
    absent = [theirs for theirs in names.values() if theirs not in sd]
    if absent:
        raise CheckpointError(f"{where}: {len(absent)} weight(s) missing, e.g. {absent[0]}")
    with torch.device("meta"):  # no memory: the shapes only
        want = RecursiveGPT(cfg).state_dict()
    for ours, theirs in names.items():
        w, shape = sd[theirs], tuple(want[ours].shape)
        if tuple(w.shape) != shape:
            raise CheckpointError(
                f"{where}: {theirs} has shape {tuple(w.shape)}, not {shape} "
                f"as config.json gives: the weights are of another model")
        if not (w.is_floating_point() and w.isfinite().all()):
            raise CheckpointError(f"{where}: {theirs} ({w.dtype}) holds NaN, inf or "
                                  f"non-float values; download the weights again")
    state = {ours: sd[theirs] for ours, theirs in names.items()}
    for name in [n for n in state if ".qkv." in n]:
        state[name] = regroup(state[name], H, 3)
    return cfg, state


def neox_names(L, head="embed_out.weight"):
    """A vanilla model's weight names (every layer a prelude block) -> GPT-NeoX's."""
    names = {"wte.weight": "gpt_neox.embed_in.weight", "lm_head.weight": head,
             "ln_f.weight": "gpt_neox.final_layer_norm.weight",
             "ln_f.bias": "gpt_neox.final_layer_norm.bias"}
    for i in range(L):
        for ours, theirs in [("ln_1", "input_layernorm"), ("ln_2", "post_attention_layernorm"),
                             ("attn.qkv", "attention.query_key_value"),
                             ("attn.proj", "attention.dense"),
                             ("mlp.fc", "mlp.dense_h_to_4h"), ("mlp.proj", "mlp.dense_4h_to_h")]:
            names.update({f"prelude.{i}.{ours}.{k}": f"gpt_neox.layers.{i}.{theirs}.{k}"
                          for k in ("weight", "bias")})
    return names


def regroup(t, outer, inner):
    """Fused QKV rows, (outer, inner, head_dim) -> (inner, outer, head_dim): GPT-NeoX's
    [head][q|k|v] (outer H, inner 3) -> our [q|k|v][head], and back (outer 3, inner H)."""
    return t.reshape(outer, inner, -1, *t.shape[1:]).transpose(0, 1).reshape(t.shape)


def load_hf(path, device="cpu"):
    """A GPT-NeoX folder as a vanilla RecursiveGPT whose logits are the original model's, built on
    the meta device and given the folder's tensors: its weights are held once."""
    cfg, state = from_hf_neox(path)
    # on device, as the model computes (Pythia's: float16)
    state = {k: v.to(device, torch.float32) for k, v in state.items()}
    if state["lm_head.weight"].data_ptr() == state["wte.weight"].data_ptr():  # tied: trains apart
        state["lm_head.weight"] = state["lm_head.weight"].clone()
    return build({"model_config": cfg.to_dict(), "model": state}, path).to(device)


def where(init_from, out_dir):
    """--init_from=vanilla:OUT_DIR (@ITER: its checkpoint of that iteration, as it is) or hf:PATH
    -> (init_from, kind, path, ITER or None), not out_dir; checked before out_dir (resolve), so
    that a run there is refused before the source is read or waited for."""
    kind, _, path = init_from.partition(":")
    head, _, at = path.rpartition("@")  # vanilla:OUT_DIR@ITER; any other @ is the path's own
    path, at = (head, int(at)) if kind == "vanilla" and head and at.isdecimal() else (path, None)
    if os.path.exists(path) and os.path.exists(out_dir) and os.path.samefile(path, out_dir):
        raise UsageError(f"--out_dir={out_dir} is the source --init_from={init_from}, which a run "
                         f"never writes over; choose another --out_dir")
    return init_from, kind, path, at


def source(found, given, weights=True):
    """where()'s -> {"model": the vanilla model, "source": what checkpoints keep, "data": its
    data's}; refused where the flags name another width or heads (SHAPE). weights=False: an hf
    source's on the meta device, from its config.json alone (a plan's)."""
    init_from, kind, path, at = found
    if kind == "hf" and not weights:
        with torch.device("meta"):
            model, record, data = RecursiveGPT(from_hf_neox(path, False)[0]), {}, None
    elif kind == "hf":
        model, record, data = load_hf(path), {}, None
    else:
        as_is = lambda it: f"loop it as is: --init_from={init_from}@{it or 'ITER'}"  # noqa: E731
        model, ckpt, _ = load_run(path, "cpu", "train.py", kept=at, as_is=as_is)
        record = {"iter_num": ckpt["iter_num"]}
        data = {**(ckpt.get("data") or {}), "dataset": ckpt["train_config"]["dataset"]}
    shape = model.config.shape
    if shape.cores or shape.coda or model.config.scheme != "base":
        raise UsageError(f"--init_from={init_from} is a {model.config.layout} "
                         f"{model.config.scheme} model, not a vanilla one (a plain layout such "
                         f"as 12, scheme base); loop a vanilla run")
    preset = PRESETS.get(given.get("model"), {})  # --model's width and heads
    for k in SHAPE:
        flag, want = (k, given[k]) if k in given else ("model", preset.get(k))
        have = getattr(model.config, k)
        if want not in (None, have):
            said = "" if k in given else f"'s {want}"
            raise UsageError(f"--init_from={init_from} has {k}={have}, not --{flag}="
                             f"{given[flag]}{said}: the width and heads are the source's; "
                             f"drop --{flag}")
    return {"model": model, "data": data, "source": {
        "init_from": f"{kind}:{os.path.abspath(path)}", "model_config": model.config.to_dict(),
        **record}}


def loop(start, tc, data=None):
    """The vanilla model of start (source()'s) as the model of --layout and --scheme: prelude its
    first P layers, coda its last Q, cores from its middle layers by --core_init (core_layers);
    data (the run's Dataset) refused if its tokens are not the source's."""
    if data is not None:
        check_tokens(start, data)
    source = start["model"]
    cfg, L = looped(source.config, tc), source.config.shape.prelude
    model = RecursiveGPT(cfg)  # the routers' init kept; the rest replaced
    theirs, state = source.state_dict(), model.state_dict()
    for block, layers in core_layers(cfg.shape, L, tc.core_init).items():
        for key in [k for k in state if k.startswith(block + ".")]:
            rest = key[len(block):]
            state[key] = sum(theirs[f"prelude.{i}{rest}"] for i in layers) / len(layers)
    for key in ("wte.weight", "ln_f.weight", "ln_f.bias", "lm_head.weight"):
        state[key] = theirs[key]
    model.load_state_dict(state)
    return model


def looped(old, tc):
    """The Config of --layout and --scheme over the vanilla source's Config old; refused where
    the layout needs more unique blocks than old has layers."""
    ours = {k: getattr(tc, k) for k in LOOPED if getattr(tc, k) is not None}
    try:  # scale_embeddings too: the sqrt(D) of Appendix B, off for Pythia's
        cfg = Config(**{**old.to_dict(), **ours})
    except ConfigError as e:
        raise UsageError(str(e)) from None
    if cfg.shape.unique > old.shape.prelude:
        raise UsageError(f"--layout={cfg.layout} needs {cfg.shape.unique} unique blocks, but "
                         f"--init_from={tc.init_from} has {old.shape.prelude} layers; loop fewer "
                         f"unique blocks")
    return cfg


def core_layers(shape, L, core_init):
    """{block of the new model: the source layers it starts as (their mean)}, for a layout shape
    from L layers. The unrolled model's middle positions are spread evenly over the L - P - Q
    middle layers; a core's block j stands for those of every position it runs at. [choice]
    stepwise (the default): the layer at j/C of its core's span (every K-th layer at equal depth),
    which keeps the source's order in each pass, the best looped init in Relaxed Recursive
    Transformers; average: the mean of the layers it stands for, mixing layers trained apart."""
    P, Q = shape.prelude, shape.coda
    blocks = {f"prelude.{i}": [i] for i in range(P)}
    blocks.update({f"coda.{i}": [L - Q + i] for i in range(Q)})
    middle = range(P, L - Q)
    unrolled = [(c, j) for c in shape.schedule for j in range(shape.cores[c])]
    stands = {}  # (core, block) -> the middle layers it stands for, in order
    for m, (c, j) in enumerate(unrolled):  # unrolled position m: its share of the middle layers
        start, end = m * len(middle) // len(unrolled), (m + 1) * len(middle) // len(unrolled)
        stands.setdefault((c, j), []).extend(middle[start:max(start + 1, end)])
    for (c, j), layers in stands.items():
        span = sorted({i for (d, _), ls in stands.items() if d == c for i in ls})
        blocks[f"cores.{c}.{j}"] = (layers if core_init == "average"
                                    else [span[j * len(span) // shape.cores[c]]])
    return blocks


def check_tokens(start, data):
    """Refuse data made with another tokenizer than the source's (start: source()'s dict)."""
    kind, _, path = start["source"]["init_from"].partition(":")
    tokenizer, name, ours = data.tokenizer, data.name, data.tokenizer.identity
    if kind == "vanilla":
        theirs = start["data"]
        differ = [k for k in TOKENS if k in theirs and theirs[k] != data.record.get(k)]
        if differ:
            raise UsageError(f"dataset {name!r} is not tokenized as the run in {path} "
                             f"({differ[0]} differs); uptrain on data made with its tokenizer, "
                             f"as its own dataset {theirs['dataset']!r} was")
    elif not os.path.isfile(os.path.join(path, "tokenizer.json")):
        if os.environ.get("RANK", "0") == "0" and tokenizer.kind == "gpt2":
            print("note: Pythia checkpoints use the GPT-NeoX tokenizer, not GPT-2's; "
                  "the ids of a GPT-2 dataset mean other tokens to them")
    # a run's export names its tokenizer (tools/export_hf.py), whose ids its tokenizer.json gives
    elif ours != read_json(os.path.join(path, "config.json")).get("nanomesh_tokenizer") and \
            ours != type(tokenizer)("bpe", path=path).identity:
        made = ("another tokenizer.json" if tokenizer.kind == "bpe"
                else f"the {tokenizer.kind} tokenizer")
        raise UsageError(f"dataset {name!r} was made with {made}, not the imported model's own "
                         f"({os.path.join(path, 'tokenizer.json')}); prepare it with that one: "
                         f"python data/prepare.py --dataset NAME --input FILE --tokenizer {path}")
