"""
A training run's own folder, OUT_DIR, from its start to its end: the checkpoint it continues from,
the folder held and checked, its log, a checkpoint saved then committed, the last good checkpoint
in words, a finished run left alone, and the line that says how to continue a stopped one. train.py
makes one Run; outdir.py, resume.py and checkpoint.py do the work.

    run = Run(given.get("out_dir", "out"), master)
    given = run.resume(given)              # --init_from=resume: its latest checkpoint, run.ckpt
    if not run.check(tc, given, spread):   # the folder held; a resume's checks, or a fresh run's
        return 0                           # a finished run, left as it is
    run.start(tc, device.type)             # all checked: the run takes OUT_DIR (lock, log)
    run.write(record, text)                # print text, log record
    run.save(raw_model, optimizer, state)  # the checkpoint, then the log committed
    run.last_good()                        # the last good checkpoint, in words
"""

import os
import shlex
import time

from support import checkpoint, machine, outdir, runfiles


class Run:
    """OUT_DIR of one training run, as rank `master` or another rank sees it."""

    def __init__(self, out_dir, master):
        self.out_dir, self.master = out_dir, master
        self.ckpt = None        # the checkpoint a resumed run continues from (resume.load's dict)
        self.log = None         # OUT_DIR/log.jsonl (rank 0's), once the run has started
        self.spread = None      # how the model is spread: what it saves, and how
        self.saved_iter = None  # the iteration of the last good checkpoint, None before one
        self.as_given = {}      # the settings a checkpoint keeps as they were given (settings)
        self.device_type = None  # whose random state a checkpoint keeps (start)

    def resume(self, given):
        """For --init_from=resume, load the run's latest checkpoint, to continue from it
        (checkpoint.latest's rule); the folder is owned first, since a live run may be saving into
        it. A torchrun restart of the launch that saved it resumes too (machine.restarted). Returns
        the flags given, with --init_from=resume for such a restart."""
        given = machine.restarted(given, self.out_dir, self.master)
        if given.get("init_from") != "resume":
            return given
        from support import resume  # continuing a run: its checkpoint, its checks, its RNG state
        if self.master and os.path.isdir(self.out_dir):
            runfiles.own(self.out_dir)
        self.ckpt = resume.load(self.out_dir, sharded=bool(given.get("fsdp")))
        return given

    def settings(self, cls, given):
        """The run's settings, a cls (TrainConfig): a resumed run's saved ones, read as flags are,
        but for its folder (it writes where it read) and --fsdp (resume.settings), then the flags
        given over them. Those that train.py resolves or derives (auto, None) are kept as given,
        for its checkpoints: a resume, on its machine and with its flags, does it again."""
        if not self.ckpt:
            tc = cls(**given)
        else:
            from support import resume
            tc = resume.settings(self.ckpt, cls, given)
        derived = ("dtype", "compile", "lr", "min_lr", "warmup_iters", "lr_decay_iters")
        self.as_given = {k: getattr(tc, k) for k in derived}
        return tc

    @property
    def model_config(self):
        """A resumed run's model Config, or None."""
        return self.ckpt["model"].config if self.ckpt else None

    @property
    def trained_on(self):
        """A resumed run's record of its data ({} when it kept none), or None for a fresh run."""
        return (self.ckpt.get("data") or {}) if self.ckpt else None

    def check(self, tc, given, spread):
        """Everything before the run touches OUT_DIR: the folder held by its real path (a link
        re-pointed later cannot send the run's writes elsewhere), then a resume's every reason it
        cannot continue, or a fresh run's refusal to start over a run (unless --overwrite).
        Returns False for a resumed run that is finished already, which it says."""
        self.out_dir = tc.out_dir = outdir.held(tc.out_dir)
        self.spread = spread
        if self.ckpt:
            from support import resume
            resume.check(self.ckpt, tc, given)
            self.saved_iter = self.ckpt["iter_num"]  # its checkpoint: the last good one so far
            return not resume.finished(self.ckpt, tc)
        if tc.init_from == "scratch" and self.master:
            outdir.check_fresh(self.out_dir, tc.overwrite)
        return True

    def start(self, tc, device_type):
        """All checked: rank 0 takes OUT_DIR (its lock, killed writes' leftovers, its log).
        device_type: where the run's random state is (cpu, and cuda's too), for its checkpoints."""
        self.device_type = device_type
        if self.master:
            fresh = self.ckpt is None
            resumed_at = 0 if fresh else self.ckpt["iter_num"]
            self.log = outdir.start_run(self.out_dir, fresh, tc.overwrite, self.spread.checkpoint,
                                        resumed_at)

    def restore(self, model, optimizer, seed, rank, world, device_type):
        """A resumed run's AdamW state (under FSDP its weights too), and its random state."""
        from support import resume
        self.spread.load(self.ckpt, model, optimizer)
        resume.restore_rng(self.ckpt, seed, rank, world, device_type)

    def write(self, record, text):
        """Print text and log record (rank 0)."""
        if self.master:
            self.log.write(record, text)

    def save(self, model, optimizer, state):
        """Save a checkpoint of state (its plain data) with the model and AdamW, then commit the
        log: --overwrite's new run replaces the old one with its first checkpoint. The checkpoint
        also keeps what a resume needs to go on exactly: the settings as given, the random state,
        when and by which torchrun launch it was saved."""
        state = {**state, "rng": checkpoint.rng_state(self.device_type), "saved_at": time.time(),
                 "launch": machine.launch_id()}
        state["train_config"] = {**state["train_config"], **self.as_given}
        self.spread.save(self.out_dir, model, optimizer, self.master, state)
        self.saved_iter = state["iter_num"]
        if self.master:
            self.log.commit()

    def last_good(self):
        """The checkpoint a run that blew up leaves (or none), in words."""
        if self.saved_iter is None:
            return "this run saved no checkpoint (start again with a lower --lr)"
        path = os.path.join(self.out_dir, self.spread.checkpoint)
        return (f"{path} (iter {self.saved_iter}) is the last good checkpoint (resume with "
                f"--init_from=resume and a lower --lr)")

    def stopped(self, iter_num, world):
        """The last line of a run stopped by a signal: the command that continues it (rank 0)."""
        if self.master:
            again = shlex.quote("--out_dir=" + self.out_dir) + self.spread.flag
            print(f"stopped at iter {iter_num}; checkpoint saved. Continue with "
                  f"{machine.launch(world)} train.py --init_from=resume {again}")
