"""
probe.py: the MeSH paper's diagnostics (its Figures 3, 4 and 5, Section 3) for trained checkpoints.

    python tools/probe.py --out_dir=runs/base --out_dir=runs/mesh --num_samples=64 \
        --json=probe.json --png=figs

On N validation sequences (the same for every checkpoint of a dataset), from one forward pass with
state capture (support/capture.py), per sequence, in float64 (std: over the N, ddof 0):
- effort (Fig. 3): the relative update 2 ||f(h) - h||_F / (||f(h)||_F + ||h||_F) of every block
  application (prelude, each loop step, coda); 0: the block left its input alone.
- stagnation (Fig. 4): RBF-kernel CKA (Kornblith et al. 2019) between the states h_emb, h0 ... hK,
  out, each a (T x D) matrix whose T tokens are the examples.
- collapse (Fig. 5): the top-50 singular values of each state, divided by the largest.
- routers (mesh): each router's mean write and read weight per slot, and its routing entropy.
- loss, and step_loss: the loss had the model stopped after loop step t (an early exit through the
  coda, a probe, not the paper's method), on to 2K where a scheme can run on; MeSH stops at K.
Tables on stdout, the numbers as JSON (--json), figures with matplotlib (--png).
"""

import json
import math
import os
import sys
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configurator import UsageError, check_ranges, setting  # noqa: E402
from data.dataset import load_split, random_windows  # noqa: E402
from data.trained_on import checkpoint_dataset  # noqa: E402
from support import command, files, tool  # noqa: E402
from support.capture import capture, readout  # noqa: E402
from support.device import resolve_device  # noqa: E402
from support.memory import physical_memory  # noqa: E402
from tools.curves import colour, pyplot  # noqa: E402

# [choice] RBF bandwidth (the paper does not give it): SIGMA_FRAC x the median distance between
# distinct tokens of the state, so CKA ignores an isotropic scaling (the residual stream's norm
# grows). Kornblith et al. (2019) report 0.2, 0.4 and 0.8 x the median; 0.8, the widest, sees the
# global geometry of the T tokens, the least noisy at T = 64. Self-pairs and duplicate rows
# (repeated characters in h_emb) are left out: their zero distances would drag the median down.
SIGMA_FRAC = 0.8
TOP_K = 50         # singular values per state (Fig. 5)
CHUNK = 8          # sequences per forward pass


# -----------------------------------------------------------------------------
# Metrics: small pure functions on tensors; everything in float64

def relative_update(h, fh):
    """Effort (Fig. 3) over the last two dims: (T, D) -> scalar, (B, T, D) -> (B,)."""
    h, fh = h.double(), fh.double()
    norm = torch.linalg.matrix_norm  # Frobenius over the last two dims
    return 2 * norm(fh - h) / (norm(fh) + norm(h))


def centered_rbf_gram(X, sigma_frac=SIGMA_FRAC):
    """X (T, D) -> H K H (T, T), K_ij = exp(-||x_i - x_j||^2 / (2 sigma^2)), sigma = sigma_frac x
    the median nonzero pairwise distance, H = I - 11^T/T the centering matrix. All zeros when every
    row of X is the same (no distance to take a median of): such a state carries no information."""
    X = X.double()
    sq = (X * X).sum(-1)                                              # (T,)
    d2 = (sq[:, None] + sq[None, :] - 2 * X @ X.T).clamp_min(0)       # (T, T) squared distances
    i, j = torch.triu_indices(len(X), len(X), offset=1)
    pairs = d2[i, j]
    pairs = pairs[pairs > 1e-12 * sq.max()]  # noise of equal rows: no distance
    if pairs.numel() == 0:
        return torch.zeros_like(d2)
    # numpy's median: torch.quantile refuses over 2^24 distances (T >= 5794 tokens)
    sigma = sigma_frac * float(np.median(pairs.sqrt().cpu().numpy()))
    K = torch.exp(-d2 / (2 * sigma**2))                               # (T, T)
    return K - K.mean(0, keepdim=True) - K.mean(1, keepdim=True) + K.mean()


