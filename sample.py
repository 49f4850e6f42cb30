"""
Sample text from a trained nanoMeSH checkpoint.

    python sample.py --out_dir=out --start="ROMEO:" --num_samples=3 --max_new_tokens=300
    python sample.py --out_dir=out --start=FILE:prompt.txt --temperature=0.8 --top_k=50

Decodes with the tokenizer of the dataset the checkpoint trained on (its meta.json), and uses the
KV cache (one entry per applied block) for fast decoding; --compile=true compiles the model first
(the prompt and the one-token steps each get one graph).
"""

import os
import sys
from dataclasses import dataclass

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # even if PYTHONSAFEPATH=1
from configurator import UsageError, check_ranges, setting
from data.meta import Tokenizer
from data.trained_on import checkpoint_dataset
from support import command, files
from support.device import resolve_device
from support.tool import UNFINISHED, check_decode, load_run

PROMPT_BYTES = 1 << 20  # a prompt file's largest size: far more text than any block_size holds


@dataclass
class SampleConfig:
    """Settings for sampling from OUT_DIR/ckpt.pt."""
    out_dir: str = setting("out", "the run's folder, holding its checkpoint", path=True)
    ckpt: int | None = setting(None, "a kept checkpoint's iteration (--keep_every); None: latest")
    data_root: str | None = setting(None, "its data's folder; None: where it trained", path=True)
    start: str = setting("\n", "the prompt, or FILE:path to read it from a file")
    num_samples: int = setting(1, "samples to draw")
    max_new_tokens: int = setting(300, "tokens to add to the prompt")
    temperature: float = setting(0.8, "sampling temperature; 0 is greedy")
    top_k: int | None = setting(200, "sample among the k likeliest tokens; None: all")
    seed: int = setting(1337, "the sampling's random seed")
    device: str = setting("auto", "auto: cuda, then mps, then cpu")
    threads: int | None = setting(None, "CPU threads for torch; None: torch's (one per core)")
    compile: bool = setting(False, "torch.compile the forward: pays off for long generations")
    unfinished: bool = setting(False, UNFINISHED)
    debug: bool = setting(False, "show Python tracebacks for errors")

    def __post_init__(self):  # in range, before anything is read
        check_ranges(self, [
            ("num_samples", lambda v: v >= 1, "at least 1"),
            ("max_new_tokens", lambda v: v >= 0, "at least 0"),
            ("temperature", lambda v: v >= 0, "0 (greedy) or a finite number above it"),
            ("top_k", lambda v: v >= 1, "at least 1 (or None for no limit)"),
            ("threads", lambda v: v >= 1, "at least 1 (or None: torch's choice)"),
        ])


def complete(model, tokenizer, start, max_new_tokens, temperature=0.8, top_k=None, device="cpu",
             num_samples=1):
    """Continue the text `start` num_samples times -> the decoded strings (prompt included)."""
    ids = tokenizer.encode(start) or [tokenizer.eot_id or 0]  # empty: <|endoftext|>, or token 0
    idx = torch.tensor([ids] * num_samples, dtype=torch.long, device=device)  # (N, T)
    out = model.eval().generate(idx, max_new_tokens, temperature=temperature, top_k=top_k)
    return [tokenizer.decode(row.tolist()) for row in out]


def prompt(start):
    """--start: FILE:path -> that file's text (a regular UTF-8 file, at most PROMPT_BYTES: neither
    a FIFO nor /dev/zero can hang or fill the read); any other prompt as it is."""
    if not start.startswith("FILE:"):
        return start
    path = os.path.expanduser(start[5:])  # as every path setting
    try:
        return files.read_text(path, PROMPT_BYTES).removeprefix("\ufeff")
    except OSError as e:
        why = f"cannot be read: {e.strerror}"
    except files.PlainDataError as e:
        why = str(e)
    raise UsageError(f"the prompt file {path!r} {why}; give --start=FILE:path of a UTF-8 "
                     f"text file")


def sample(given):
    sc = SampleConfig(**given)
    device = resolve_device(sc.device)
    if sc.threads is not None:  # else torch's choice; on cores busy with other work, try 1
        torch.set_num_threads(sc.threads)
    # the run's latest once it is finished (unless --unfinished), or a kept one (--ckpt=ITER)
    model, ckpt, state = load_run(sc.out_dir, device, "sample.py", sc.unfinished, sc.ckpt)
    if state:
        print(f"sample.py: from {sc.out_dir}, {state}")
    if sc.compile:  # the KV cache is preallocated: every one-token step has one shape, one graph
        model.compile()
    data = checkpoint_dataset(ckpt["train_config"], ckpt.get("data"), sc.data_root)
    tokenizer = Tokenizer.load(data)
    start = prompt(sc.start if "start" in given else tokenizer.default_prompt)
    check_decode(model, len(start), sc.num_samples, sc.max_new_tokens, device)
    torch.manual_seed(sc.seed)
    for text in complete(model, tokenizer, start, sc.max_new_tokens, sc.temperature, sc.top_k,
                         device, sc.num_samples):
        print(text)
        print("---------------")


def main(argv):
    return command.main("sample.py", sample, argv, SampleConfig)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
