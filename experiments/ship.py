"""Rebuild a demo's shipped artifacts from its weights: `python -m experiments.ship gpt-4 [--only saes]`.

What a demo ships beside its weights (sprout/demo/<name>/), each stamped with the weights' fingerprint
so a retrained demo never pairs with stale ones:

- `lens`: the tuned lens (tuned_lens.safetensors + .json), trained as the current ones were: the
  reference recipe of `interp.train_tuned_lens`, 150 steps of 8 windows on the first 400,000
  characters of the demos' training corpus, held-out KL on 60,000 characters of held-out stories;
- `saes`: a TopK sparse autoencoder at every `blocks.{l}.hook_resid_post` (saes/<hook>/) and a TopK
  transcoder for every MLP (saes/transcoder-<l>/), in SAELens' layout, trained on the demos' training
  corpus (`sprout.material.generate_corpus`, seed 0), never the held-out seed; each one's metrics on
  held-out stories (`interp.sae_metrics` on `interp.held_out_stories`) are recorded in its cfg.json
  (metadata.sprout.info.held_out) and must meet TARGETS, or nothing is written.

All SAEs of a model train from one forward per batch, and all its transcoders from another.
Run it quietly: `nice -n 5 python -m experiments.ship gpt-4 --only saes --threads 1`.
"""
from __future__ import annotations

import argparse
import time
from dataclasses import asdict, dataclass

import torch

import interp
import sprout
from interp.cli import positive
from interp.saes.files import shipped_folder
from interp.tuned_lens_train import model_text
from sprout.files import demo_dir

# Held-out targets of the shipped dictionaries (issue 25): (explained variance, CE loss recovered).
TARGETS = {"sae": (0.93, 0.97), "transcoder": (0.90, 0.95)}
MAX_L0, MAX_DEAD = 32, 0.05
MAX_MB = 40  # all shipped dictionaries of all demos together


@dataclass(frozen=True)
class Recipe:
    """How one demo's dictionaries are trained (TopK with AuxK: L0 is k by construction)."""

    expansion: int = 4  # d_sae = expansion x d_model
    k: int = 32  # latents per token
    steps: int = 300  # optimizer steps of the residual SAEs
    transcoder_steps: int = 300  # and of the transcoders
    batch_size: int = 1024  # activations per step
    lr: float = 2e-3  # Adam's peak (a trial on gpt-4's last block: EV 0.956 against 0.944 at the default 8e-4)
    train_chars: int = 1_000_000  # of the demos' training corpus (about 320k tokens: one pass)
    held_out_chars: int = 20_000  # held-out stories the recorded metrics are measured on
    seed: int = 0


RECIPES = {"gpt-4": Recipe(), "sprout-mini": Recipe()}
PARTS = ("resid", "transcoders")
LENS = dict(steps=150, batch_size=8, train_chars=400_000, held_out_chars=60_000, seed=0)


def ship_lens(name: str, model) -> None:
    t0 = time.perf_counter()
    lens = interp.train_tuned_lens(
        model, model_text(LENS["train_chars"]), steps=LENS["steps"], batch_size=LENS["batch_size"], seed=LENS["seed"],
        held_out=interp.held_out_stories(LENS["held_out_chars"]),
        data_name=f"the first {LENS['train_chars']} chars of the demos' training corpus (sprout.material.generate_corpus, "
                  "seed 0); held out: interp.held_out_stories")
    path = lens.save(demo_dir() / name)
    print(f"{name}: tuned lens in {time.perf_counter() - t0:.0f} s -> {path}; held-out KL {lens.info['held_out_kl']}")


def held_out_metrics(model, sae, text: str) -> dict:
    m = interp.sae_metrics(model, sae, text).iloc[0]
    return {k: float(m[k]) for k in ("explained_variance", "fvu", "l0", "dead_fraction", "dense_fraction", "ce_clean",
                                     "ce_spliced", "ce_zero", "ce_loss_recovered", "kl_spliced", "n_tokens")}


def failures(kind: str, held: dict) -> list[str]:
    """What a dictionary's held-out metrics miss of the targets ([] when it meets them all)."""
    ev, ce = TARGETS[kind]
    checks = [(held["explained_variance"] >= ev, f"explained variance {held['explained_variance']:.3f} < {ev}"),
              (held["ce_loss_recovered"] >= ce, f"CE loss recovered {held['ce_loss_recovered']:.3f} < {ce}"),
              (held["l0"] <= MAX_L0, f"L0 {held['l0']:.1f} > {MAX_L0}"),
              (held["dead_fraction"] < MAX_DEAD, f"dead fraction {held['dead_fraction']:.1%} >= {MAX_DEAD:.0%}")]
    return [why for ok, why in checks if not ok]


