"""
The lm-evaluation-harness model `mesh`: a nanoMeSH run's latest checkpoint scored on lm_eval
tasks (pip install lm_eval). This file is lm_eval's command line with `--model mesh` filled in;
the paper's zero-shot suite:

    python tools/lm_eval_mesh.py --model_args out_dir=out --device cuda --batch_size 16 --tasks \\
        lambada_openai,piqa,hellaswag,winogrande,arc_easy,arc_challenge,sciq,mmlu_continuation

model_args: out_dir (default out), dtype (float32, bfloat16 or float16), max_gen_toks (default
256), or pretrained=PATH: a Hugging Face GPT-NeoX folder (a Pythia download) and its tokenizer.
From Python: `from tools import lm_eval_mesh`, then lm_eval.simple_evaluate(model="mesh", ...).

An empty context is conditioned on <|endoftext|>, or for character models, which have none, on a
newline, which separates paragraphs in their training text [choice].
"""
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configurator import UsageError, closest, report  # noqa: E402
from data.meta import Tokenizer  # noqa: E402
from data.trained_on import checkpoint_dataset  # noqa: E402
from support import command, files, tool  # noqa: E402
from support.device import resolve_device  # noqa: E402
from support.pretrained import load_hf  # noqa: E402

try:
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import register_model
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
    from tqdm import tqdm
except ImportError as e:
    if __name__ != "__main__":
        raise
    sys.exit(report("lm_eval_mesh.py",
                    f"{e.name or 'lm_eval'} is not installed; pip install lm_eval"))


MODEL_ARGS = ("out_dir", "dtype", "max_gen_toks", "pretrained")  # what --model_args may set


def bad_input(check):
    """lm_eval's check of its command line or task names, its refusals (ValueError) one line."""
    def checked(*args, **kwargs):
        try:
            return check(*args, **kwargs)
        except ValueError as e:
            raise UsageError(str(e)) from None
    return checked


