"""
routing.py: what a recursive model does to each token of one sentence, loop step by loop step.

    python tools/routing.py --out_dir=runs/class/base_3+2R3+3_s0 \
        --out_dir=runs/class/mesh_3+2R3+3_s0 \
        --text="The return statement leaves a function" --json=routing.json --png=routing.png

For each checkpoint, per token: its effort (probe.py's Fig. 3, token by token), MeSH's write and
read weight of every buffer slot (Eq. 3) for the transitional cycle and each loop step, and the
top next token had the model stopped after loop step t (an early exit through the coda, not the
paper's method). Without --text: a window of the validation split, from the start of a line.
A table on stdout, the numbers as JSON (--json), one figure with matplotlib (--png).
"""

import os
import sys
from dataclasses import dataclass

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configurator import UsageError, check_ranges, setting  # noqa: E402
from data.dataset import load_split  # noqa: E402
from data.meta import Tokenizer  # noqa: E402
from data.trained_on import checkpoint_dataset  # noqa: E402
from support import command  # noqa: E402
from support.capture import capture, readout  # noqa: E402
from tools.curves import pyplot  # noqa: E402
from tools.probe import (RunsConfig, each_run, relative_update,  # noqa: E402
                         save_figure, title, unfinished)

SCAN = 100_000  # tokens searched for a line's start, at most
SHOWN = {" ": "␣", "\n": "⏎", "\t": "⇥"}


def token_text(tokenizer, i):
    """Token id i as a slide shows it: whitespace made visible; the model's padding <pad>."""
    if i >= tokenizer.vocab_size:
        return "<pad>"
    return "".join(SHOWN.get(c, c) for c in tokenizer.decode([i]))


@torch.no_grad()
def routing(model, idx):
    """idx (1, T) -> {"effort": {part: [T floats]}, "routers": {name: {"write", "read": [T x B]}}
    or None, "predicted": [T token ids] after each loop step t}."""
    model.eval()
    with capture(model) as cap:
        model(idx)
    # each token a (1, D) state: (1, T, 1, D) -> (T,)
    effort = {name: relative_update(h.unsqueeze(-2), fh.unsqueeze(-2))[0].tolist()
              for name, h, fh in cap["blocks"]}
    routers = {name: {"write": w_write[0].double().tolist(),    # (T, B)
                      "read": w_read[0].double().tolist()}      # (T, B)
               for name, w_write, w_read in cap["routers"]} or None
    predicted = [logits[0].argmax(-1).tolist() for logits in readout(model, cap)]  # (T,) each
    return {"effort": effort, "routers": routers, "predicted": predicted}


def sentence(ckpt, model, a):
    """The token ids (1, T) to show, and the tokenizer: --text's, or without it a validation window
    from the first line that starts with a letter at or after a seeded start (within SCAN tokens):
    a slide shows words, not the middle of a run of spaces."""
    folder = checkpoint_dataset(ckpt["train_config"], ckpt.get("data"), a.data_root)
    tokenizer = Tokenizer.load(folder)
    T = model.config.block_size
    if a.text:
        ids = tokenizer.encode(a.text)  # a character not in a char vocabulary: one line naming it
        if not 0 < len(ids) <= T:
            raise UsageError(f"--text is {len(ids)} tokens; give 1 to {T} (the model's "
                             "block_size)")
        return torch.tensor([ids]), tokenizer
    val, length = load_split(folder, "val"), min(a.tokens, T)
    if len(val) < length:
        raise UsageError(f"the validation split has {len(val)} tokens, fewer than "
                         f"--tokens={length}")
    start = int(np.random.default_rng(a.seed).integers(0, len(val) - length + 1))
    for p in range(start, min(start + SCAN, len(val) - length)):
        line_ends = tokenizer.decode([int(val[p])]).endswith("\n")
        if line_ends and tokenizer.decode([int(val[p + 1])])[:1].isalpha():
            start = p + 1
            break
    return torch.from_numpy(np.asarray(val[start:start + length], dtype=np.int64))[None], tokenizer


def routing_checkpoint(run, a):
    """routing() of a run opened(), as RoutingConfig a asks."""
    model, ckpt, result = run
    model = model.to(a.device)
    idx, tokenizer = sentence(ckpt, model, a)
    seen = routing(model, idx.to(a.device))
    text = lambda ids: [token_text(tokenizer, i) for i in ids]
    return {**result, "n_slots": model.config.slots if result["scheme"] == "mesh" else None,
            "ids": idx[0].tolist(), "tokens": text(idx[0].tolist()), **seen,
            "predicted_tokens": [text(ids) for ids in seen["predicted"]]}