def train_dictionaries(model, r: Recipe, parts=PARTS) -> dict:
    """{hook or layer: dictionary}: every resid_post SAE (one forward per batch), then every transcoder."""
    n, d = int(model.cfg.n_layers), int(model.cfg.d_model)
    text = model_text(r.train_chars)
    common = dict(kind="topk", d_sae=r.expansion * d, k=r.k, batch_size=r.batch_size, lr=r.lr, seed=r.seed)
    hooks = [f"blocks.{layer}.hook_resid_post" for layer in range(n)]
    saes = interp.train_sae(model, hooks, data=text, steps=r.steps, **common) if "resid" in parts else {}
    tcs = interp.train_transcoder(model, text, list(range(n)), steps=r.transcoder_steps, **common) \
        if "transcoders" in parts else {}
    data = f"the first {r.train_chars} chars of the demos' training corpus (sprout.material.generate_corpus, seed 0)"
    out = {}
    for key, sae in [*((h, s) for h, s in saes.items()), *((layer, t) for layer, t in tcs.items())]:
        sae.info["data"], sae.info["recipe"] = data, asdict(r)
        out[key] = sae
    return out


def ship_saes(name: str, model, r: Recipe, parts=PARTS) -> list:
    t0 = time.perf_counter()
    trained = train_dictionaries(model, r, parts)
    seconds = time.perf_counter() - t0
    held_text = interp.held_out_stories(r.held_out_chars)
    bad, ready = [], []
    for key, sae in trained.items():
        kind = "transcoder" if isinstance(sae, interp.Transcoder) else "sae"
        held = held_out_metrics(model, sae, held_text)
        sae.info["held_out"] = {**held, "data": f"interp.held_out_stories({r.held_out_chars})"}
        sae.info["train_seconds_all"] = seconds
        miss = failures(kind, held)
        print(f"{name} {sae.hook_name}: EV {held['explained_variance']:.3f}, CE recovered {held['ce_loss_recovered']:.3f}, "
              f"L0 {held['l0']:.1f}, dead {held['dead_fraction']:.1%}" + (f"  MISSES: {'; '.join(miss)}" if miss else ""))
        bad += [f"{sae.hook_name}: {m}" for m in miss]
        folder = shipped_folder(demo_dir() / name, **({"layer": key} if kind == "transcoder" else {"hook": key}))
        ready.append((sae, folder))
    if bad:
        raise SystemExit(f"{name}: not shipped, {len(bad)} target(s) missed:\n  " + "\n  ".join(bad))
    written = [sae.save(folder) for sae, folder in ready]
    size = sum(f.stat().st_size for p in demo_dir().glob("*/saes/*") for f in p.iterdir()) / 2**20
    print(f"{name}: {len(written)} dictionaries in {seconds:.0f} s of training -> {demo_dir() / name / 'saes'}; "
          f"all shipped dictionaries {size:.1f} MB")
    if size > MAX_MB:
        raise SystemExit(f"the shipped dictionaries are {size:.1f} MB, over the {MAX_MB} MB budget: lower the expansion")
    return written


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.ship", description=__doc__.splitlines()[0])
    p.add_argument("name", help=f"a shipped demo ({', '.join(RECIPES)} have dictionaries)")
    p.add_argument("--only", nargs="+", choices=["lens", "saes"], default=["lens", "saes"])
    p.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS),
                   help="with saes: the residual SAEs, the transcoders or both (each part is shipped on its own)")
    p.add_argument("--steps", type=positive, default=None, help="override the recipe's SAE and transcoder steps (a trial)")
    p.add_argument("--threads", type=positive, default=None,
                   help="torch CPU threads (default torch's; on a machine shared with other jobs 1 is much faster)")
    args = p.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    model = sprout.load(args.name).eval()
    if "lens" in args.only:
        ship_lens(args.name, model)
    if "saes" in args.only:
        if args.name not in RECIPES:
            raise SystemExit(f"{args.name} has no dictionary recipe; those with one: {', '.join(RECIPES)}")
        r = RECIPES[args.name]
        if args.steps is not None:
            r = Recipe(**{**asdict(r), "steps": args.steps, "transcoder_steps": args.steps})
        ship_saes(args.name, model, r, args.parts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
