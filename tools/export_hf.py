"""
A trained run as a Hugging Face folder, which transformers loads offline:

    python tools/export_hf.py --out_dir=out --to=hf-out  # --ckpt=ITER: a kept one
    AutoModelForCausalLM.from_pretrained("hf-out", trust_remote_code=True)

A vanilla run (layout L, scheme base) becomes GPTNeoXForCausalLM, the sqrt(D) scale
of Appendix B folded into embed_in (train.py --init_from=hf: reads it back); any
other, mesh.py itself behind tools/modeling_nanomesh.py (trust_remote_code). With
it goes a tokenizer.json that gives the run's own ids.
"""

import json
import math
import os
import sys
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # python tools/X.py: the project's modules are one folder up
from configurator import UsageError, setting  # noqa: E402
from data.bpe import bytes_to_unicode  # noqa: E402
from data.meta import Tokenizer  # noqa: E402
from data.trained_on import checkpoint_dataset  # noqa: E402
from support import command, files, tool  # noqa: E402
from support.pretrained import neox_names, regroup  # noqa: E402

CODE = "modeling_nanomesh"  # tools/CODE.py, beside mesh.py in the folder
EOT = "<|endoftext|>"


@dataclass
class ExportConfig:
    """Write a run's model and tokenizer as a Hugging Face folder."""
    out_dir: str = setting("out", "the run's folder", path=True)
    to: str | None = setting(None, "the folder to write", path=True)
    ckpt: int | None = setting(None, "a kept checkpoint's iteration; None: latest")
    data_root: str | None = setting(None, "its data's folder; None: where it trained",
                                    path=True)
    unfinished: bool = setting(False, tool.UNFINISHED)
    overwrite: bool = setting(False, "replace the model folder --to holds")


def neox(cfg, sd):
    """A vanilla model as GPT-NeoX's config.json and weights: the same logits."""
    L, D = cfg.shape.prelude, cfg.n_embd
    state = {hf: sd[ours] for ours, hf in neox_names(L).items()}
    if cfg.scale_embeddings:  # forward's float32 product, once for every row
        state["gpt_neox.embed_in.weight"] = sd["wte.weight"] * math.sqrt(D)
    for name in [n for n in state if "query_key_value" in n]:
        state[name] = regroup(state[name], 3, cfg.n_head)
    rope = {"rope_type": "default", "rope_theta": cfg.rotary_base,
            "partial_rotary_factor": cfg.rotary_pct}
    return {"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox",
            "hidden_size": D, "num_attention_heads": cfg.n_head,
            "num_hidden_layers": L, "intermediate_size": 4 * D,
            "max_position_embeddings": cfg.block_size, "rope_parameters": rope,
            "use_parallel_residual": cfg.parallel_residual,
            "hidden_act": "gelu", "tie_word_embeddings": False,
            # transformers 4's names for rope_parameters
            "rotary_pct": cfg.rotary_pct, "rotary_emb_base": cfg.rotary_base}, state


def tokenizer_json(tok):
    """The run's ids as a tokenizer.json: a bpe dataset's own file; GPT-2's BPE
    from tiktoken's ranks; or a character vocabulary, a BPE without merges."""
    if tok.kind == "bpe":
        return files.read_text(tok.path)
    model = {"type": "BPE", "merges": []}
    spec = {"added_tokens": [], "decoder": {"type": "Fuse"}}  # Fuse: joined as they are
    if tok.kind == "char":
        model["vocab"] = {c: i for i, c in enumerate(tok.chars)}
    else:  # tiktoken merges any neighbours that make a token, lowest rank first
        import tiktoken  # (GPT-2's, loaded as the run's Tokenizer did: its rank is its id)
        enc, show = tiktoken.get_encoding(tok.to_meta()["encoding"]), bytes_to_unicode()
        ranks = {enc.decode_bytes([i]): i for i in range(enc.n_vocab) if i != tok.eot_id}
        text = lambda b: "".join(show[x] for x in b)  # noqa: E731
        model["vocab"] = {text(t): i for t, i in ranks.items()}
        for t in sorted(ranks, key=ranks.get):
            model["merges"] += [f"{text(t[:i])} {text(t[i:])}"
                                for i in range(1, len(t))
                                if t[:i] in ranks and t[i:] in ranks]
        spec["pre_tokenizer"] = spec["decoder"] = {
            "type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
            "use_regex": True}
        flags = ("single_word", "lstrip", "rstrip", "normalized")
        spec["added_tokens"] = [{"id": tok.eot_id, "content": EOT, "special": True,
                                 **dict.fromkeys(flags, False)}]
    return json.dumps({"version": "1.0", **spec, "model": model}, ensure_ascii=False)