def report(r):
    w = max(5, *(len(t) + 1 for t in r["tokens"]))  # a column per token
    row = lambda label, cells: f"{label:<14}" + "".join(f"{c:>{w}}" for c in cells)
    lines = [f"== {r['out_dir']}{unfinished(r)}: layout {r['layout']}, scheme {r['scheme']}, "
             f"{len(r['tokens'])} tokens of {r['dataset']} ==", row("token", r["tokens"]),
             "effort (relative update, per token):"]
    lines += [row(f"  {part}", [f"{v:.2f}" for v in values])
              for part, values in r["effort"].items()]
    lines.append("top next-token prediction, stopped after loop step t (early exit through the "
                 "coda, not the paper's method; * the trained K):")
    lines += [row(f"  t={t}" + "*" * (t == r["n_steps"]), cells)
              for t, cells in enumerate(r["predicted_tokens"])]
    if r["routers"]:
        lines.append(f"routing (the slot of the largest weight, m0 .. m{r['n_slots'] - 1}, "
                     f"per token):")
        for name, weights in r["routers"].items():
            for kind in ("write", "read"):
                top = [f"m{np.argmax(p)}" for p in weights[kind]]  # p: a token's weights
                lines.append(row(f"  {name} {kind}", top))
    return "\n".join(lines)


def write_png(results, path):
    """One figure: each checkpoint's per-token effort, then its predictions after each step; below,
    a row per MeSH router with its write and read weights."""
    if not (plt := pyplot("routing.py", "figure, only the numbers")):
        return

    routers = [(r, *router) for r in results if r["routers"] for router in r["routers"].items()]
    rows, cols = 2 + len(routers), max(2, len(results))  # a row per router below
    T = max(len(r["tokens"]) for r in results)
    fig, axes = plt.subplots(rows, cols, figsize=(max(8, 0.32 * T * cols), 2.6 + 1.8 * rows),
                             squeeze=False, layout="constrained")
    top = max(max(v for values in r["effort"].values() for v in values) for r in results)

    def tokens_axis(ax, r):
        ax.set_xticks(range(len(r["tokens"])), r["tokens"], fontsize=9, fontfamily="monospace")
        ax.set_xlabel("token")

    for ax, r in zip(axes[0], results):
        parts = list(r["effort"])
        im = ax.imshow(np.array([r["effort"][p] for p in parts]), vmin=0, vmax=top, cmap="viridis",
                       aspect="auto")
        ax.set_yticks(range(len(parts)), parts)
        ax.set_ylabel("part of the model")
        tokens_axis(ax, r)
        ax.set_title(f"{title(r, ': ')}\neach token's relative update, part by part", fontsize=10)
    fig.colorbar(im, ax=axes[0].tolist(), label="relative update (0: unchanged)", shrink=0.9)
    for r, ax in zip(results, axes[1]):  # the token in each cell, green where it comes next
        hit = np.array([[p == n for p, n in zip(ids, r["ids"][1:])] + [np.nan]  # the last: none
                        for ids in r["predicted"]], dtype=float)
        ax.imshow(hit, vmin=0, vmax=2.5, cmap="Greens", aspect="auto")
        for t, cells in enumerate(r["predicted_tokens"]):
            for j, text in enumerate(cells):
                ax.text(j, t, text, ha="center", va="center", fontsize=9, fontfamily="monospace")
        steps = [f"t={t}" + "*" * (t == r["n_steps"]) for t in range(len(hit))]
        ax.set_yticks(range(len(hit)), steps)
        ax.set_ylabel("stopped after loop step")
        tokens_axis(ax, r)
        ax.set_title(f"{title(r, ': ')}\ntop next-token prediction after each loop step "
                     f"(early exit; green: the next token; * trained K)", fontsize=10)
    for row, (r, name, weights) in zip(axes[2:], routers):
        for ax, kind in zip(row, ("write", "read")):
            im = ax.imshow(np.array(weights[kind]).T, vmin=0, vmax=1, cmap="magma",  # (B, T)
                           aspect="auto")
            ax.set_yticks(range(r["n_slots"]), [f"m{b}" for b in range(r["n_slots"])])
            ax.set_ylabel("buffer slot")
            tokens_axis(ax, r)
            what = "writes its output to" if kind == "write" else "reads its next state from"
            ax.set_title(f"{title(r, ': ')}, {name}: how much each token {what} each slot",
                         fontsize=10)
        fig.colorbar(im, ax=row[:2].tolist(), label="routing weight", shrink=0.9)
    for ax in axes.flat:  # the cells of a row that no checkpoint's panel filled
        if not ax.has_data():
            ax.axis("off")
    fig.suptitle("One sentence, token by token: how much each part of the model changes each "
                 "token, what it predicts after each step, where MeSH's routers write and read it",
                 fontsize=12)
    save_figure(plt, fig, path, dpi=110)


@dataclass
class RoutingConfig(RunsConfig):
    """Each token's effort and MeSH routing on one sentence, checkpoints side by side."""
    text: str = setting("", "the sentence (any text); not given: a window of the validation split")
    tokens: int = setting(32, "the window's length without --text (at most block_size)")
    png: str | None = setting(None, "write the figure here (needs matplotlib)", path=True)

    def __post_init__(self):
        check_ranges(self, [("tokens", lambda v: v >= 1, "at least 1"),
                            ("seed", lambda v: v >= 0, "0 or more")])


def main(argv):
    return command.main("tools/routing.py", run, argv, RoutingConfig)


def run(given):
    a = RoutingConfig(**given)
    if "text" in given and not a.text:
        raise UsageError("--text is empty; give a sentence, or leave --text out for a window of "
                         "the validation split")
    results = each_run(a, routing_checkpoint, report, dict(ending=".png"),
                       "routing.py")
    if a.png:
        write_png(results, a.png)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
