"""
The consolidation command: a sharded checkpoint (train.py --fsdp=true) -> one ckpt.pt, the file
sample.py, tools/probe.py, tools/table1.py and tools/lm_eval_mesh.py read.

    python tools/consolidate.py --out_dir=OUT_DIR   # its ckpt-sharded.json and shards -> ckpt.pt

It needs the whole model and AdamW state in memory; it never replaces a newer ckpt.pt.
"""

import os
import sys
from dataclasses import dataclass

if __package__ in (None, ""):  # python tools/X.py: the project's modules are one folder up
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configurator import UsageError, setting  # noqa: E402
from support import checkpoint, command, files  # noqa: E402
from support.checkpoint import POINTER, CheckpointError  # noqa: E402


@dataclass
class ConsolidateConfig:
    """Write OUT_DIR/ckpt.pt from OUT_DIR's sharded checkpoint (train.py --fsdp=true)."""
    out_dir: str | None = setting(None, "the run's folder, holding ckpt-sharded.json", path=True)


def consolidate(out_dir):
    """OUT_DIR's sharded checkpoint -> OUT_DIR/ckpt.pt, written atomically; its iteration."""
    if os.path.isdir(out_dir):
        files.own(out_dir, flag="OUT_DIR")
    meta = checkpoint.read_pointer(out_dir)
    if meta is None:
        raise CheckpointError(f"no sharded checkpoint in {out_dir} (no {POINTER}); train one with "
                              f"torchrun ... train.py --fsdp=true --out_dir={out_dir}")
    path = os.path.join(out_dir, checkpoint.CKPT)
    taken, full, _ = checkpoint.latest(out_dir)  # the run's latest, as a resume would take it
    if taken == checkpoint.CKPT:
        than = "is further in training than" if full[0] > meta["iter_num"] else "was saved after"
        raise CheckpointError(f"{path} (iter {full[0]}) {than} the sharded checkpoint (iter "
                              f"{meta['iter_num']}), which would replace it; it needs no "
                              f"consolidation")
    ckpt = checkpoint.load_whole(out_dir, meta)
    del ckpt["path"]
    checkpoint.save({**ckpt, "model": ckpt["model"].state_dict()}, path)
    return ckpt["iter_num"]


def run(given):
    out_dir = ConsolidateConfig(**given).out_dir
    if not out_dir:
        raise UsageError("name the run: python tools/consolidate.py --out_dir=OUT_DIR")
    it = consolidate(out_dir)
    print(f"wrote {os.path.join(out_dir, 'ckpt.pt')} (iter {it}) from "
          f"{os.path.join(out_dir, POINTER)}")


def main(argv):
    return command.main("tools/consolidate.py", run, argv, ConsolidateConfig)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
