"""pytest setup shared by every test file: one thread per process.

The tests use tiny models, for which thread start-up costs more than the maths, and
several test processes (torchrun, kill -9 children) share the 2 CI cores."""
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # inherited by the subprocesses the tests start

import torch  # noqa: E402

torch.set_num_threads(1)
