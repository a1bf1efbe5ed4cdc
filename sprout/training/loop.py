"""The training loop: `train(recipe, out)` prepares the data, starts or resumes, then steps, evaluates and
checkpoints.

The loop is the course's: AdamW (betas 0.9/0.95, weight decay on matrices only), linear warmup then
cosine decay, gradient clipping, an optional loss mask. Around it: the data cache (`corpus`), a held-out
evaluation every `eval_every` steps logged to `OUT/train_log.csv`, and atomic checkpoints (`rundir`)
that `resume=True` continues from so that the weights at the end are bit-identical to an uninterrupted
run's. Under `torchrun --nproc_per_node=N` it trains data-parallel (gloo on CPU): each process draws its
own batches, and `core.reduce_grads` averages the gradients before the step (the trainers' shared core).
"""
from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

import numpy as np
import torch
import torch.distributed as dist
from tokenizers import Tokenizer
from tqdm import tqdm

from ..config import SproutConfig
from ..distributed import join
from ..files import load, save
from ..files.checkpoint import PathLike
from ..material import repeated_random_tokens
from ..model import Sprout
from ..tl.hooked import HookedLM
from ..walkthrough import WalkthroughGPT, build_step
from . import rundir
from .core import clip_grads, reduce_grads, resume_changes, set_lr
from .corpus import TokenData, check_windows, get_batch, init_checkpoint, prepare_data, stamp_changes
from .curriculum import get_train_batch, uses_mask
from .prepared import stamp_for
from .recipes import Recipe
from .rundir import RunDir, RunDirError

REP_HALF = 50  # the repeated-random-tokens probe: 50 random tokens, then the same 50 again


class NonFiniteLoss(FloatingPointError):
    """The loss or the gradient norm became NaN or infinite; the run stopped."""


# ----------------------------------------------------------------------------- model and optimiser

def build_model(recipe: Recipe, vocab_size: int, tokenizer: Optional[Tokenizer] = None) -> Union[Sprout, WalkthroughGPT]:
    """A fresh model for the recipe (weights drawn from torch's global RNG)."""
    if recipe.model == "walkthrough":
        # the final script's architecture at the recipe's size; no dropout: a short run underfits
        return build_step("final", vocab_size=vocab_size, tokenizer=tokenizer, context=recipe.context,
                          d_model=recipe.d_model, n_head=recipe.n_head, n_layer=recipe.n_layer, dropout=0.0)
    cfg = SproutConfig(vocab_size=vocab_size, context=recipe.context, n_layer=recipe.n_layer,
                       n_head=recipe.n_head, d_model=recipe.d_model, d_ff=recipe.d_ff)
    return Sprout(cfg, tokenizer=tokenizer)


def make_optimizer(model: torch.nn.Module, recipe: Recipe) -> torch.optim.AdamW:
    # Decay matrices (embeddings, projections), not gains and biases: shrinking a norm gain
    # towards 0 would fight the normalisation it exists to undo.
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": recipe.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=recipe.lr, betas=(recipe.beta1, recipe.beta2))


def lr_at(step: int, recipe: Recipe) -> float:
    """Linear warmup to `lr` over `warmup_steps`, then cosine decay to `min_lr` at `max_steps`."""
    if step < recipe.warmup_steps:
        return recipe.lr * (step + 1) / recipe.warmup_steps
    span = max(1, recipe.max_steps - recipe.warmup_steps)
    progress = min(1.0, (step - recipe.warmup_steps) / span)
    return recipe.min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (recipe.lr - recipe.min_lr)


def snapshot_steps(max_steps: int) -> set[int]:
    """Roughly log-spaced steps (four per decade, plus 0 and the end), where heads form fastest."""
    steps = {0, max_steps}
    k = 0
    while (s := round(10 ** (k / 4))) <= max_steps:
        steps.add(s)
        k += 1
    return steps


@torch.no_grad()
def evaluate(model: HookedLM, recipe: Recipe, val: np.ndarray, vocab_size: int) -> dict[str, float]:
    """Held-out loss on fixed windows, and the repeated-random-tokens probe (first vs second half)."""
    was_training = model.training
    model.eval()
    g = torch.Generator().manual_seed(1234)  # the same windows at every evaluation (drawn on the CPU)
    dev = _device_of(model)
    losses = []
    for _ in range(recipe.eval_batches):
        x, y = get_batch(val, recipe.batch_size, recipe.context, g)
        losses.append(model(x.to(dev), return_type="loss", targets=y.to(dev)).item())
    half = min(REP_HALF, recipe.context // 2)
    seq = repeated_random_tokens(16, half, vocab_size, g).to(dev)
    logits = model(seq[:, :-1])
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), seq[:, 1:], reduction="none")
    model.train(was_training)
    # first half: predicting tokens 1..half-1; second half: tokens half+1..2*half-1 (copyable ones)
    return {"val_loss": sum(losses) / len(losses), "rep_first": nll[:, :half - 1].mean().item(),
            "rep_second": nll[:, half:].mean().item()}


