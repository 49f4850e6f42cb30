"""
curves.py: train and validation loss against the iteration for any runs, as train.py evaluated
them (OUT_DIR/log.jsonl), in one figure legible when projected, each variant in its colour (as in
every figure of the project: COLOURS); table1.py draws its curves with it too.

    python tools/curves.py --out_dir=out --out_dir=out-base --png=runs/curves.png
"""

import math
import os
import sys
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configurator import UsageError, setting  # noqa: E402
from mesh import parse_layout  # noqa: E402
from support import checkpoint, command, tool  # noqa: E402

COLOURS = {"vanilla": "black", "base": "tab:blue", "residual": "tab:purple", "anchor": "tab:green",
           "anchor_emb": "tab:olive", "mesh": "tab:red"}
# a scheme of one's own, a [choice] (six: table1.py's four CHOICES get four apart)
OTHERS = ("tab:orange", "tab:cyan", "tab:pink", "tab:brown", "gold", "navy")


def colour(variant):
    return COLOURS.get(variant) or OTHERS[sum(map(ord, variant)) % len(OTHERS)]


def pyplot(prog, what="figures"):
    """matplotlib.pyplot drawing into files (Agg), or None without it, a line saying so: every
    figure of the project is drawn through it."""
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"{prog}: matplotlib is not installed, so no {what} (pip install matplotlib)")
        return None
    plt.switch_backend("Agg")
    return plt


def plot(panels, path, prog):
    """A panel per (name, lines), a line dict(label, colour, x, y, style, band=(low, high))."""
    if not (plt := pyplot(prog)):
        return
    with plt.rc_context({"font.size": 15, "lines.linewidth": 2.5, "lines.markersize": 9}):
        fig, axes = plt.subplots(1, len(panels), figsize=(8 * len(panels), 6), squeeze=False,
                                 layout="constrained")
        for ax, (name, lines) in zip(axes[0], panels):
            for ln in lines:
                ax.plot(ln["x"], ln["y"], ln.get("style", ".-"), color=ln["colour"],
                        label=ln["label"])
                if "band" in ln:
                    ax.fill_between(ln["x"], *ln["band"], color=ln["colour"], alpha=0.2)
            later = [v for ln in lines for v in ln["y"][1:]]  # past the untrained start
            ax.set(title=name, xlabel="iteration", ylabel="loss",
                   ylim=(min(later) - 0.02, max(later) + 0.03) if later else None)
            ax.legend(fontsize=12)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        fig.savefig(path, dpi=100)
        plt.close(fig)
    print(f"wrote {path}")


@dataclass
class CurvesConfig:
    """Train and validation loss against the iteration, for any runs, one figure."""
    out_dir: list[str] = setting([], "a run's folder (give it again for more runs)", path=True)
    png: str = setting("curves.png", "the figure's file", path=True)


def run(given):
    a = CurvesConfig(**given)
    if not a.out_dir:
        raise UsageError("give a run's folder: --out_dir=OUT_DIR (again for more runs)")
    tool.check_writable(a.png, "png", ".png")
    lines = []
    for i, out_dir in enumerate(a.out_dir):  # a variant's colour, a marker each
        try:  # the latest checkpoint's, whole or sharded; none yet: grey
            cfg = checkpoint.latest(out_dir)[3]["model_config"]
            kind = cfg["scheme"] if parse_layout(cfg["layout"]).schedule else "vanilla"
        except Exception:
            kind = None
        path = os.path.join(out_dir, "log.jsonl")
        evals = [r for r in tool.log_records(path) if {"train_loss", "val_loss"} & r.keys()]
        ev = [r for r in evals if all(type(r.get(k)) in (int, float) and math.isfinite(r[k])
                                      for k in ("iter", "train_loss", "val_loss"))]
        if len(ev) < len(evals):
            print(f"curves.py: skipped {len(evals) - len(ev)} records of {path}: a train_loss "
                  f"or val_loss missing or not a finite number")
        c, m, x = colour(kind) if kind else "tab:gray", "os^dv"[i % 5], [r["iter"] for r in ev]
        name = f"{os.path.basename(os.path.normpath(out_dir))} ({kind or 'no checkpoint'})"
        lines += [dict(label=label, colour=c, x=x, y=[r[key] for r in ev], style=m + dash)
                  for label, key, dash in ((f"{name} val", "val_loss", "-"),
                                           ("train", "train_loss", "--"))]
    plot([("train (dashed) and validation loss at train.py's evaluations", lines)], a.png,
         "curves.py")


if __name__ == "__main__":
    sys.exit(command.main("tools/curves.py", run, sys.argv[1:], CurvesConfig))