@register_model("mesh")
class MeshLM(TemplateLM):
    """An lm_eval LM over a RecursiveGPT; TemplateLM makes (context, continuation) tokens."""

    def __init__(self, out_dir=None, device=None, batch_size=1, max_batch_size=None,
                 dtype="float32", max_gen_toks=256, pretrained=None, **unknown):
        # max_batch_size: lm_eval's, for automatic batch sizes; unused
        super().__init__()
        if unknown:
            key = next(iter(unknown))
            raise UsageError(f"unknown model_args key {key!r}{closest(key, MODEL_ARGS)}; the mesh "
                             f"model takes {', '.join(MODEL_ARGS)}")
        if device is None or str(device).startswith("cuda") and not torch.cuda.is_available():
            if device is not None:  # lm_eval's CLI asks for cuda:0 unless told otherwise
                print(f"lm_eval_mesh: no {device} here, running on the CPU", file=sys.stderr)
            device = "cuda" if torch.cuda.is_available() else "cpu"
        device = resolve_device(str(device))  # cuda:N past its GPUs: one line
        if dtype not in ("float32", "bfloat16", "float16"):
            raise UsageError(f"dtype={dtype!r}: expected float32, bfloat16 or float16")
        for name, value in (("--batch_size", batch_size), ("max_gen_toks", max_gen_toks)):
            if not str(value).isdigit() or int(value) < 1:
                raise UsageError(f"{name}={value!r}: expected a whole number of at least 1")
        if pretrained and out_dir:
            raise UsageError("give out_dir or pretrained, not both")
        if pretrained:
            model = load_hf(pretrained, device)
            # a char run's export: its vocabulary exactly (identity: a meta.json record)
            config = files.read_json(os.path.join(pretrained, "config.json"))
            own = str(config.get("nanomesh_tokenizer"))
            self.tokenizer = (Tokenizer.from_meta(files.parse_json(own)) if own.startswith("{")
                              else Tokenizer("bpe", path=pretrained))
        else:
            tool.check_run_folder(out_dir or "out", export="as pretrained=")
            model, ckpt = tool.load_latest(out_dir or "out", device, "lm_eval_mesh.py")
            dataset = checkpoint_dataset(ckpt["train_config"], ckpt.get("data"))
            self.tokenizer = Tokenizer.load(dataset)
        self.model = model.to(getattr(torch, dtype)).eval()
        self._device = torch.device(device)
        self.batch_size, self.max_gen_toks = int(batch_size), int(max_gen_toks)
        self.block_size = model.config.block_size

    @property
    def eot_token_id(self):  # the prefix token of the module docstring
        if self.tokenizer.eot_id is not None:
            return self.tokenizer.eot_id
        if self.tokenizer.kind != "char" or "\n" not in self.tokenizer.chars:
            raise UsageError("this tokenizer has neither <|endoftext|> nor a newline to condition "
                             "an empty context on; give every request a non-empty context")
        return self.tokenizer.encode("\n")[0]

    def tok_encode(self, string, add_special_tokens=None, **kwargs):
        return self.tokenizer.encode(string)

    @torch.no_grad()
    def _loglikelihood_tokens(self, requests, disable_tqdm=False):
        """requests: (cache key or None, context tokens, continuation tokens) -> [(log p,
        is_greedy)]; rows right-padded, longest first."""
        L, results = self.block_size, [None] * len(requests)
        order = sorted(range(len(requests)),
                       key=lambda i: -len(requests[i][1]) - len(requests[i][2]))
        for start in tqdm(range(0, len(order), self.batch_size), disable=disable_tqdm):
            batch = order[start:start + self.batch_size]
            rows = []
            for i in batch:
                _, context, cont = requests[i]
                if len(cont) > L:
                    raise UsageError(f"a continuation of {len(cont)} tokens cannot be scored in a "
                                     f"{L}-token window")
                rows.append(((context or [self.eot_token_id]) + cont)[-(L + 1):-1])
            width = max(1, *map(len, rows))
            x = torch.tensor([row + [0] * (width - len(row)) for row in rows], device=self.device)
            logits, _ = self.model(x)  # (B, T, V)
            for r, i in enumerate(batch):
                cont = torch.tensor(requests[i][2], device=self.device)  # (n,)
                end = len(rows[r])
                logp = F.log_softmax(logits[r, end - len(cont):end].float(), dim=-1)  # (n, V)
                greedy = bool((logp.argmax(-1) == cont).all())
                results[i] = (logp.gather(-1, cont[:, None]).sum().item(), greedy)
                if requests[i][0] is not None:
                    self.cache_hook.add_partial("loglikelihood", requests[i][0], results[i])
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        """Total log p of each text, every token predicted once: disjoint windows of block_size
        tokens, the first conditioned on the prefix token (lm_eval's perplexity convention)."""
        windows, owner = [], []
        for j, req in enumerate(requests):
            tokens = self.tok_encode(req.args[0])
            rolling = get_rolling_token_windows(tokens, self.eot_token_id, self.block_size, 1)
            for context, cont in map(make_disjoint_window, rolling):
                windows.append((None, context, cont))
                owner.append(j)
        totals = [0.0] * len(requests)
        for j, (ll, _) in zip(owner, self._loglikelihood_tokens(windows, disable_tqdm)):
            totals[j] += ll
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    def generate_until(self, requests, disable_tqdm=False, chunk=32):
        """Decoding with the KV cache, a request at a time, until an `until`."""
        outputs = []
        for req in tqdm(requests, disable=disable_tqdm):
            context, kwargs = req.args
            until = kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            until += ["<|endoftext|>"] if self.tokenizer.eot_id is not None else []
            max_new = int(kwargs.get("max_gen_toks", self.max_gen_toks))
            temperature = float(kwargs.get("temperature", 1.0)) if kwargs.get("do_sample") else 0.0
            if not (math.isfinite(temperature) and temperature >= 0):
                raise UsageError(f"the task's temperature={temperature} must be a finite number, "
                                 f"0 or more (0: greedy)")
            # the answer in the window: past block_size each token prefills again
            room = max(1, self.block_size - max_new)
            ctx = (self.tok_encode(context) or [self.eot_token_id])[-room:]
            idx = torch.tensor([ctx], device=self.device)
            text = ""
            while idx.size(1) - len(ctx) < max_new and not any(u in text for u in until):
                n = min(chunk, max_new - (idx.size(1) - len(ctx)))
                idx = self.model.generate(idx, n, temperature=temperature, use_cache=True)
                text = self.tokenizer.decode(idx[0, len(ctx):].tolist())
            for u in until:
                text = text.split(u)[0]
            self.cache_hook.add_partial("generate_until", req.args, text)
            outputs.append(text)
        return outputs


def evaluate(argv):
    """lm_eval's own command line with --model mesh filled in."""
    from lm_eval.__main__ import cli_evaluate
    try:  # where lm_eval checks its command line and task names (not in older versions)
        from lm_eval.config.evaluate_config import EvaluatorConfig
        EvaluatorConfig.from_cli = classmethod(bad_input(EvaluatorConfig.from_cli.__func__))
        EvaluatorConfig.process_tasks = bad_input(EvaluatorConfig.process_tasks)
    except ImportError:
        pass
    sys.argv[1:] = ["run", "--model", "mesh", *argv]
    try:
        cli_evaluate()
    except OSError as e:  # a task's data neither cached nor downloadable (offline)
        raise UsageError(f"{type(e).__name__}: {e} (lm_eval downloads each task's data from the "
                         f"Hugging Face Hub on first use; run once online, then "
                         f"HF_DATASETS_OFFLINE=1 works)") from None


if __name__ == "__main__":
    sys.exit(command.main("tools/lm_eval_mesh.py", evaluate, sys.argv[1:]))
