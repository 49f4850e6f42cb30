"""
What sample.py makes sure of before it decodes, each by one call: the checkpoint it reads is the
run's latest, the prompt file is plain text, and the decode fits in memory.

    model, ckpt = sampling.load(out_dir, device)  # ckpt.pt, unless a sharded one trained further
    start = sampling.prompt("FILE:prompt.txt")    # the file's text; any other prompt as it is
    sampling.check_memory(model, len(start), sc.num_samples, sc.max_new_tokens, device)
"""

import os
import shlex
import sys

from support import checkpoint, plain
from support.memory import device_memory
from configurator import UsageError

PROMPT_BYTES = 1 << 20  # a prompt file's largest size: far more text than any block_size holds


def load(out_dir, device, prog="sample.py"):
    """checkpoint.load(out_dir): OUT_DIR/ckpt.pt, which sample.py and tools/probe.py read. Where a
    sharded checkpoint (ckpt-sharded.json) stands beside it, the run's latest (checkpoint.latest,
    the rule a resume follows) is read: a sharded one is refused, naming consolidate.py, which
    writes ckpt.pt from it, unless ckpt.pt is its copy; otherwise a line on stderr says which one
    is used."""
    model, ckpt = checkpoint.load(out_dir, device)
    taken, full, pointer = checkpoint.latest(out_dir)
    if pointer is None:
        return model, ckpt
    full_iter, sharded = full[0], pointer["iter_num"]
    path = os.path.join(out_dir, checkpoint.CKPT)
    pointer_path = os.path.join(out_dir, checkpoint.POINTER)
    if taken == checkpoint.POINTER and full != checkpoint.saved(pointer):
        than = "has trained further than" if sharded > full_iter else "was saved after"
        raise UsageError(f"{pointer_path} (iter {sharded}) {than} {path} (iter "
                         f"{full_iter if full_iter >= 0 else 'unknown'}), which is what {prog} "
                         f"reads; write it from the sharded one first: python "
                         f"tools/consolidate.py {shlex.quote('--out_dir=' + out_dir)}")
    print(f"{prog}: using {path} (iter {full_iter}); the sharded checkpoint beside it "
          f"({pointer_path}, iter {sharded}) has not trained further", file=sys.stderr)
    return model, ckpt


def prompt(start):
    """--start: FILE:path -> that file's text (a regular file of at most PROMPT_BYTES of UTF-8, so
    that neither a FIFO nor /dev/zero can hang or fill the read); any other prompt as it is."""
    if not start.startswith("FILE:"):
        return start
    path = start[5:]
    try:
        return plain.read_text(path, PROMPT_BYTES)
    except OSError as e:
        why = f"cannot be read: {e.strerror}"
    except plain.PlainDataError as e:
        why = str(e)
    raise UsageError(f"the prompt file {path!r} {why}; give --start=FILE:path of a UTF-8 text file")


def decode_bytes(cfg, num_samples, length, element_size, weights):
    """The bytes a decode of num_samples sequences of `length` tokens (prompt and new ones) takes at
    its peak: the weights; the KV cache (a key and a value per applied block, num_samples x
    block_size x n_embd each); the prefill's logits (num_samples x block_size x vocab) and
    activations (the residual stream, MeSH's buffer, attention and the MLP); the token ids (int64,
    twice, as each step appends one) and one sequence as Python ints to decode it."""
    N, L, D = num_samples, cfg.block_size, cfg.n_embd
    cache = 2 * cfg.shape.depth * N * L * D * element_size + L * L * element_size
    logits = N * L * cfg.vocab_size * element_size + 3 * N * cfg.vocab_size * 4
    activations = N * L * D * (cfg.slots + 8) * 4
    return weights + cache + logits + activations + 2 * N * length * 8 + 40 * length


def check_memory(model, prompt_chars, num_samples, max_new_tokens, device):
    """Refuse a decode that cannot fit in the device's memory (decode_bytes against
    device_memory), before anything of it is allocated. A prompt counts as a token a character."""
    total, cfg = device_memory(device), model.config
    weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    need = decode_bytes(cfg, num_samples, max(1, prompt_chars) + max_new_tokens,
                        model.lm_head.weight.element_size(), weights)
    where = device if str(device).startswith("cuda") else "this machine"
    if total and need > total:
        raise UsageError(f"--num_samples={num_samples} and --max_new_tokens={max_new_tokens} need "
                         f"about {need / 2**30:,.1f} GiB to decode (the KV cache of "
                         f"{cfg.shape.depth} applied blocks, the logits, the tokens), more than "
                         f"the {total / 2**30:,.1f} GiB of {where}; use fewer samples or tokens")
