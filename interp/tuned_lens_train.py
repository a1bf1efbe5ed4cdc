"""Training a tuned lens: the reference recipe of Belrose et al. (2023), on one process or under torchrun.

Per step, one forward of the frozen model caches every stream the lens reads; each translator is then
trained to minimise KL(final output || lens output) at the same position, layer by layer (only one
layer's [tokens, vocab] logits exist at a time). SGD with Nesterov momentum 0.9, learning rate
lr * (1 - momentum) decaying linearly to 0, weight decay 1e-3, gradients clipped to norm 1: the
`tuned-lens` package's defaults. Under `torchrun` each process takes its share of every global batch
and the gradients are averaged over processes (gloo on a CPU), so N processes take the same steps as
one process on the same data.

    torchrun --standalone --nproc_per_node=2 -m interp.tuned_lens_train gpt-4 --steps 200 --out lens_dir
"""
from __future__ import annotations

import argparse
import contextlib
import os
import random
import time
from typing import Optional

import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from sprout.synthetic import generate_corpus, generate_story

from ._batching import TextOrTokens, token_rows
from ._lens_settings import TunedLensSettings, resume_start, schedule_of
from ._model import final_modules, unembed
from .cli import positive
from .texts import held_out_stories
from .tuned_lens import TunedLens, check_save_target, lens_comparison


def windows(model, data: TextOrTokens, seq_len: Optional[int] = None) -> torch.Tensor:
    """The data's tokens as one stream cut into [n_windows, seq_len] rows (a shorter tail is dropped)."""
    rows = token_rows(model, data, seq_len)
    seq_len = int(model.cfg.n_ctx) if seq_len is None else int(seq_len)
    stream = torch.cat(rows)
    n = stream.numel() // seq_len
    if n == 0:
        raise ValueError(f"the data has {stream.numel()} tokens, fewer than one window of seq_len={seq_len}: "
                         "pass more text or a smaller seq_len")
    return stream[:n * seq_len].view(n, seq_len)


