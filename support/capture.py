"""
What the model computes, recorded from outside its forward: the states, each part's input and
output, and MeSH's routing weights, for tools/probe.py's diagnostics and the model's tests.

    with capture(model) as cap:
        model(idx)          # cap["states"], cap["blocks"], cap["routers"]
"""

from contextlib import contextmanager


@contextmanager
def capture(model):
    """with capture(model) as cap: model(idx) records, without changing a value, what the
    diagnostics study: "states" (name, h) for h_emb, h0 ... hK, out; "blocks" (name, input,
    output) for the prelude, each loop step and the coda (when it has blocks); "routers" (name,
    w_write, w_read) for the transitional cycle, then each step. forward applies each part
    through model.run, wrapped here; forward hooks on the routers see their weights. Each
    forward's record replaces the one before."""
    cap = dict(states=[], blocks=[], routers=[])
    K, run = model.config.n_steps, model.run

    def run_part(blocks, x, *rest):
        y, layer = run(blocks, x, *rest)
        if blocks is model.prelude:  # the first part of a forward
            for record in cap.values():
                record.clear()
            cap["states"].append(("h_emb", x))
            cap["blocks"].append(("prelude", x, y))
        elif blocks is model.coda:
            cap["states"] += [(f"h{K}", x), ("out", y)]
            if len(blocks):
                cap["blocks"].append(("coda", x, y))
        else:  # loop step t, on h(t)
            t = len(cap["blocks"]) - 1
            cap["states"].append((f"h{t}", x))
            cap["blocks"].append((f"step{t}", x, y))
        return y, layer

    def note_router(name):
        return lambda router, inputs, weights: cap["routers"].append((name, *weights))

    names = ["cycle"] * (model.config.cycle == "routed") + [f"step{t}" for t in range(K)]
    routers = getattr(model, "routers", [])  # mesh only
    hooks = [r.register_forward_hook(note_router(n)) for r, n in zip(routers, names)]
    model.run = run_part
    try:
        yield cap
    finally:
        del model.run
        for hook in hooks:
            hook.remove()