def cka_from_grams(Kc, Lc):
    """CKA = HSIC(K, L) / sqrt(HSIC(K, K) HSIC(L, L)) for centered grams; HSIC's 1/(T-1)^2 cancels.
    nan when either side is degenerate (all-zero centered gram)."""
    hsic = lambda A, B: (A * B).sum()   # tr(A B) for symmetric A, B
    den = torch.sqrt(hsic(Kc, Kc) * hsic(Lc, Lc))
    return (hsic(Kc, Lc) / den).item() if den > 0 else float("nan")


def spectrum(X, k=TOP_K):
    """Top min(k, T, D) singular values of X (..., T, D), divided by the largest."""
    s = torch.linalg.svdvals(X.double())                             # (..., min(T, D)), descending
    largest = s[..., :1].clamp_min(torch.finfo(s.dtype).tiny)  # an all-zero state gives zeros
    return (s / largest)[..., :k]


def validation_windows(ckpt, length, n, seed, data_root=None):
    """(n, length) int64 windows of the validation split the checkpoint trained on (refused by
    name if it changed since), at seeded positions: the same for every checkpoint of it."""
    val = load_split(checkpoint_dataset(ckpt["train_config"], ckpt.get("data"), data_root), "val")
    return torch.from_numpy(random_windows(val, length, n, seed))


def mean_std(rows):
    """Mean and population standard deviation over the first axis."""
    a = np.asarray(rows, dtype=np.float64)
    return a.mean(0), a.std(0)


@torch.no_grad()
def probe(model, idx, sigma_frac=SIGMA_FRAC):
    """Run the diagnostics on idx (N, T) -> a JSON-ready dict of their numbers."""
    model.eval()
    effort, cka, spec, losses = {}, [], {}, []
    routers = {}  # name -> sums over tokens of the slot weights and entropies, and the token count
    for chunk in idx.split(CHUNK):
        with capture(model) as cap:  # the targets: each token's next; the last has none (-1)
            _, loss = model(chunk, F.pad(chunk[:, 1:], (0, 1), value=-1))
        nxt = chunk[:, 1:].flatten()
        losses.append([loss.item(), *(F.cross_entropy(x[:, :-1].flatten(0, 1), nxt).item()
                                      for x in readout(model, cap))])
        for name, h, fh in cap["blocks"]:
            effort.setdefault(name, []).extend(relative_update(h, fh).tolist())
        labels = [name for name, _ in cap["states"]]
        for name, x in cap["states"]:
            spec.setdefault(name, []).extend(spectrum(x).cpu().numpy())
        for b in range(len(chunk)):
            grams = [centered_rbf_gram(x[b], sigma_frac) for _, x in cap["states"]]
            cka.append([[cka_from_grams(K, L) for L in grams] for K in grams])
        for name, *weights in cap["routers"]:
            w = torch.stack(weights).double().flatten(1, 2)           # (write and read, B T, S)
            acc = routers.setdefault(name, [0, 0, 0])
            acc[0] = acc[0] + w.sum(1)                                # (2, S)
            acc[1] = acc[1] - torch.special.xlogy(w, w).sum((1, 2))   # H = -sum_b w_b ln w_b
            acc[2] += w.shape[1]
    out = {"effort": {k: list(map(float, mean_std(v))) for k, v in effort.items()}}
    # a degenerate state gives nan CKA in every sample: null in the JSON
    matrix = torch.tensor(cka, dtype=torch.float64).nanmean(0).tolist()
    out["cka"] = {"labels": labels, "sigma_frac": sigma_frac, "matrix": json_ready(matrix)}
    means, stds = zip(*(mean_std(spec[k]) for k in labels))
    out["spectrum"] = {"labels": labels, "mean": [m.tolist() for m in means],
                       "std": [s.tolist() for s in stds]}
    out["routers"] = None
    if routers:
        n_slots = model.config.slots
        ro = out["routers"] = {"labels": list(routers), "n_slots": n_slots,
                               "max_entropy": math.log(n_slots)}
        for i, kind in enumerate(("write", "read")):
            ro[kind] = [(w[i] / n).tolist() for w, _, n in routers.values()]
            ro[f"entropy_{kind}"] = [(h[i] / n).item() for _, h, n in routers.values()]
    mean = np.average(losses, axis=0, weights=[len(c) for c in idx.split(CHUNK)])  # per sequence
    out.update(loss=float(mean[0]), step_loss=mean[1:].tolist())
    return out