def _batch_rows(n_windows: int, batch_size: int, step: int, seed: int) -> torch.Tensor:
    """The windows of global batch `step`: consecutive slices of a fresh permutation per epoch, so that any
    step's batch is known without replaying the steps before it (resuming, several processes)."""
    start = step * batch_size
    idx: list[int] = []
    while len(idx) < batch_size:
        epoch, offset = divmod(start + len(idx), n_windows)
        perm = torch.randperm(n_windows, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
        idx.extend(perm[offset:offset + batch_size - len(idx)].tolist())
    return torch.tensor(idx)


@contextlib.contextmanager
def _frozen(model):
    """The model's parameters do not require grad inside (gradients flow through the unembedding into the
    translators only, and nothing lands in the model's .grad); restored after."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    try:
        for p, _ in flags:
            p.requires_grad_(False)
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


def world_and_rank() -> tuple[int, int]:
    """(processes, this one's rank): under torchrun after joining the gloo group, else (1, 0)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        dist.init_process_group("gloo")
    if dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


class _CrossEntropyToTarget(torch.autograd.Function):
    """Mean over rows of -sum_v p_v log softmax(z)_v, for logits z [rows, vocab] and a fixed distribution p.

    Written out because autograd's log_softmax -> multiply -> sum keeps and re-reads three [rows, vocab]
    tensors; here the forward is one log-sum-exp and one dot product, and the backward one pass,
    softmax(z) - p. Used for an output layer other than a bias-free nn.Linear (`_UnembedCrossEntropy`).
    """

    @staticmethod
    def forward(ctx, z, p):
        lse = torch.logsumexp(z, dim=-1)  # [rows]
        ctx.save_for_backward(z, p, lse)
        return lse.mean() - torch.dot(p.reshape(-1), z.reshape(-1)) / z.shape[0]

    @staticmethod
    def backward(ctx, grad):
        z, p, lse = ctx.saved_tensors
        g = torch.exp(z - lse[:, None])
        g.sub_(p).mul_(grad / z.shape[0])
        return g, None


class _Scratch:
    """The [tokens, vocab] buffers of a lens step, reused by every translator of every step: the
    output distribution `p`, and the logits, log-probabilities and gradient of one translator.

    Why: a fresh 16 MB tensor per use costs more than the arithmetic on it (glibc returns blocks that
    large to the kernel, so each one is page-faulted in again): with them reused, and the row-wise fused
    log_softmax, the gpt-4 step went from 57-65% to over 70% of its floor. `turn` counts forwards, so a
    backward that comes after a later forward (whose buffers it would read) is refused, not computed
    from the wrong logits.
    """

    def __init__(self):
        self.buffers: Optional[list[torch.Tensor]] = None
        self.turn = 0

    def take(self, rows: int, vocab: int, like: torch.Tensor) -> list[torch.Tensor]:
        """[p, z, log_softmax(z), grad], each [rows, vocab] like `like`."""
        b = self.buffers
        if b is None or b[0].shape != (rows, vocab) or b[0].dtype != like.dtype or b[0].device != like.device:
            b = self.buffers = [like.new_empty(rows, vocab) for _ in range(4)]
        return b

    @torch.no_grad()
    def target(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The output distribution p of logits [rows, vocab] (in a buffer) and sum_v p log p, the mean over rows."""
        p, _, log_p, _ = self.take(logits.shape[0], logits.shape[1], logits)
        torch.log_softmax(logits, dim=-1, out=log_p)
        torch.exp(log_p, out=p)
        return p, torch.dot(p.reshape(-1), log_p.reshape(-1)) / logits.shape[0]


class _UnembedCrossEntropy(torch.autograd.Function):
    """`_CrossEntropyToTarget` of the logits x @ weight^T, for normed streams x [rows, d_model] and a
    bias-free output layer's weight [vocab, d_model], with every [rows, vocab] tensor in `scratch`:
    the forward writes z = x W^T and log_softmax(z); the backward, softmax(z) - p, then one matmul back to
    [rows, d_model]. Each forward's backward must come before the next forward."""

    @staticmethod
    def forward(ctx, x, weight, p, scratch: _Scratch):
        _, z, log_q, _ = scratch.take(x.shape[0], weight.shape[0], x)
        torch.mm(x, weight.t(), out=z)
        torch.log_softmax(z, dim=-1, out=log_q)
        ctx.save_for_backward(x, weight, p)
        scratch.turn += 1
        ctx.scratch, ctx.turn = scratch, scratch.turn
        return -torch.dot(p.reshape(-1), log_q.reshape(-1)) / x.shape[0]

    @staticmethod
    def backward(ctx, grad):
        x, weight, p = ctx.saved_tensors
        if ctx.scratch.turn != ctx.turn:
            raise RuntimeError("the tuned lens' logits were overwritten by a later forward: backpropagate each "
                               "translator's loss before the next one's forward (as lens_step does)")
        _, _, log_q, g = ctx.scratch.buffers
        torch.exp(log_q, out=g).sub_(p)
        scale = grad / x.shape[0]
        grad_x = torch.mm(g, weight).mul_(scale) if ctx.needs_input_grad[0] else None
        grad_w = torch.mm(g.t(), x).mul_(scale) if ctx.needs_input_grad[1] else None
        return grad_x, grad_w, None, None


def lens_cross_entropy(model, resid: torch.Tensor, p: torch.Tensor, scratch: _Scratch) -> torch.Tensor:
    """Mean cross-entropy of the model's output distribution p [rows, vocab] under the logits of the
    (translated) streams resid [rows, d_model], read through the model's final norm and output layer."""
    norm, head = final_modules(model)
    x = resid if norm is None else norm(resid)
    if isinstance(head, torch.nn.Linear) and head.bias is None:
        return _UnembedCrossEntropy.apply(x.float(), head.weight.float(), p, scratch)
    return _CrossEntropyToTarget.apply(head(x).float(), p)


def lens_step(model, lens: TunedLens, ids: torch.Tensor, scale: float = 1.0,
              scratch: Optional[_Scratch] = None) -> list[float]:
    """Forward of the frozen model once, then each translator's KL(final || lens), backpropagated layer by
    layer (times `scale`). Returns the mean KL per translator (nats). `scratch` keeps the [tokens, vocab]
    buffers from one step to the next."""
    names = lens.sites[:-1]
    scratch = scratch or _Scratch()
    with torch.no_grad():
        logits, cache = model.run_with_cache(ids, names_filter=names)
        p, neg_h = scratch.target(logits.float().flatten(0, -2))
    kls = []
    for i, name in enumerate(names):
        resid = cache[name].flatten(0, -2)
        cross = lens_cross_entropy(model, lens(i, resid), p, scratch)  # KL = cross - H(p)
        (cross * scale).backward()
        kls.append((cross.detach() + neg_h).item())
    return kls


def train_tuned_lens(model, data: TextOrTokens, steps: int = 250, batch_size: int = 8, seq_len: Optional[int] = None,
                     lr: float = 1.0, momentum: float = 0.9, weight_decay: float = 1e-3, grad_clip: float = 1.0,
                     seed: int = 0, lens: Optional[TunedLens] = None, held_out: Optional[TextOrTokens] = None,
                     progress: bool = True, data_name: Optional[str] = None, stop_at: Optional[int] = None) -> TunedLens:
    """Train a tuned lens for `model` (which stays frozen), or resume `lens` up to `steps`.

    Args:
        model: a hooked model (Sprout, the walkthrough GPT).
        data: text, a list of texts or ids [pos] / [batch, pos]: the model's own kind of text; cut into
            windows of `seq_len` (default the model's context), `batch_size` windows per step (the global
            batch: under torchrun each of N processes takes batch_size / N of them).
        steps: total optimizer steps (a resumed lens continues from `lens.step`).
        lr, momentum, weight_decay, grad_clip: the recipe; SGD's learning rate is lr * (1 - momentum),
            decayed linearly to 0 over `steps`; grad_clip 0 means no clipping. Every setting is checked
            before any work (`interp._lens_settings.TunedLensSettings`: lr > 0, momentum in [0, 1), ...).
        seed: the order in which windows are drawn.
        lens: a lens for this model to resume (its step and optimizer state are kept on it): the steps,
            batch_size, seq_len, lr, momentum, weight_decay, grad_clip, seed and data must be the ones it
            was trained with, or it is refused. A lens loaded from a file keeps no optimizer state: it
            restarts the schedule at step 0 from its translators (with a warning).
        held_out: data to measure the per-layer KL on at the end (recorded in `lens.info`).
        stop_at: stop after this many steps of the `steps`-step schedule (resume later with `lens=`).

    Returns:
        The trained TunedLens; `lens.info` records the recipe, data, steps, tokens/s and held-out KL.
    """
    settings = TunedLensSettings(steps=steps, batch_size=batch_size, seq_len=seq_len, lr=lr, momentum=momentum,
                                 weight_decay=weight_decay, grad_clip=grad_clip, seed=seed, stop_at=stop_at)
    if lens is not None and not isinstance(lens, TunedLens):
        raise TypeError(f"lens must be an interp.TunedLens to resume, got {type(lens).__name__}")
    # training needs autograd even when called under torch.no_grad() or torch.inference_mode() (whose
    # tensors could not be updated later)
    with torch.inference_mode(False), torch.enable_grad():
        return _train(model, data, settings, lens, held_out, progress, data_name)


def _start(model, data, s: TunedLensSettings, lens: Optional[TunedLens], world: int):
    """The lens, its optimizer (state restored on an exact resume), the windows and the first step."""
    if s.batch_size % world:
        raise ValueError(f"batch_size must be a positive multiple of the {world} processes, got {s.batch_size}")
    if lens is None:
        lens = TunedLens(model).to(model.cfg.device)
    else:
        lens.check_model(model, "the lens to resume")
    dtype = next(model.parameters()).dtype
    unembed(model, torch.zeros(1, int(model.cfg.d_model), device=model.cfg.device, dtype=dtype))  # fails early on a model it cannot read
    rows = windows(model, data, s.seq_len)
    schedule = schedule_of(s, rows)
    start = resume_start(lens, schedule)
    opt = torch.optim.SGD(lens.parameters(), lr=s.lr * (1 - s.momentum), momentum=s.momentum,
                          nesterov=s.momentum > 0, weight_decay=s.weight_decay)
    if start > 0:
        assert lens.optimizer_state is not None  # resume_start starts past 0 only with it
        opt.load_state_dict(lens.optimizer_state)
    lens.info["schedule"] = schedule
    return lens, opt, rows, start


def _train(model, data: TextOrTokens, s: TunedLensSettings, lens: Optional[TunedLens], held_out, progress: bool,
           data_name: Optional[str]) -> TunedLens:
    world, rank = world_and_rank()
    if held_out is not None:
        token_rows(model, held_out)  # checked before training, not after it
    lens, opt, rows, start = _start(model, data, s, lens, world)
    steps, batch_size, lr, momentum, seed = s.steps, s.batch_size, s.lr, s.momentum, s.seed
    lens.train()
    t0, kls, scratch = time.perf_counter(), [], _Scratch()
    end = steps if s.stop_at is None else min(s.stop_at, steps)
    bar = tqdm(range(start, end), initial=start, total=steps, desc="tuned lens", disable=not progress or rank != 0)
    with _frozen(model):
        for step in bar:
            for group in opt.param_groups:
                group["lr"] = lr * (1 - momentum) * (1 - step / steps)
            ids = rows[_batch_rows(len(rows), batch_size, step, seed)]
            share = batch_size // world
            kls = lens_step(model, lens, ids[rank * share:(rank + 1) * share].to(model.cfg.device), scratch=scratch)
            _average_grads(lens, world)
            if s.grad_clip > 0:  # 0: no clipping (clip_grad_norm_ to 0 would zero every gradient)
                torch.nn.utils.clip_grad_norm_(lens.parameters(), s.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            lens.step = step + 1
            bar.set_postfix(kl=f"{sum(kls) / len(kls):.3f}")
    seconds = time.perf_counter() - t0
    lens.eval()
    lens.optimizer_state = opt.state_dict()
    lens.info.update(recipe=dict(batch_size=batch_size, seq_len=rows.shape[1], lr=lr, momentum=momentum,
                                 weight_decay=s.weight_decay, grad_clip=s.grad_clip, seed=seed,
                                 optimizer="SGD nesterov" if momentum > 0 else "SGD", schedule="linear to 0"),
                     steps=steps, data=data_name or f"{rows.numel()} tokens", train_kl=kls, train_seconds=seconds,
                     tokens_per_s=(lens.step - start) * rows[:batch_size].numel() / seconds if lens.step > start else None)
    if held_out is not None:
        cmp = lens_comparison(model, held_out, lens)
        tuned = cmp[cmp.lens == "tuned"]
        lens.info["held_out_kl"] = {str(layer): kl for layer, kl in zip(tuned.layer, tuned.kl_to_final)}
    return lens


def _average_grads(lens: TunedLens, world: int) -> None:
    """Data parallelism's all-reduce: every process ends up with the mean of the processes' gradients."""
    if world == 1:
        return
    grads: list[torch.Tensor] = []
    for p in lens.parameters():
        assert p.grad is not None, "every translator has a gradient after the backward"
        grads.append(p.grad)
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= world
    for g, chunk in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(chunk.view_as(g))


def model_text(n_chars: int, seed: Optional[int] = None) -> str:
    """Stories from the generator the demo models were trained on: with seed None, the first `n_chars` of
    the demos' own training corpus (`generate_corpus(..., seed=0)`); else other, unseen stories."""
    if seed is None:
        return generate_corpus(n_chars, seed=0)
    rng, stories, total = random.Random(f"tuned-lens-{seed}"), [], 0
    while total < n_chars:
        stories.append(generate_story(rng))
        total += len(stories[-1]) + 2
    return "\n\n".join(stories)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m interp.tuned_lens_train",
                                 description="train a tuned lens for a model and save it beside nothing else")
    ap.add_argument("model", help="a checkpoint path or demo name")
    ap.add_argument("--steps", type=positive, default=250)
    ap.add_argument("--batch-size", type=positive, default=8)
    ap.add_argument("--train-chars", type=positive, default=400_000)
    ap.add_argument("--held-out-chars", type=positive, default=60_000)
    ap.add_argument("--seed", type=int, default=0, help="the order windows are drawn in")
    ap.add_argument("--out", required=True, help="directory for tuned_lens.safetensors + tuned_lens.json")
    args = ap.parse_args(argv)
    from sprout.checkpoint import load

    try:  # --out before the model loads and the lens trains; a bad --out or model is one line
        check_save_target(args.out)
        model = load(args.model)
    except (OSError, ValueError, MemoryError) as e:
        raise SystemExit(f"python -m interp.tuned_lens_train: {e}") from None
    t0 = time.perf_counter()
    lens = train_tuned_lens(model, model_text(args.train_chars), steps=args.steps, batch_size=args.batch_size,
                            seed=args.seed, held_out=held_out_stories(args.held_out_chars),
                            data_name=f"the first {args.train_chars} chars of the demos' training corpus "
                                      "(sprout.synthetic.generate_corpus, seed 0); held out: interp.held_out_stories")
    if world_and_rank()[1] == 0:
        print(f"{args.model}: {time.perf_counter() - t0:.0f} s in all (data, {args.steps} steps, held-out KL), "
              f"{torch.get_num_threads()} threads; held-out KL per layer {lens.info['held_out_kl']}")
        print(f"saved {lens.save(args.out)}")
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
