"""
The consolidation command: a sharded checkpoint (train.py --fsdp=true) -> one ckpt.pt, the file
sample.py, tools/probe.py, tools/table1.py and tools/lm_eval_mesh.py read.

    python tools/consolidate.py OUT_DIR     # OUT_DIR/ckpt-sharded.json and its shards -> OUT_DIR/ckpt.pt

It needs the whole model and its AdamW state in this machine's memory; it owns OUT_DIR while it
works, and refuses to replace a ckpt.pt saved after the sharded checkpoint.
"""

import os
import sys

if __package__ in (None, ""):  # python tools/X.py: the project's modules are one folder up
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configurator import report  # noqa: E402
from support import fsdp, runfiles  # noqa: E402
from support.checkpoint import POINTER  # noqa: E402


def main(argv):
    if len(argv) != 1 or argv[0].startswith("-"):
        print("usage: python tools/consolidate.py OUT_DIR   (writes OUT_DIR/ckpt.pt from its sharded checkpoint)", file=sys.stderr)
        return 2
    try:
        it = fsdp.consolidate(argv[0])
    except (ValueError, OSError) as e:  # CheckpointError, UsageError (a live run owns OUT_DIR), ...
        return report("consolidate.py", e)
    finally:
        runfiles.release()
    print(f"wrote {os.path.join(argv[0], 'ckpt.pt')} (iter {it}) from {os.path.join(argv[0], POINTER)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