def json_ready(value):
    """value with every float that is not finite as None: JSON has no NaN, and a measure of a
    degenerate state (all zeros, or a bandwidth that underflows) is no number."""
    return json.loads(json.dumps(value), parse_constant=lambda _: None)


def opened(out_dir, a, prog):
    """tool.load_run's model (on the CPU) and checkpoint for RunsConfig a, and what names the run
    in output."""
    model, ckpt, state = tool.load_run(out_dir, "cpu", prog, a.unfinished, a.ckpt)
    cfg = model.config
    return model, ckpt, {"out_dir": out_dir, "dataset": ckpt["train_config"]["dataset"],
                         "layout": cfg.layout, "scheme": cfg.scheme, "n_steps": cfg.n_steps,
                         "state": state or "finished"}


def each_run(a, one, report, png, prog):
    """one(opened(out_dir), a) for each --out_dir, its report printed; the results, written to
    --json. png: how --png is checked (check_writable's words). Outputs are checked, and every
    run opened, before any run's work."""
    if not a.out_dir:
        raise UsageError("give a run's folder: --out_dir=OUT_DIR (again to compare several)")
    if a.json:
        tool.check_writable(a.json, "json")
    if a.png:
        tool.check_writable(a.png, "png", **png)
    a.device, results = resolve_device(a.device), []
    runs = [opened(out_dir, a, prog) for out_dir in a.out_dir]
    while runs:  # one run's model on the device at a time
        results.append(one(runs.pop(0), a))
        print(report(results[-1]))
    if a.json:
        files.write_json(a.json, json_ready(results))
        print(f"wrote {a.json}")
    return results


def probe_checkpoint(run, a):
    """probe() of a run opened(), as ProbeConfig a asks."""
    model, ckpt, result = run
    model = model.to(a.device)
    cfg, num_samples = model.config, a.num_samples
    # h_emb, h0 ... hK, out: what each sample keeps is its windows and their measures
    states = cfg.n_steps + 3
    need = num_samples * 8 * (cfg.block_size + 2 * (TOP_K * states + states ** 2))
    total = physical_memory()
    if total and need > total / 2:
        raise UsageError(f"--num_samples={num_samples}: its windows and measures need about "
                         f"{need / 2**30:,.1f} GiB, more than half of this machine's "
                         f"{total / 2**30:,.1f} GiB; use fewer")
    idx = validation_windows(ckpt, cfg.block_size, num_samples, a.seed, a.data_root).to(a.device)
    result.update(num_samples=num_samples, seq_len=cfg.block_size, seed=a.seed)
    return {**result, **probe(model, idx, a.sigma_frac)}


def fmt(v):
    return "  -  " if v is None else f"{v:.2f}"


