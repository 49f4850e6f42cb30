"""
What the model computes, recorded from outside its forward: the states, each part's input and
output, and MeSH's routing weights, for tools/probe.py's diagnostics and the model's tests; and
what it would predict had it stopped after each loop step (its readout).

    with capture(model) as cap:
        model(idx)          # cap["states"], cap["blocks"], cap["routers"]
    for logits in readout(model, cap): ...   # after loop step t = 0, 1, ..., K (... 2K)
"""

from contextlib import contextmanager

from mesh import SCHEMES


@contextmanager
def capture(model):
    """with capture(model) as cap: model(idx) records, changing no value, "states" (name, h),
    "blocks" (name, input, output) and "routers" (name, w_write, w_read)."""
    cap = dict(states=[], blocks=[], routers=[])
    K, run = model.config.n_steps, model.run

    def run_part(blocks, x, *rest):
        y, layer = run(blocks, x, *rest)
        if blocks is model.prelude:  # the first part of a forward
            for record in cap.values():
                record.clear()
            cap["states"].append(("h_emb", x))
            if len(blocks):
                cap["blocks"].append(("prelude", x, y))
        elif blocks is model.coda:
            cap["states"] += [(f"h{K}", x), ("out", y)]
            if len(blocks):
                cap["blocks"].append(("coda", x, y))
        else:  # loop step t, on h(t)
            t = len(cap["states"]) - 1
            cap["states"].append((f"h{t}", x))
            cap["blocks"].append((f"step{t}", x, y))
        return y, layer

    def note_router(router, inputs, weights):  # called after the prelude (the cycle) or step t
        t = len(cap["states"]) - 2
        cap["routers"].append(("cycle" if t < 0 else f"step{t}", *weights))

    hooks = [r.register_forward_hook(note_router) for r in getattr(model, "routers", [])]  # mesh
    model.run = run_part
    try:
        yield cap
    finally:
        del model.run
        for hook in hooks:
            hook.remove()


def readout(model, cap):
    """The logits (B, T, V) the model gives if it stops after loop step t, for t = 0 ... K: the
    recorded state h(t) through the coda, ln_f and lm_head exactly as forward takes h(K), so
    entry K is forward's own (a probe, not the paper's method). Schemes without per-step weights
    run on up to t = 2K; MeSH stops at K (a router per step)."""
    states, K = dict(cap["states"]), model.config.n_steps
    h = states["h_emb"]
    rope = model.rotary(h.size(1), None, model.compute_dtype(h.device.type))  # as forward's

    def run(blocks, h):
        return model.run(blocks, h, 0, rope, None)[0]

    for t in range(K + 1):
        yield model.lm_head(model.ln_f(run(model.coda, states[f"h{t}"])))
    update, h = SCHEMES[model.config.scheme], states[f"h{K}"]
    for _ in range(K if update else 0):  # [choice] as far again as it trained: t = K+1 ... 2K
        h = update(run(model.cores[model.schedule[-1]], h), h, states["h0"], states["h_emb"])
        yield model.lm_head(model.ln_f(run(model.coda, h)))
