"""Train a model from a recipe: `sprout train --recipe gpt-4 --out runs/gpt-4`.

The loop is the course's: AdamW (betas 0.9/0.95, weight decay on matrices only), linear warmup then
cosine decay, gradient clipping, an optional loss mask. Around it: a data cache (the corpus is
generated, its BPE tokenizer trained and the text tokenised into uint16 memmaps once), a held-out
evaluation every `eval_every` steps logged to `OUT/train_log.csv`, and atomic checkpoints

    OUT/checkpoints/step_XXXXXXXX/   config.json, model.safetensors, tokenizer.json (sprout.checkpoint.save)
                                     trainer.pt (optimizer, step, every RNG state; weights_only-safe)

that `--resume` continues from so that the weights at the end are bit-identical to an uninterrupted
run's. Under `torchrun --nproc_per_node=N` it trains with DistributedDataParallel (gloo on CPU).
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import os
import random
import shutil
import sys
import time
from dataclasses import fields
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist

from .recipes import RECIPES, Recipe, get_recipe

LOG_COLUMNS = ["step", "tokens", "lr", "train_loss", "val_loss", "rep_first", "rep_second", "elapsed_s"]
REP_HALF = 50  # the repeated-random-tokens probe: 50 random tokens, then the same 50 again
KEEP_LAST = 2  # non-snapshot checkpoints kept


class NonFiniteLoss(FloatingPointError):
    """The loss or the gradient norm became NaN or infinite; the run stopped."""


# ----------------------------------------------------------------------------- data

def prepare_data(recipe: Recipe, cache_root: Path):
    """Tokenizer and train/val token files for this recipe, built once and cached by content key.

    Returns:
        (tokenizer, train memmap, val memmap).
    """
    from .data import build_token_files, generate_corpus, read_text
    from .tokenizer import char_tokenizer, load_tokenizer, save_tokenizer, train_bpe

    key = {k: getattr(recipe, k) for k in ("data", "tokenizer", "corpus_chars", "corpus_seed", "val_fraction")}
    if recipe.tokenizer == "bpe":
        key["vocab_size"] = recipe.vocab_size
    if recipe.data:
        st = Path(recipe.data).stat() if Path(recipe.data).exists() else None
        key["data_stamp"] = [st.st_size, st.st_mtime_ns] if st else None
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    folder = cache_root / f"{'text' if recipe.data else 'stories'}-{recipe.tokenizer}-{digest}"
    if not (folder / "done.json").is_file():
        text = read_text(recipe.data) if recipe.data else generate_corpus(recipe.corpus_chars, recipe.corpus_seed)
        tok = train_bpe(text, recipe.vocab_size) if recipe.tokenizer == "bpe" else char_tokenizer(text)
        tmp = cache_root / f".{folder.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        build_token_files(text, tok, tmp, val_fraction=recipe.val_fraction)
        save_tokenizer(tok, tmp / "tokenizer.json")
        (tmp / "done.json").write_text(json.dumps(key, indent=2) + "\n")
        if folder.exists():  # a half-built folder from a crash: replace it
            shutil.rmtree(folder)
        os.rename(tmp, folder)
    tok = load_tokenizer(folder / "tokenizer.json")
    train = np.memmap(folder / "train.bin", dtype=np.uint16, mode="r")
    val = np.memmap(folder / "val.bin", dtype=np.uint16, mode="r")
    return tok, train, val


def repeat_rows(n: int, context: int, vocab_size: int, lo: int, hi: int, generator: torch.Generator,
                corpus: Optional[np.ndarray] = None, unigram: float = 0.0):
    """Rows of random segments each followed by its exact repeat (the induction curriculum).

    Args:
        n, context: the rows' count and length.
        vocab_size: uniform segments draw ids from [1, vocab_size).
        lo, hi: the shortest and longest segment.
        generator: the source of every draw.
        corpus, unigram: with probability `unigram` a segment's tokens are drawn instead from random
            positions of `corpus` (so with the corpus's unigram frequencies, but in random order).

    Returns:
        (x, y, mask), each [n, context]; mask is 1 where y lies in a second copy after its first token,
        the positions where copying from the first copy predicts the target.
    """
    from .data import repeated_random_tokens

    seqs, masks = [], []
    for _ in range(n):
        parts, mask = [], []
        while sum(map(len, parts)) < context + 1:
            half = int(torch.randint(lo, hi + 1, (1,), generator=generator))
            if unigram and float(torch.rand(1, generator=generator)) < unigram:
                at = torch.randint(len(corpus), (half,), generator=generator).numpy()
                seg = torch.from_numpy(corpus[at].astype(np.int64))
                parts.append(torch.cat([seg, seg]))
            else:
                parts.append(repeated_random_tokens(1, half, vocab_size, generator)[0])
            mask += [0] * (half + 1) + [1] * (half - 1)  # mask[j]: is token j predictable by copying
        seqs.append(torch.cat(parts)[:context + 1])
        masks.append(torch.tensor(mask[1:context + 1]))  # the target of position t is token t + 1
    seq = torch.stack(seqs)
    return seq[:, :-1], seq[:, 1:], torch.stack(masks)


def get_train_batch(recipe: Recipe, train: np.ndarray, vocab_size: int, generator: torch.Generator,
                    step: int = 0):
    """One training batch: story windows and repeat-curriculum rows. Returns (x, y, loss_mask) [B, T]."""
    from .data import get_batch

    n_rep = round(recipe.batch_size * (1.0 if step < recipe.curriculum_steps else recipe.repeat_fraction))
    n_story = recipe.batch_size - n_rep
    xs, ys, ms = [], [], []
    if n_story:
        x, y = get_batch(train, n_story, recipe.context, generator)
        xs.append(x), ys.append(y), ms.append(torch.ones_like(x))
    if n_rep:
        x, y, m = repeat_rows(n_rep, recipe.context, vocab_size, recipe.repeat_min,
                              min(recipe.repeat_max, recipe.context // 2), generator, train, recipe.repeat_unigram)
        xs.append(x), ys.append(y), ms.append(m)
    return torch.cat(xs), torch.cat(ys), torch.cat(ms)


# ----------------------------------------------------------------------------- model and optimiser

def build_model(recipe: Recipe, vocab_size: int, tokenizer=None) -> torch.nn.Module:
    """A fresh model for the recipe (weights drawn from torch's global RNG)."""
    if recipe.model == "walkthrough":
        from .walkthrough import build_step

        # the final script's architecture at the recipe's size; no dropout: a short run underfits
        return build_step("final", vocab_size=vocab_size, tokenizer=tokenizer, context=recipe.context,
                          d_model=recipe.d_model, n_head=recipe.n_head, n_layer=recipe.n_layer, dropout=0.0)
    from .config import SproutConfig
    from .model import Sprout

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


# ----------------------------------------------------------------------------- evaluation

@torch.no_grad()
def evaluate(model, recipe: Recipe, val: np.ndarray, vocab_size: int) -> dict[str, float]:
    """Held-out loss on fixed windows, and the repeated-random-tokens probe (first vs second half)."""
    from .data import get_batch, repeated_random_tokens

    was_training = model.training
    model.eval()
    g = torch.Generator().manual_seed(1234)  # the same windows at every evaluation
    losses = []
    for _ in range(recipe.eval_batches):
        x, y = get_batch(val, recipe.batch_size, recipe.context, g)
        losses.append(model(x, y)[1].item())
    half = min(REP_HALF, recipe.context // 2)
    seq = repeated_random_tokens(16, half, vocab_size, g)
    logits, _ = model(seq[:, :-1])
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), seq[:, 1:], reduction="none")
    model.train(was_training)
    # first half: predicting tokens 1..half-1; second half: tokens half+1..2*half-1 (copyable ones)
    return {"val_loss": sum(losses) / len(losses), "rep_first": nll[:, :half - 1].mean().item(),
            "rep_second": nll[:, half:].mean().item()}


# ----------------------------------------------------------------------------- checkpoints

def _rng_state(batch_gen: torch.Generator) -> dict:
    np_state = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "batch": batch_gen.get_state(),
        "python": random.getstate(),
        # numpy's state holds an ndarray, which weights_only refuses; keep it as a tensor
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
    }


