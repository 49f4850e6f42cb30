"""
draw.py: a picture of a model, drawn from its mesh.Layout and mesh.Config, so it always matches
the code, and its parameter counts (the paper's Table 5), allocating no weights.

    python tools/draw.py --layout=3+2R3+3 --scheme=mesh --png=model.png    # any P+CRN+Q and scheme
    python tools/draw.py --model=pythia-1.4b --layout=4+8R2+4 --scheme=mesh  # text only: no --png

The blocks in the order forward applies them (a core applied again: shared weights); for mesh
the buffer's slots and the routers that write and read them (Eq. 2-5), for the other schemes the
update rule between steps. Printed as text, mesh.summary's counts below; with --png, drawn.
"""

import os
import re
import sys
from dataclasses import asdict, dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configurator import UsageError, check_ranges, setting  # noqa: E402
from mesh import (MESH_CHOICES, PRESETS, SCHEMES, Config, ConfigError, parse_layout,  # noqa: E402
                  summary)
from support import command, memory, tool  # noqa: E402
from tools.curves import pyplot  # noqa: E402
from tools.probe import save_figure  # noqa: E402

# [choice] the most applied blocks, or buffer slots, drawn or summed up: a drawing of more is
# unreadable (and slow to build even on the meta device); Pythia's deepest model has 36 layers
MAX_DRAWN = 256
# the update rules between steps, as the README's table writes them
RULES = {"base": "h(t+1) = f_t(h(t))", "residual": "h(t+1) = f_t(h(t)) + h(t)",
         "anchor": "h(t+1) = f_t(h(t)) + h(0)", "anchor_emb": "h(t+1) = f_t(h(t)) + h_emb"}


def parts(cfg):
    """The model in forward's order: [(part, [unique block index of each applied block], shared)],
    shared: a loop step runs a core an earlier step ran."""
    s = cfg.shape
    sizes = (s.prelude, *s.cores, s.coda)  # unique blocks are numbered prelude, each core, coda
    spans = [list(range(sum(sizes[:i]), sum(sizes[:i + 1]))) for i in range(len(sizes))]
    out = [("prelude" if s.schedule else "blocks", spans[0], False)]  # vanilla: no prelude
    out += [(f"step {t}", spans[1 + c], c in s.schedule[:t]) for t, c in enumerate(s.schedule)]
    return out + [("coda", spans[-1], False)]


def routers(cfg):
    """MeSH's routers by name (K+1 with the routed cycle, K with the direct one); [] otherwise."""
    if cfg.scheme != "mesh":
        return []
    return ["cycle"] * (cfg.cycle == "routed") + [f"step {t}" for t in range(cfg.n_steps)]


def text(cfg):
    """The picture as lines of text: one line per part, its blocks as [bN], shared ones marked."""
    lines = [f"token ids -> embedding h_emb (B, T, {cfg.n_embd})"]
    for name, blocks, shared in parts(cfg):
        if not blocks:
            continue
        drawn = "".join(f"[b{b}]" for b in blocks)
        mark = "  shared: the weights of an earlier step" if shared else ""
        lines.append(f"{name:<8} {drawn}" + mark)
        if name.startswith("step") and cfg.scheme != "mesh":
            rule = RULES.get(cfg.scheme, f"scheme {cfg.scheme!r} (mesh.SCHEMES)")
            lines.append(f"{'':<8}   {rule}")
    lines.append("-> ln_f -> lm_head -> logits (B, T, vocab)")
    if cfg.scheme == "mesh":
        lines.append(f"buffer: {cfg.slots} slots m0..m{cfg.slots - 1} (B, T, {cfg.slots}, "
                     f"{cfg.n_embd}), m0 = h_emb, the others 0 at the start; routers (write + "
                     f"read, each a softmax over the slots): {', '.join(routers(cfg))}")
    return "\n".join(lines)