def folder(model, tok, remote):
    """{name: text or bytes} of every file the folder holds."""
    try:
        from safetensors.torch import save
    except ImportError:
        raise UsageError("model.safetensors needs: pip install safetensors") from None
    cfg, sd = model.config, model.state_dict()
    eos = {"bos_token_id": tok.eot_id, "eos_token_id": tok.eot_id}
    config, state = neox(cfg, sd) if not remote else ({
        "architectures": ["NanoMeshForCausalLM"], "model_type": "nanomesh",
        "auto_map": {"AutoConfig": f"{CODE}.NanoMeshConfig",
                     "AutoModelForCausalLM": f"{CODE}.NanoMeshForCausalLM"},
        "mesh": cfg.to_dict()}, sd)
    # the tokenizer's identity: what support/pretrained.py compares
    config.update(eos, vocab_size=cfg.vocab_size, nanomesh_tokenizer=tok.identity)
    eot = {} if tok.eot_id is None else {"eos_token": EOT}
    out = {"config.json": config,
           # a recursive model runs its whole window at each step, no cache
           "generation_config.json": {**eos, "use_cache": not remote},
           "model.safetensors": save({k: v.contiguous() for k, v in state.items()},
                                     metadata={"format": "pt"}),
           "tokenizer.json": tokenizer_json(tok),
           "tokenizer_config.json": {"tokenizer_class": "PreTrainedTokenizerFast",
                                     "clean_up_tokenization_spaces": False, **eot}}
    if remote:
        for name, at in (("mesh.py", ""), (f"{CODE}.py", "tools")):
            out[name] = files.read_text(os.path.join(ROOT, at, name))
    return {name: json.dumps(v, indent=1) if isinstance(v, dict) else v
            for name, v in out.items()}


def check_target(ec):
    """Refuse a --to on the run's folder, or one to replace but a model's."""
    if not ec.to:
        raise UsageError("name the folder to write: --to=DIR")
    to, run = os.path.realpath(ec.to), os.path.realpath(ec.out_dir)
    try:
        common = os.path.commonpath([to, run])
    except ValueError:  # Windows: two drives, nothing in common
        common = None
    if common in (to, run):
        how = "is" if to == run else "is inside" if common == run else "holds"
        raise UsageError(f"--to={ec.to} {how} the run's folder {ec.out_dir}; "
                         f"give a folder of its own")
    tool.check_writable(ec.to, "to", folder=True)
    up = os.path.dirname(to)  # place() renames in it
    if os.path.isdir(to) and not os.access(up, os.W_OK):
        raise UsageError(f"cannot write --to={ec.to}: no permission in {up}")
    full = os.path.isdir(to) and os.listdir(to)
    if full and not ec.overwrite:
        raise UsageError(f"--to={ec.to} is not empty; give a new folder, or "
                         f"--overwrite=true to replace the model folder there")
    if full and not os.path.isfile(os.path.join(to, "config.json")):
        raise UsageError(f"--to={ec.to} holds no config.json, so no model "
                         f"folder to replace; give a new folder")


def place(tmp, to):
    """The folder tmp renamed to `to`; one there (--overwrite) aside first."""
    old = files.temporary_name(to, folder=True) if os.path.exists(to) else None
    tool.hold()  # a signal waits for both renames
    try:
        if old:  # Windows renames onto no folder
            os.replace(to, os.path.join(old, "old"))
        os.replace(tmp, to)
    finally:
        tool.release()
    if old:
        files.remove(old)


def export(given):
    ec = ExportConfig(**given)
    check_target(ec)
    model, ckpt, state = tool.load_run(
        ec.out_dir, "cpu", "export_hf.py", ec.unfinished, ec.ckpt)
    tok = Tokenizer.load(checkpoint_dataset(
        ckpt["train_config"], ckpt.get("data"), ec.data_root))
    cfg = model.config
    # GPT-NeoX would drop out its embeddings too: a run with dropout keeps mesh.py
    remote = bool(cfg.shape.cores or cfg.shape.coda or cfg.dropout)
    written = folder(model, tok, remote)
    os.makedirs(os.path.dirname(os.path.abspath(ec.to)), exist_ok=True)
    tmp = files.temporary_name(ec.to, folder=True)
    try:
        for name, data in written.items():
            mode = "wb" if isinstance(data, bytes) else "w"
            files.atomic_write(os.path.join(tmp, name), lambda f: f.write(data), mode)
        place(tmp, ec.to)
    finally:
        files.remove(tmp)  # (gone, once in place)
    how = f"{CODE}.py: trust_remote_code" if remote else "GPTNeoXForCausalLM"
    print(f"wrote {ec.to}: {cfg.layout} {cfg.scheme} as {how}, iter "
          f"{ckpt['iter_num']}{', ' + state if state else ''}")


def main(argv):
    return command.main("tools/export_hf.py", export, argv, ExportConfig)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