def _set_rng_state(state: dict, batch_gen: torch.Generator) -> None:
    torch.set_rng_state(state["torch"])
    batch_gen.set_state(state["batch"])
    random.setstate(state["python"])
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))


def write_checkpoint(out: Path, model, optimizer, step: int, rank_states: list, recipe: Recipe,
                     loss_sum: tuple[float, int] = (0.0, 0)) -> Path:
    """`OUT/checkpoints/step_XXXXXXXX/`, complete or absent: written under a temporary name, renamed."""
    from .checkpoint import save

    root = out / "checkpoints"
    final = root / f"step_{step:08d}"
    tmp = root / f".step_{step:08d}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    save(model, tmp)
    state = {"step": step, "optimizer": optimizer.state_dict(), "rng": rank_states,
             "recipe": recipe.to_dict(), "loss_sum": list(loss_sum)}
    with open(tmp / "trainer.pt", "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)
    _prune(root, recipe)
    return final


def _prune(root: Path, recipe: Recipe) -> None:
    keep = snapshot_steps(recipe.max_steps) if recipe.snapshots else set()
    steps = sorted(int(d.name[5:]) for d in root.glob("step_*") if d.name[5:].isdigit())
    ordinary = [s for s in steps if s not in keep]
    for s in ordinary[:-KEEP_LAST]:
        shutil.rmtree(root / f"step_{s:08d}", ignore_errors=True)


def read_trainer_state(step_dir: Path) -> dict:
    path = step_dir / "trainer.pt"
    if not path.is_file():
        raise ValueError(f"cannot resume from {step_dir}: it has no trainer.pt (optimizer and RNG state)")
    return torch.load(path, map_location="cpu", weights_only=True)


# ----------------------------------------------------------------------------- the run

def _log_rows(path: Path, upto: Optional[int] = None) -> list[dict]:
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return [r for r in rows if upto is None or int(r["step"]) <= upto]


def _write_log(path: Path, rows: list[dict]) -> None:
    tmp = path.with_suffix(".csv.tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, LOG_COLUMNS)
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, path)


def train(recipe: Recipe, out, data_cache=None, resume: bool = False, progress: bool = True) -> torch.nn.Module:
    """Run a recipe; returns the trained model (in eval mode; also in `out`'s last checkpoint).

    Args:
        recipe: what to train and how.
        out: the run directory (checkpoints/, train_log.csv, recipe.json).
        data_cache: where tokenised corpora are cached; default `out/data`.
        resume: continue from the latest checkpoint in `out` (the recipe must match the saved one).
        progress: show a tqdm bar (rank 0 only).

    Raises:
        NonFiniteLoss: the loss or gradient norm became NaN/inf; the last checkpoint is kept.
        ValueError: a recipe that differs from the run's, or nothing to resume from.
    """
    out = Path(out)
    world, rank = 1, 0
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        if not dist.is_initialized():
            dist.init_process_group("gloo")
        world, rank = dist.get_world_size(), dist.get_rank()
    main_proc = rank == 0
    out.mkdir(parents=True, exist_ok=True)
    cache = Path(data_cache) if data_cache else out / "data"
    if main_proc:  # one process builds the cache, the others wait and read it
        tok, train_data, val_data = prepare_data(recipe, cache)
    if world > 1:
        dist.barrier()
    if not main_proc:
        tok, train_data, val_data = prepare_data(recipe, cache)
    vocab_size = tok.get_vocab_size()
    if recipe.tokenizer == "bpe" and vocab_size != recipe.vocab_size:
        raise ValueError(f"the BPE tokenizer learned only {vocab_size} tokens, fewer than vocab_size "
                         f"{recipe.vocab_size}: the corpus is too small for that vocabulary")
    from .data import check_windows

    for data in (train_data, val_data):  # before any step: a short val split would fail at the first eval
        check_windows(data, recipe.context)

    from .checkpoint import latest_checkpoint, load

    recipe_path, log_path = out / "recipe.json", out / "train_log.csv"
    batch_gen = torch.Generator()
    start = 0
    if resume:
        last = latest_checkpoint(out)
        if last is None:
            raise ValueError(f"--resume: {out} holds no complete checkpoint to resume from")
        saved = Recipe.from_dict(json.loads(recipe_path.read_text()))
        if saved != recipe:
            diff = {f.name: (getattr(saved, f.name), getattr(recipe, f.name)) for f in fields(Recipe)
                    if getattr(saved, f.name) != getattr(recipe, f.name)}
            raise ValueError(f"--resume: the recipe differs from the run's {recipe_path}: "
                             + ", ".join(f"{k}: run has {a!r}, now {b!r}" for k, (a, b) in diff.items()))
        model = load(last)
        state = read_trainer_state(last)
        if len(state["rng"]) != world:
            raise ValueError(f"--resume: the checkpoint was written by {len(state['rng'])} process(es), "
                             f"now there are {world}; resume with the same number")
        start = state["step"]
        optimizer = make_optimizer(model, recipe)
        optimizer.load_state_dict(state["optimizer"])
        _set_rng_state(state["rng"][rank], batch_gen)
        log_rows = _log_rows(log_path, upto=start)
        loss_sum, loss_n = state["loss_sum"]
    else:
        if latest_checkpoint(out) is not None:
            raise ValueError(f"{out} already holds checkpoints: pass --resume to continue, or use a new --out")
        torch.manual_seed(recipe.seed)  # the same init on every rank
        model = build_model(recipe, vocab_size, tok)
        batch_gen.manual_seed(recipe.seed * 1000 + rank + 1)  # different windows on every rank
        optimizer = make_optimizer(model, recipe)
        log_rows, loss_sum, loss_n = [], 0.0, 0
        if main_proc:
            recipe_path.write_text(recipe.to_json())
    model.train()
    net = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model

    def checkpoint(step):
        states = [None] * world
        mine = _rng_state(batch_gen)
        if world > 1:
            dist.all_gather_object(states, mine)
        else:
            states = [mine]
        if main_proc:
            write_checkpoint(out, model, optimizer, step, states, recipe, (loss_sum, loss_n))
        if world > 1:
            dist.barrier()
        return out / "checkpoints" / f"step_{step:08d}"

    snaps = snapshot_steps(recipe.max_steps) if recipe.snapshots else set()
    last_ckpt = latest_checkpoint(out)
    if start == 0 and (0 in snaps):
        last_ckpt = checkpoint(0)
    from tqdm import tqdm

    bar = tqdm(total=recipe.max_steps, initial=start, disable=not (progress and main_proc),
               dynamic_ncols=True, mininterval=2.0)
    tokens_per_step = recipe.batch_size * recipe.context * world
    t0 = time.time()
    for step in range(start, recipe.max_steps):
        lr = lr_at(step, recipe)
        for group in optimizer.param_groups:
            group["lr"] = lr
        x, y, mask = get_train_batch(recipe, train_data, vocab_size, batch_gen, step)
        curriculum = recipe.repeat_fraction > 0 or step < recipe.curriculum_steps
        _, loss = net(x, y, loss_mask=mask if curriculum else None)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
        bad = torch.tensor([0.0 if torch.isfinite(loss) and torch.isfinite(norm) else 1.0])
        if world > 1:
            dist.all_reduce(bad)
        if bad.item():
            bar.close()
            raise NonFiniteLoss(
                f"the loss became {loss.item()} (gradient norm {norm.item()}) at step {step + 1} with lr {lr:.3g}; "
                f"stopped without updating the weights. The last good checkpoint is "
                f"{last_ckpt or 'none (no checkpoint was written yet)'}; try a lower --lr or more --warmup-steps")
        optimizer.step()
        done = step + 1
        last_loss = loss.item()
        loss_sum, loss_n = loss_sum + last_loss, loss_n + 1  # train_loss: the mean since the last eval
        elapsed = time.time() - t0
        bar.set_postfix(loss=f"{last_loss:.3f}", lr=f"{lr:.2e}",
                        tok_s=f"{(done - start) * tokens_per_step / max(elapsed, 1e-9):.0f}", refresh=False)
        bar.update(1)
        if done % recipe.eval_every == 0 or done == recipe.max_steps:
            if main_proc:
                ev = evaluate(model, recipe, val_data, vocab_size)
                mean = loss_sum / loss_n
                log_rows.append({"step": done, "tokens": done * tokens_per_step, "lr": f"{lr:.6g}",
                                 "train_loss": f"{mean:.5f}", **{k: f"{v:.5f}" for k, v in ev.items()},
                                 "elapsed_s": f"{elapsed:.1f}"})
                _write_log(log_path, log_rows)
                bar.write(f"step {done}: train {mean:.3f}  val {ev['val_loss']:.3f}  "
                          f"repeat 1st/2nd half {ev['rep_first']:.2f}/{ev['rep_second']:.2f}")
            loss_sum, loss_n = 0.0, 0
        if done % recipe.ckpt_every == 0 or done == recipe.max_steps or done in snaps:
            last_ckpt = checkpoint(done)
    bar.close()
    if last_ckpt is None:  # max_steps 0
        last_ckpt = checkpoint(recipe.max_steps)
    if world > 1:
        dist.barrier()
    return model.eval()


# ----------------------------------------------------------------------------- CLI

def parse_args(argv=None):
    """`--recipe NAME --out DIR` plus one flag per recipe field; unknown flags are an error."""
    p = argparse.ArgumentParser(prog="sprout train", description=__doc__.split("\n")[0])
    p.add_argument("--recipe", default="gpt-4", choices=sorted(RECIPES), help="starting recipe (default gpt-4)")
    p.add_argument("--out", required=True, help="run directory: checkpoints/, train_log.csv, recipe.json")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    p.add_argument("--data-cache", default=None, help="where tokenised corpora are cached (default OUT/data)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    over = p.add_argument_group("recipe overrides (default: the recipe's value)")
    for f in fields(Recipe):
        flag = "--" + f.name.replace("_", "-")
        if f.type == "bool":
            over.add_argument(flag, dest=f.name, default=None, action=argparse.BooleanOptionalAction)
        else:
            kind = {"int": int, "float": float, "str": str}[f.type]
            over.add_argument(flag, dest=f.name, type=kind, default=None, metavar=f.type.upper())
    args = p.parse_args(argv)
    changes = {f.name: getattr(args, f.name) for f in fields(Recipe) if getattr(args, f.name) is not None}
    try:
        recipe = get_recipe(args.recipe).override(**changes)
    except ValueError as e:
        p.error(str(e))
    return args, recipe


def main(argv=None) -> int:
    from .checkpoint import latest_checkpoint

    args, recipe = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        train(recipe, args.out, data_cache=args.data_cache, resume=args.resume, progress=not args.no_progress)
    except (NonFiniteLoss, ValueError) as e:
        print(f"sprout train: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # a full disk, a read-only folder: the last complete checkpoint is intact
        print(f"sprout train: error: {e}; the last complete checkpoint is {latest_checkpoint(args.out)} "
              "(resume from it with --resume)", file=sys.stderr)
        return 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"done: {latest_checkpoint(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