def report(r):
    lines = [f"== {r['out_dir']}{unfinished(r)}: layout {r['layout']}, scheme {r['scheme']}, "
             f"{r['num_samples']} x {r['seq_len']} tokens of {r['dataset']} =="]
    lines.append("effort (relative update, mean +- std):  " +
                 "  ".join(f"{k} {m:.3f}+-{s:.3f}" for k, (m, s) in r["effort"].items()))
    labels, matrix = r["cka"]["labels"], r["cka"]["matrix"]
    w = max(6, *(len(l) + 1 for l in labels))
    lines.append(f"CKA (RBF, sigma = {r['cka']['sigma_frac']} x median distance):")
    lines.append(" " * w + "".join(f"{l:>{w}}" for l in labels))
    lines += [f"{l:<{w}}" + "".join(f"{fmt(v):>{w}}" for v in row)
              for l, row in zip(labels, matrix)]
    picks = [i for i in (1, 2, 5, 10, 20, 49) if i < len(r["spectrum"]["mean"][0])]
    lines.append("spectrum sigma_i/sigma_0 (mean) at i = " + ", ".join(map(str, picks)) + ":")
    lines += [f"  {l:<{w}}" + " ".join(f"{m[i]:.3f}" for i in picks)
              for l, m in zip(r["spectrum"]["labels"], r["spectrum"]["mean"])]
    ro = r["routers"]
    if ro:
        lines.append(f"routers (mean slot weight; entropy, max ln {ro['n_slots']} = "
                     f"{ro['max_entropy']:.3f}):")
        for i, l in enumerate(ro["labels"]):
            write = " ".join(f"{v:.2f}" for v in ro["write"][i])
            read = " ".join(f"{v:.2f}" for v in ro["read"][i])
            lines.append(f"  {l:<7} write [{write}] H {ro['entropy_write'][i]:.3f}"
                         f"   read [{read}] H {ro['entropy_read'][i]:.3f}")
    steps = "  ".join(f"{v:.4f}" + "*" * (t == r["n_steps"]) for t, v in enumerate(r["step_loss"]))
    lines.append(f"loss {r['loss']:.4f}; " + ("no loop steps" if not r["n_steps"] else
                 "stopped after loop step t = 0, 1, ... (early exit through the coda, not the "
                 f"paper's method; * the trained K):\n  {steps}"))
    if r["scheme"] == "mesh":
        lines[-1] += f"  (MeSH stops at K: a router per step, {ro['n_slots']} buffer slots)"
    return "\n".join(lines)


def unfinished(r):  # what a title adds for a run used before it finished
    return "" if r["state"] == "finished" else f" ({r['state']})"


def title(r, sep="\n"):
    return (f"{os.path.basename(os.path.normpath(r['out_dir']))}{unfinished(r)}{sep}"
            f"{r['layout']} {r['scheme']}")


def save_figure(plt, fig, path, dpi=120):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    print(f"wrote {path}")


def annotated(ax, mat, cmap, dark, **kw):
    """mat as a heatmap from 0 to 1, each cell's value written in it (white below dark)."""
    im = ax.imshow(mat, vmin=0, vmax=1, cmap=cmap, **kw)
    for (i, j), v in np.ndenumerate(mat):
        ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7,
                color="w" if v < dark else "k")
    return im


