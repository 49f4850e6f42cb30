"""
A run's log.jsonl mirrored to Weights & Biases: train.py --wandb_log=true (pip install wandb),
every record under its own keys, a resume continuing its wandb run. Imported only then.
"""

import dataclasses
import os

from configurator import UsageError


def need_wandb(tc):
    """The wandb module, its settings checked before OUT_DIR is touched; or a one-line refusal."""
    try:
        import wandb
        from pydantic import ValidationError  # of wandb's settings
    except ImportError:
        raise UsageError("--wandb_log=true needs wandb, which is not installed: pip install wandb "
                       "(or pip install -r requirements-optional.txt)") from None
    try:
        wandb.Settings(project=tc.wandb_project).update_from_env_vars(dict(os.environ))
    except ValidationError as e:  # as WANDB_MODE=ofline
        raise UsageError("wandb refuses {loc[0]}={input!r} from the environment ({msg}); fix that "
                       "WANDB_ variable (WANDB_MODE: online, offline or disabled)".format(
                           **e.errors()[0])) from None
    except wandb.Error as e:  # as a '/' in a project's name
        raise UsageError(f"wandb refuses its settings ({e}); fix --wandb_project, or the WANDB_ "
                       f"variable named") from None
    return wandb


def start(tc, log, resumed_at=None):
    """A wandb run mirroring the RunLog `log` into OUT_DIR/wandb; a resumed run's (resumed_at,
    its iteration) continues the wandb run its log names."""
    from support.tool import log_records
    wandb, out_dir = need_wandb(tc), os.path.dirname(log.path)
    ids = [] if resumed_at is None else [r["wandb_run_id"] for r in log_records(log.path)
                                         if isinstance(r.get("wandb_run_id"), str)]
    name = tc.wandb_run_name or os.path.basename(os.path.abspath(out_dir))
    try:  # console off: wandb would wrap stdout, which command.py guards
        run = wandb.init(project=tc.wandb_project, name=name, dir=out_dir, resume="allow",
                         id=ids[-1] if ids else None, config=dataclasses.asdict(tc),
                         settings=wandb.Settings(console="off"))
    except wandb.Error as e:
        if resumed_at is None and not log.pending:  # made now: close() removes it
            log.pending = log.path
        raise UsageError(f"wandb could not start a run ({str(e).strip().splitlines()[0]}); log "
                         f"in with `wandb login`, or log offline: WANDB_MODE=offline") from None
    run.define_metric("*", step_metric="iter")
    if not ids:  # the log keeps its id (its own record: not mirrored)
        log.write({"iter": resumed_at or 0, "wandb_run_id": run.id},
                  f"wandb: run {run.id} of project {tc.wandb_project}, named {run.name}")
    return run