def draw(cfg, path):
    """The same picture as a PNG (a shared core hatched; for mesh the buffer's lanes below, each
    router's arrows crossing them, a weight a slot: Eq. 3, 5)."""
    if not (plt := pyplot("draw.py", "picture, only the text above")):
        return
    from matplotlib.patches import FancyArrowPatch, Patch, Rectangle

    shown = [p for p in parts(cfg) if p[1] or p[0] == "prelude" and "cycle" in routers(cfg)]
    n = sum(len(blocks) for _, blocks, _ in shown) + len(shown) - 1  # a gap between parts
    mesh = cfg.scheme == "mesh"
    lane = 0.3  # a slot's height in the buffer
    fig, ax = plt.subplots(figsize=(max(7, 0.55 * n + 2), 2.8 + mesh * (0.3 * cfg.slots + 0.6)),
                           layout="constrained")
    colours = plt.get_cmap("tab20")
    x, centres = 0, {}
    for name, blocks, shared in shown:
        start = x
        for b in blocks:
            ax.add_patch(Rectangle((x, 1), 0.9, 1, facecolor=colours(b % 20), edgecolor="k",
                                   hatch="//" if shared else None))
            ax.text(x + 0.45, 1.5, f"b{b}", ha="center", va="center", fontsize=8)
            x += 1
        x += not blocks  # room for the cycle's router
        centres[name] = (start + x - 0.1) / 2
        ax.text(centres[name], 2.15, name + ("\n(shared)" if shared else ""), ha="center",
                va="bottom", fontsize=9)
        x += 1
    ax.annotate("", (0, 1.5), (-1, 1.5), arrowprops=dict(arrowstyle="->"))
    ax.text(-1.1, 1.5, "h_emb", ha="right", va="center", fontsize=9)
    ax.annotate("", (x, 1.5), (x - 1, 1.5), arrowprops=dict(arrowstyle="->"))
    ax.text(x + 0.1, 1.5, "logits", ha="left", va="center", fontsize=9)
    legend = [Patch(facecolor="w", edgecolor="k", label="a block (b: its weights' index)"),
              Patch(facecolor="w", edgecolor="k", hatch="//",
                    label="a core applied again: shared weights")]
    if mesh:
        slots = [0.5 - (b + 1) * lane for b in range(cfg.slots)]  # each lane's bottom, m0 on top
        for b, y in enumerate(slots):
            ax.add_patch(Rectangle((0, y), x - 1, 0.85 * lane, facecolor="#ddd", edgecolor="k"))
            ax.text(-0.15, y + 0.42 * lane, f"m{b}" + (" = h_emb" if b == 0 else ""),
                    ha="right", va="center", fontsize=8)
        ax.text(x - 1, 0.52, f"the buffer: {cfg.slots} slots", ha="right", va="bottom",
                fontsize=9)
        for name in routers(cfg):
            at = centres["prelude" if name == "cycle" else name]
            for dx, colour, ends in ((-0.2, "tab:red", (0.95, slots[-1])),
                                     (0.2, "tab:blue", (slots[-1], 0.95))):
                ax.add_patch(FancyArrowPatch((at + dx, ends[0]), (at + dx, ends[1]),
                                             arrowstyle="-|>", mutation_scale=14, color=colour))
                ax.plot([at + dx] * cfg.slots, [y + 0.42 * lane for y in slots], "o", ms=4,
                        color=colour)
        legend += [Patch(color="tab:red", label="router: writes the step's output into every "
                                                "slot, a weight each"),
                   Patch(color="tab:blue", label="router: reads the next state from every slot, "
                                                 "a weight each")]
    elif cfg.shape.schedule:  # (vanilla has no steps)
        ax.text(n / 2, 0.6, f"between steps: {RULES.get(cfg.scheme, cfg.scheme)}", ha="center",
                fontsize=9)
    ax.legend(handles=legend, loc="upper center", bbox_to_anchor=(0.5, -0.02), ncol=2, fontsize=8,
              frameon=False)
    ax.set(xlim=(-2.5, x + 1.5), ylim=(0.3 - mesh * lane * (cfg.slots + 0.5), 2.9))
    ax.axis("off")
    scheme = f"scheme {cfg.scheme}" if cfg.shape.schedule else "vanilla"
    ax.set_title(f"layout {cfg.layout}, {scheme}: compute depth {cfg.shape.depth}, "
                 f"{cfg.shape.unique} unique blocks", fontsize=11)
    save_figure(plt, fig, path)


@dataclass
class DrawConfig:
    """A picture of a model: its blocks in order, which are shared, MeSH's buffer and routers."""
    model: str = setting("classroom", "a preset of mesh.PRESETS (listed below)")
    layout: str | None = setting(None, "blocks: P+CRN+Q as 3+2R3+3; None: the preset's")
    scheme: str | None = setting(None, "how the state passes between steps (listed below)")
    n_slots: int | None = setting(None, "mesh buffer slots; None means K+3")
    cycle: str | None = setting(None, "mesh transitional cycle: routed (default) or direct")
    n_embd: int | None = setting(None, "width D; None: the preset's")
    vocab_size: int | None = setting(None, "vocabulary size; None: the preset's")
    png: str | None = setting(None, "draw it into this PNG file (needs matplotlib)", path=True)

    def __post_init__(self):  # sizes no drawing or summary can show, refused before any is built
        check_ranges(self, [("n_slots", lambda v: v <= MAX_DRAWN, f"at most {MAX_DRAWN}"),
                            ("n_embd", lambda v: v <= 1 << 16, "at most 65536"),
                            ("vocab_size", lambda v: v <= 1 << 24, "at most 16777216")])
        counts = re.findall(r"(\d+)(?:R(\d+))?", self.layout or "")  # P+CRN+Q: P + C x N + Q
        blocks = sum(float(c) * float(n or 1) for c, n in counts)
        if blocks > MAX_DRAWN:
            raise UsageError(f"--layout={self.layout[:40]} applies {blocks:,.0f} blocks; a "
                             f"drawing or a summary shows at most {MAX_DRAWN}")


def main(argv):
    notes = (f"presets: {', '.join(PRESETS)}\nschemes: {', '.join(SCHEMES)}\n"
             f"cycles: {', '.join(MESH_CHOICES['cycle'])}")
    return command.main("tools/draw.py", run, argv, DrawConfig, notes)


def run(given):
    a = DrawConfig(**given)
    if a.png:
        tool.check_writable(a.png, "png", ".png")
    chosen = {k: v for k, v in asdict(a).items() if k not in ("model", "png")}
    try:
        if a.scheme is None and a.layout and not parse_layout(a.layout).schedule:
            # a vanilla layout (no loop steps): the preset's scheme cannot apply
            chosen["scheme"] = "base"
        cfg = Config.from_preset(a.model, **chosen)
    except ConfigError as e:  # a model mesh.py cannot build, in its words
        raise UsageError(str(e)) from None
    memory.check_slots(cfg, a.n_slots)
    print(text(cfg) + "\n\n" + summary(cfg))
    if a.png:
        draw(cfg, a.png)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
