"""What keeps nanoMeSH's promises (nothing lost, bad input in one line, exact resume, scale), one
idea a module, each reached by one named call; a first reading of train.py can skip all of them.

    command.py      every script's main: one-line errors, a guarded stdout, signals as a clean stop
    files.py        plain-data reads with limits, atomic writes, folder locks, safe output paths
    run.py          a training run's OUT_DIR: resumed, checked, taken, saved (train.py's Run)
    log.py          a run's log.jsonl: appended whole, read back as one curve
    checkpoint.py   ckpt.pt and the sharded format: written, checked, read; which is the latest
    distributed.py  torchrun's processes; the model whole (DDP) or sharded (FSDP2)
    device.py       the device, its dtype and MFU; the memory there is and what fits in it
    plan.py         the plan of a launch before it starts (--plan=true)
    capture.py      forward's states, recorded from outside it (the probes)
    pretrained.py   a model from a vanilla one (a run or a GPT-NeoX import), looped

support/ never imports data/ (data/ uses support/'s files and locks); configurator.py imports
neither."""
