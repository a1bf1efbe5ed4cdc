"""Imported only by test_training's fork server: one thread, then one tiny training step, so that every
forked `sprout train` starts with torch's kernels already set up (a cold start costs a tiny run ~3x).

With one OpenMP thread torch never starts its thread pool, the pool whose state a forked child
inherits half-made and then waits on forever.
"""
import torch

from sprout.training.cli import parse_args
from sprout.training.curriculum import get_train_batch
from sprout.training.loop import build_model, make_optimizer
from tests.robustness.test_training import ARGS

torch.set_num_threads(1)
_, recipe = parse_args([*ARGS, "--out", "unused"])
model = build_model(recipe, recipe.vocab_size)
optimizer = make_optimizer(model, recipe)
tokens = torch.randint(0, recipe.vocab_size, (recipe.context * recipe.batch_size * 4,)).numpy()
x, y, mask = get_train_batch(recipe, tokens, recipe.vocab_size, torch.Generator().manual_seed(0))
model(x, return_type="loss", targets=y, loss_mask=mask).backward()
torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
optimizer.step()
with torch.no_grad():
    model(x, return_type="loss", targets=y)
    model(torch.randint(0, recipe.vocab_size, (16, recipe.context - 1)))
del model, optimizer