def _device_of(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def check_device(device: str) -> torch.device:
    """The torch device a run trains on: "cpu", "cuda" or "cuda:N" (one that exists), else a ValueError."""
    dev = torch.device(device) if isinstance(device, str) and re.fullmatch(r"cpu|cuda(:\d+)?", device) else None
    if dev is None:
        raise ValueError(f"--device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if dev.type == "cuda" and not (torch.cuda.is_available() and (dev.index or 0) < torch.cuda.device_count()):
        raise ValueError(f"--device {device}: no such CUDA device here ({torch.cuda.device_count()} visible); "
                         "train with --device cpu")
    return dev


# ----------------------------------------------------------------------------- the run

@dataclass
class Run:
    """A run in progress: what it trains, on what, and how far it has come."""

    recipe: Recipe
    dir: RunDir
    data: TokenData
    model: HookedLM
    optimizer: torch.optim.Optimizer
    batch_gen: torch.Generator
    world: int = 1
    rank: int = 0
    step: int = 0
    log_rows: list = field(default_factory=list)
    loss_sum: float = 0.0  # train_loss: the mean since the last evaluation
    loss_n: int = 0
    last_ckpt: Optional[Path] = None

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def vocab_size(self) -> int:
        return self.data.tokenizer.get_vocab_size()


def _distributed() -> tuple[int, int]:
    """(world size, rank): under torchrun, after joining the process group (gloo); else (1, 0). A stray
    WORLD_SIZE without torchrun's other variables is refused (`sprout.distributed`)."""
    return join()


def _check_same_recipe(run_dir: RunDir, recipe: Recipe) -> None:
    diff = resume_changes(run_dir.read_recipe(), recipe, was="run has")
    if diff:
        raise RunDirError(f"--resume: the recipe differs from the run's {run_dir.recipe_path}: " + ", ".join(diff))


def _check_same_data(run_dir: RunDir, stamp: dict) -> None:
    """On resume, before any tokenising: the data must be what the run began with."""
    saved = (run_dir.marker() or {}).get("data")
    changes = stamp_changes(saved, stamp) if saved is not None else []
    if changes:
        raise RunDirError(f"--resume: the data changed since {run_dir.path} began ({'; '.join(changes)}); "
                          "resume with the run's data, or start a new run with a new --out")


def _check_same_tokenizer(data: TokenData, last: Path, what: str = "--resume") -> None:
    """On resume (or --init): the tokenizer must be the checkpoint's, or the ids would mean other tokens."""
    old, new = rundir.checkpoint_tokenizer(last), data.tokenizer
    if old is not None and old.get_vocab() != new.get_vocab():
        raise RunDirError(f"{what}: the tokenizer differs from the run's ({last / 'tokenizer.json'}: "
                          f"{old.get_vocab_size()} ids; the data's: {new.get_vocab_size()} ids"
                          f"{', mapped differently' if old.get_vocab_size() == new.get_vocab_size() else ''})")


def _prepare_main(recipe: Recipe, run_dir: RunDir, cache: Path, resume: bool) -> TokenData:
    """Rank 0: check and lock the run directory, check a resume against the run, build the data cache."""
    # a missing, endless or huge --data, or a missing package (and no cache prepared elsewhere), fails first
    stamp = stamp_for(recipe, cache)
    run_dir.open(resume)
    if resume:
        _check_same_recipe(run_dir, recipe)
        _check_same_data(run_dir, stamp)
    else:  # the folder is ours (checked by open): a log left by a start that was killed goes
        run_dir.log_path.unlink(missing_ok=True)
        run_dir.recipe_path.write_text(recipe.to_json())
    data = prepare_data(recipe, cache, stamp)
    if resume:
        last = run_dir.latest()
        assert last is not None  # run_dir.open(resume) found the run's checkpoint
        _check_same_tokenizer(data, last)
    marker = {"data": data.stamp, "tokenizer": {"kind": recipe.tokenizer, "vocab_size": data.tokenizer.get_vocab_size()}}
    if {k: (run_dir.marker() or {}).get(k) for k in marker} != marker:
        run_dir.write_marker(marker["data"], marker["tokenizer"])
    return data


def prepare(recipe: Recipe, run_dir: RunDir, data_cache: Optional[PathLike], resume: bool, world: int, rank: int) -> TokenData:
    """The run's data: rank 0 locks the run directory and builds it; the other ranks then read it."""
    cache = Path(data_cache) if data_cache else run_dir.path / "data"
    if rank == 0:
        data = _prepare_main(recipe, run_dir, cache, resume)
    if world > 1:
        dist.barrier()
    if rank != 0:
        data = prepare_data(recipe, cache)
    vocab_size = data.tokenizer.get_vocab_size()
    if recipe.tokenizer == "bpe" and vocab_size != recipe.vocab_size:
        raise ValueError(f"the BPE tokenizer learned only {vocab_size} tokens, fewer than vocab_size "
                         f"{recipe.vocab_size}: the corpus is too small for that vocabulary")
    for split in (data.train, data.val):  # before any step: a short val split would fail at the first eval
        check_windows(split, recipe.context)
    return data


def start(recipe: Recipe, run_dir: RunDir, data: TokenData, world: int, rank: int, device: str = "cpu") -> Run:
    torch.manual_seed(recipe.seed)  # the same init on every rank
    model = build_model(recipe, data.tokenizer.get_vocab_size(), data.tokenizer)
    if recipe.init:
        _warm_start(model, recipe, data)
    model.to(device)  # built on the CPU from the CPU's RNG: the same initial weights on any device
    batch_gen = torch.Generator().manual_seed(recipe.seed * 1000 + rank + 1)  # different windows on every rank
    return Run(recipe, run_dir, data, model, make_optimizer(model, recipe), batch_gen, world, rank)


def _warm_start(model: torch.nn.Module, recipe: Recipe, data: TokenData) -> None:
    """Load --init's weights into the freshly built model: same architecture, same tokenizer, or an error."""
    ckpt = init_checkpoint(recipe)
    _check_same_tokenizer(data, ckpt, "--init")
    source = load(ckpt)
    try:
        model.load_state_dict(source.state_dict())
    except RuntimeError as e:
        raise ValueError(f"--init {recipe.init}: its weights do not fit the recipe's model ({e})") from None


def resume_from(recipe: Recipe, run_dir: RunDir, data: TokenData, world: int, rank: int, device: str = "cpu") -> Run:
    last = run_dir.check_resume()
    model = load(last).to(device)
    state = rundir.read_trainer_state(last)
    if len(state["rng"]) != world:
        raise RunDirError(f"--resume: the checkpoint was written by {len(state['rng'])} process(es), "
                          f"now there are {world}; resume with the same number")
    optimizer = make_optimizer(model, recipe)
    optimizer.load_state_dict(state["optimizer"])  # its state moves to the parameters' device
    batch_gen = torch.Generator()
    rundir.set_rng_state(state["rng"][rank], batch_gen)
    loss_sum, loss_n = state["loss_sum"]
    return Run(recipe, run_dir, data, model, optimizer, batch_gen, world, rank, step=state["step"],
               log_rows=rundir.read_log(run_dir.log_path, upto=state["step"]), loss_sum=loss_sum, loss_n=loss_n,
               last_ckpt=last)


def train_step(run: Run, step: int) -> tuple[float, float]:
    """One optimiser step; returns (lr, loss). Raises NonFiniteLoss before a NaN/inf reaches the weights."""
    recipe = run.recipe
    lr = lr_at(step, recipe)
    set_lr(run.optimizer, lr)
    dev = _device_of(run.model)  # batches are drawn on the CPU (its generator's state is what resumes)
    x, y, mask = (t.to(dev, non_blocking=True) for t in get_train_batch(recipe, run.data.train, run.vocab_size,
                                                                         run.batch_gen, step))
    loss = run.model(x, return_type="loss", targets=y, loss_mask=mask if uses_mask(recipe, step) else None)
    run.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    reduce_grads(run.model.parameters(), run.world)  # the mean over processes (data parallelism)
    # grad_clip 0 means no clipping (as in nanoGPT); the norm is still measured for the check below
    norm = clip_grads(run.model.parameters(), recipe.grad_clip)
    bad = torch.tensor([0.0 if torch.isfinite(loss) and torch.isfinite(norm) else 1.0])
    if run.world > 1:
        dist.all_reduce(bad)
    if bad.item():
        raise NonFiniteLoss(
            f"the loss became {loss.item()} (gradient norm {norm.item()}) at step {step + 1} with lr {lr:.3g}; "
            f"stopped without updating the weights. The last good checkpoint is "
            f"{run.last_ckpt or 'none (no checkpoint was written yet)'}; try a lower --lr or more --warmup-steps")
    run.optimizer.step()
    run.step = step + 1
    run.loss_sum, run.loss_n = run.loss_sum + loss.item(), run.loss_n + 1
    return lr, loss.item()


def evaluate_and_log(run: Run, lr: float, elapsed: float, bar: tqdm) -> None:
    """Rank 0 evaluates on held-out windows and appends a row to train_log.csv; every rank resets its mean."""
    if run.main:
        ev = evaluate(run.model, run.recipe, run.data.val, run.vocab_size)
        mean = run.loss_sum / run.loss_n
        run.log_rows.append({"step": run.step, "tokens": run.step * _tokens_per_step(run), "lr": f"{lr:.6g}",
                             "train_loss": f"{mean:.5f}", **{k: f"{v:.5f}" for k, v in ev.items()},
                             "elapsed_s": f"{elapsed:.1f}"})
        rundir.write_log(run.dir.log_path, run.log_rows)
        bar.write(f"step {run.step}: train {mean:.3f}  val {ev['val_loss']:.3f}  "
                  f"repeat 1st/2nd half {ev['rep_first']:.2f}/{ev['rep_second']:.2f}")
    run.loss_sum, run.loss_n = 0.0, 0


def checkpoint(run: Run) -> Path:
    """`OUT/checkpoints/step_XXXXXXXX/`, complete or absent: written under a temporary name, renamed."""
    states: list[Optional[dict]] = [None] * run.world
    mine = rundir.rng_state(run.batch_gen)
    if run.world > 1:
        dist.all_gather_object(states, mine)
    else:
        states = [mine]
    root = run.dir.checkpoints
    final = rundir.step_dir(root, run.step)
    if run.main:
        tmp = root / f".{final.name}.partial"
        rundir.clear_partial(tmp)
        save(run.model, tmp)
        rundir.write_trainer_state(tmp / "trainer.pt", {
            "step": run.step, "optimizer": run.optimizer.state_dict(), "rng": states,
            "recipe": run.recipe.to_dict(), "loss_sum": [run.loss_sum, run.loss_n]})
        rundir.publish(tmp, final)
        rundir.prune(root, snapshot_steps(run.recipe.max_steps) if run.recipe.snapshots else set())
    if run.world > 1:
        dist.barrier()
    run.last_ckpt = final
    return final


def _tokens_per_step(run: Run) -> int:
    return run.recipe.batch_size * run.recipe.context * run.world


def _due(run: Run, every: int) -> bool:
    return run.step % every == 0 or run.step == run.recipe.max_steps


def steps(run: Run, show_progress: bool) -> None:
    """Train from run.step to max_steps: a step, then an evaluation and a checkpoint when due."""
    recipe = run.recipe
    snaps = snapshot_steps(recipe.max_steps) if recipe.snapshots else set()
    if run.step == 0 and 0 in snaps:
        checkpoint(run)
    first, t0 = run.step, time.time()
    with tqdm(total=recipe.max_steps, initial=first, disable=not (show_progress and run.main),
              dynamic_ncols=True, mininterval=2.0) as bar:
        for step in range(first, recipe.max_steps):
            lr, loss = train_step(run, step)
            elapsed = time.time() - t0
            bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", refresh=False,
                            tok_s=f"{(run.step - first) * _tokens_per_step(run) / max(elapsed, 1e-9):.0f}")
            bar.update(1)
            if _due(run, recipe.eval_every):
                evaluate_and_log(run, lr, elapsed, bar)
            if _due(run, recipe.ckpt_every) or run.step in snaps:
                checkpoint(run)
    if run.last_ckpt is None:  # max_steps 0
        checkpoint(run)


def train(recipe: Recipe, out: PathLike, data_cache: Optional[PathLike] = None, resume: bool = False,
          progress: bool = True, device: str = "cpu") -> torch.nn.Module:
    """Run a recipe; returns the trained model (in eval mode; also in `out`'s last checkpoint).

    Args:
        recipe: what to train and how.
        out: the run directory (see `sprout.training.rundir`): absent, empty, or a run without checkpoints
            for a new run; a run directory with a checkpoint for `resume`.
        data_cache: where tokenised corpora are cached; default `out/data`.
        resume: continue from the latest checkpoint in `out` (the recipe and the data must be the run's).
        progress: show a tqdm bar (rank 0 only).
        device: "cpu" or "cuda[:N]" (batches drawn on the CPU, as always; on a GPU matmuls may use TF32).

    Raises:
        NonFiniteLoss: the loss or gradient norm became NaN/inf; the last checkpoint is kept.
        RunDirError: `out` is not a place for this run (a user's folder, a file, locked by another
            process, a different recipe or data on resume, nothing to resume from).
        ValueError: a corpus too small or unreadable.
    """
    dev = check_device(device)
    if dev.type == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32 matmuls: the tiny models are launch-bound anyway
    world, rank = _distributed()
    run_dir = RunDir(out)
    try:  # the run directory stays locked until the end
        data = prepare(recipe, run_dir, data_cache, resume, world, rank)
        run = (resume_from if resume else start)(recipe, run_dir, data, world, rank, str(dev))
        run.model.train()
        steps(run, progress)
        if world > 1:
            dist.barrier()
    finally:
        run_dir.close()
    return run.model.eval()