def write_pngs(results, folder):
    """Paper-style figures, checkpoints side by side: effort.png (Fig. 3), cka.png (Fig. 4),
    spectrum.png (Fig. 5), routers.png if any is mesh; steps.png, all in one."""
    if not (plt := pyplot("probe.py")):
        return

    n = len(results)
    side_by_side = dict(figsize=(3.2 * n, 3), sharey=True, squeeze=False, layout="constrained")

    def save(fig, name):
        save_figure(plt, fig, os.path.join(folder, name))

    fig, axes = plt.subplots(1, n, **side_by_side)
    for ax, r in zip(axes[0], results):
        names = list(r["effort"])
        m, s = zip(*r["effort"].values())
        kind = r["scheme"] if "step0" in names else "vanilla"  # (vanilla: no loop steps)
        ax.bar(range(len(names)), m, yerr=s, capsize=3, color=colour(kind))
        ax.set_xticks(range(len(names)), names, rotation=45)
        ax.set_title(title(r), fontsize=9)
    axes[0][0].set_ylabel("relative update")
    save(fig, "effort.png")

    fig, axes = plt.subplots(1, n, figsize=(3.4 * n, 3.2), squeeze=False, layout="constrained")
    for ax, r in zip(axes[0], results):
        labels = r["cka"]["labels"]
        im = annotated(ax, np.array(r["cka"]["matrix"], dtype=float), "viridis", 0.6)  # None: nan
        ax.set_xticks(range(len(labels)), labels, rotation=45)
        ax.set_yticks(range(len(labels)), labels)
        ax.set_title(title(r), fontsize=9)
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, label="CKA (RBF)")
    save(fig, "cka.png")

    fig, axes = plt.subplots(1, n, **side_by_side)
    for ax, r in zip(axes[0], results):
        sp = r["spectrum"]
        for label, m, s in zip(sp["labels"], sp["mean"], sp["std"]):
            m, s = np.array(m), np.array(s)
            ax.plot(m, label=label)
            ax.fill_between(range(len(m)), np.clip(m - s, 0, None), np.clip(m + s, None, 1),
                            alpha=0.2)
        ax.set_ylim(0, 1.02)  # linear: a collapsed state drops to ~0 after a few values
        ax.set_xlabel("index i")
        ax.set_title(title(r), fontsize=9)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("sigma_i / sigma_0")
    save(fig, "spectrum.png")

    meshes = [r for r in results if r["routers"]]
    if meshes:
        fig, axes = plt.subplots(len(meshes), 2, figsize=(7, 2.6 * len(meshes)), squeeze=False,
                                 layout="constrained")
        for row, r in zip(axes, meshes):
            ro = r["routers"]
            for ax, kind in zip(row, ("write", "read")):
                annotated(ax, np.array(ro[kind]), "magma", 0.5, aspect="auto")
                ax.set_xticks(range(ro["n_slots"]), [f"m{b}" for b in range(ro["n_slots"])])
                entropies = zip(ro["labels"], ro[f"entropy_{kind}"])
                ax.set_yticks(range(len(ro["labels"])), [f"{l} H={h:.2f}" for l, h in entropies])
                ax.set_title(f"{title(r, ': ')}\n{kind} weights "
                             f"(max H {ro['max_entropy']:.2f})", fontsize=8)
        save(fig, "routers.png")

    with plt.rc_context({"font.size": 15}):  # legible when projected
        fig, ax = plt.subplots(figsize=(10, 6.5), layout="constrained")
        marks = {}  # a layout's marker; its scheme's colour
        for r in results:
            K, steps, kind = r["n_steps"], r["step_loss"], f"{r['scheme']} {r['layout']}"
            if not K:  # vanilla: no loop steps, its loss a level to compare with
                ax.axhline(r["loss"], color="k", ls="--", lw=2, label=f"vanilla {r['layout']}")
                continue
            mark = "os^dv"[marks.setdefault(r["layout"], len(marks)) % 5]
            ax.plot(steps, color=colour(r["scheme"]), marker=mark, lw=2.5, label=kind)
            ax.plot(K, steps[K], "k*", ms=18, zorder=3, label="trained K")
        ax.set(xlabel="loop step t: the model stopped after it", ylabel="validation loss")
        ax.set_title("The model stopped after loop step t: early exit, not the paper's method")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
        shown = dict(zip(*ax.get_legend_handles_labels()[::-1]))  # each label once
        ax.legend(shown.values(), shown.keys())
        save(fig, "steps.png")


@dataclass
class RunsConfig:
    """The settings of a tool that reads checkpoints side by side."""
    out_dir: list[str] = setting([], "a run's folder (again to compare several)", path=True)
    ckpt: int | None = setting(None, "a kept checkpoint's iteration (--keep_every); None: latest")
    device: str = setting("cpu", "cpu, cuda, cuda:N, mps or auto")
    data_root: str | None = setting(
        None, "where the checkpoints' dataset is now; None: where each trained", path=True)
    json: str | None = setting(None, "write the numbers here", path=True)
    unfinished: bool = setting(False, tool.UNFINISHED)
    seed: int = setting(0, "seed of where the validation windows start, the same for each run")


@dataclass
class ProbeConfig(RunsConfig):
    """MeSH diagnostics (the paper's Fig. 3-5) for trained checkpoints."""
    num_samples: int = setting(64, "validation sequences per checkpoint")
    sigma_frac: float = setting(SIGMA_FRAC, "RBF bandwidth / the median distance")
    png: str | None = setting(None, "write PNG figures into this folder (needs matplotlib)",
                              path=True)

    def __post_init__(self):
        check_ranges(self, [("num_samples", lambda v: v >= 1, "at least 1"),
                            ("seed", lambda v: v >= 0, "0 or more"),
                            ("sigma_frac", lambda v: v > 0, "a positive finite number"),
                            ("sigma_frac", lambda v: v <= 1e6, "at most 1e6")])


def main(argv):
    return command.main("tools/probe.py", run, argv, ProbeConfig)


def run(given):
    a = ProbeConfig(**given)
    results = each_run(a, probe_checkpoint, report, dict(folder=True),
                       "probe.py")
    if a.png:
        write_pngs(results, a.png)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
