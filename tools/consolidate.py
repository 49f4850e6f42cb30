"""
The consolidation command: a sharded checkpoint (train.py --fsdp=true) -> one ckpt.pt, the file
sample.py, tools/probe.py, tools/table1.py and tools/lm_eval_mesh.py read.

    python tools/consolidate.py --out_dir=OUT_DIR   # its latest shards-<iter>/ -> ckpt.pt

It needs the whole model and AdamW state in memory; it never replaces a newer ckpt.pt.
"""

import os
import sys
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configurator import setting  # noqa: E402
from support import checkpoint, command, files, tool  # noqa: E402
from support.checkpoint import CheckpointError  # noqa: E402
from support.sharded import read_whole  # noqa: E402


@dataclass
class ConsolidateConfig:
    """Write OUT_DIR/ckpt.pt from OUT_DIR's sharded checkpoint (train.py --fsdp=true)."""
    out_dir: str = setting("out", "the run's folder, holding shards-<iter>/", path=True)


def consolidate(given):
    """OUT_DIR's latest sharded checkpoint -> ckpt.pt beside it, written atomically."""
    out_dir = ConsolidateConfig(**given).out_dir
    tool.check_run_folder(out_dir)  # before its lock file is made
    if os.path.isdir(out_dir):
        files.own(out_dir, flag="OUT_DIR")
    shards = [entry for entry in checkpoint.found(out_dir) if checkpoint.SHARDS.match(entry[2])]
    last = checkpoint.latest(out_dir, sharded=True)  # as a resume would take it
    folder = last and os.path.join(out_dir, last[2])
    if folder and checkpoint.KEPT.match(last[2]) and os.path.isdir(folder):  # ckpt_ITER/
        return consolidate({"out_dir": folder})
    if not shards:
        raise CheckpointError(f"no sharded checkpoint in {out_dir} (no whole shards-<iter> "
                              f"folder); train one with torchrun ... train.py --fsdp=true "
                              f"--out_dir={out_dir}")
    _, _, name, sharded = max(shards, key=lambda entry: entry[:2])
    path = os.path.join(out_dir, checkpoint.CKPT)
    at, _, latest, _ = last
    if latest != name:
        than = "is further in training than" if at > sharded["iter_num"] else "was saved after"
        raise CheckpointError(f"{os.path.join(out_dir, latest)} (iter {at}) {than} the sharded "
                              f"checkpoint (iter {sharded['iter_num']}), which would replace "
                              f"it; it needs no consolidation")
    ckpt = read_whole(sharded)
    ckpt = {k: v for k, v in ckpt.items() if k not in ("folder", "path", "checksums")}
    checkpoint.save({**ckpt, "model": ckpt["model"].state_dict()}, path)
    print(f"wrote {path} (iter {ckpt['iter_num']}) from {os.path.join(out_dir, name)}")


def main(argv):
    return command.main("tools/consolidate.py", consolidate, argv, ConsolidateConfig)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
