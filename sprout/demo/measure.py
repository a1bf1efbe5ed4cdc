"""Measure what the shipped demo models do, with plain torch: `python -m sprout.demo.measure gpt-1 gpt-4`.

For each model:
  held_out_loss   mean loss (nats/token) on fresh stories from the generator (a seed not trained on)
  rep_first/second  on 50 uniformly random tokens followed by the same 50 again: the mean loss on
                  predicting tokens 1..49 (first copy) and 51..99 (second copy, all copyable)
  name_prob       on hand-written stories (sentence frames the generator never produces, names it
                  never drew), the mean probability of the 2nd, 3rd, ... BPE pieces of every later
                  occurrence of a name: only copying from the first occurrence can predict them
  induction       the best head's induction score: attention from each token of the second copy
                  to the token after its match in the first copy (mean over positions)
  ablation        second-copy loss with that head's output (hook_z) zeroed
  prev_token      the best previous-token head (attention to position i-1) in a layer below it
  rms             the residual stream's RMS after the embedding and after every block

The interp package holds the official versions of these analyses; this script keeps the numbers in
the README reproducible from the shipped weights alone.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.nn.functional as F

from sprout.tokenizer import raw

# Frames written by hand for this test (none comes from sprout.synthetic's generator), with names the
# generator cannot draw (checked against the training corpus by `unseen_names`).
STORIES = [
    ("Quorvath and Ellisandre", ["Quorvath", "Ellisandre"],
     "The lighthouse keeper was called Quorvath, and his sister was Ellisandre. Every winter Quorvath "
     "painted the rails while Ellisandre counted the ships. When the storm broke the glass, Ellisandre "
     "shouted for Quorvath, but Quorvath was asleep. In the morning Quorvath apologised to Ellisandre."),
    ("Brimmelwick's shop", ["Brimmelwick", "Tazzoranth"],
     "Nobody in the valley sold better cheese than Brimmelwick. A traveller named Tazzoranth arrived "
     "one evening and asked Brimmelwick for a wheel of the blue one. Brimmelwick laughed, because "
     "Tazzoranth had no money at all. Still, Tazzoranth left with the cheese, and Brimmelwick never "
     "regretted it."),
    ("The engineers", ["Wendrifax", "Plinthgar"],
     "According to the report, Wendrifax designed the pump and Plinthgar built it. The inspectors "
     "praised Plinthgar for the welding; Wendrifax received a medal for the drawings. Years later, "
     "Plinthgar and Wendrifax opened a workshop, and the sign above the door said Wendrifax and "
     "Plinthgar."),
    ("A letter", ["Yusterbell", "Korrigast"],
     "Dear Yusterbell, I am writing from the mountains where Korrigast and I have been climbing. "
     "Korrigast sends his regards and asks whether Yusterbell still keeps bees. If you see our cousin, "
     "tell her that Korrigast broke his boot. With love to Yusterbell from Korrigast and me."),
    ("The match", ["Hobnelwyn", "Dravoquist"],
     "It was the final of the chess tournament: Hobnelwyn against Dravoquist. Hobnelwyn opened with a "
     "pawn, and Dravoquist answered at once. After three hours, Dravoquist offered a draw, which "
     "Hobnelwyn refused. The crowd cheered when Hobnelwyn finally won, and Dravoquist shook hands."),
    ("The recipe", ["Ommentrix", "Saffelgrund"],
     "Grandmother Ommentrix kept her soup recipe in a tin. Her neighbour Saffelgrund wanted it badly. "
     "One Tuesday Saffelgrund knocked, and Ommentrix let him taste the soup. Saffelgrund guessed "
     "every herb but one, so Ommentrix smiled and kept the tin closed while Saffelgrund sighed."),
]

HALF = 50


def unseen_names(text: str) -> list[str]:
    """The STORIES' names that do occur in `text` (should be none)."""
    return [n for _, names, _ in STORIES for n in names if n in text]


@torch.no_grad()
def held_out_loss(model, n_chars: int = 200_000, seed: int = 987_654) -> float:
    from sprout.synthetic import generate_corpus
    from sprout.tokenizer import encode

    ids = torch.tensor(encode(model.tokenizer, generate_corpus(n_chars, seed)))
    T = model.cfg.n_ctx
    n = (len(ids) - 1) // T
    x, y = ids[:n * T].view(n, T), ids[1:n * T + 1].view(n, T)
    losses = [model(x[i:i + 32], y[i:i + 32])[1].item() * len(x[i:i + 32]) for i in range(0, n, 32)]
    return sum(losses) / n


def repeated_tokens(model, n: int = 100, seed: int = 0) -> torch.Tensor:
    from sprout.synthetic import repeated_random_tokens

    low = 1 if model.tokenizer is not None and model.tokenizer.token_to_id("<|endoftext|>") == 0 else 0
    return repeated_random_tokens(n, HALF, model.cfg.d_vocab, torch.Generator().manual_seed(seed), low=low)


def _nll(logits: torch.Tensor, seq: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[:, :-1].transpose(1, 2), seq[:, 1:], reduction="none")  # [batch, pos-1]


@torch.no_grad()
def name_piece_probability(model, stories=STORIES) -> tuple[float, int]:
    """Mean probability of the non-first pieces of every repeated name occurrence; and their count.

    `stories` holds (title, names, text) triples; a name's first occurrence in the text is where it can
    be copied from, and every piece after the first of each later occurrence is scored."""
    probs = []
    for _, names, text in stories:
        enc = raw(model.tokenizer).encode(text, add_special_tokens=False)
        ids = torch.tensor([enc.ids[:model.cfg.n_ctx]])  # a character model sees the first n_ctx only
        p = model(ids, return_type="logits")[0].softmax(-1)  # [pos, vocab]
        for name in names:
            starts = [i for i in range(len(text)) if text.startswith(name, i)]
            for s in starts[1:]:  # the second and later occurrences
                toks = [t for t, (a, b) in enumerate(enc.offsets) if a < s + len(name) and b > s]
                for t in (t for t in toks[1:] if t < ids.size(1)):
                    probs.append(p[t - 1, enc.ids[t]].item())
    return sum(probs) / len(probs), len(probs)


@torch.no_grad()
def head_scores(model, seq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Induction and previous-token scores, each [n_layers, n_heads], on repeated random tokens."""
    _, cache = model.run_with_cache(seq, names_filter=lambda name: name.endswith("hook_pattern"))
    L = model.cfg.n_layers
    pattern = torch.stack([cache[f"blocks.{l}.attn.hook_pattern"] for l in range(L)])  # [L, B, H, q, k]
    q = torch.arange(HALF, 2 * HALF)
    induction = pattern[..., q, q - HALF + 1].mean(dim=(1, 3))
    q = torch.arange(1, 2 * HALF)
    prev = pattern[..., q, q - 1].mean(dim=(1, 3))
    return induction, prev


@torch.no_grad()
def second_half_loss(model, seq: torch.Tensor, ablate=None) -> float:
    hooks = []
    if ablate is not None:
        layer, head = ablate

        def zero_head(z, hook):
            z[:, :, head] = 0.0
            return z

        hooks = [(f"blocks.{layer}.attn.hook_z", zero_head)]
    logits = model.run_with_hooks(seq, fwd_hooks=hooks)
    return _nll(logits, seq)[:, HALF:].mean().item()


@torch.no_grad()
def residual_rms(model, seq: torch.Tensor) -> list[float]:
    names = ["blocks.0.hook_resid_pre"] + [f"blocks.{l}.hook_resid_post" for l in range(model.cfg.n_layers)]
    _, cache = model.run_with_cache(seq, names_filter=lambda n: n in names)
    return [cache[n].pow(2).mean().sqrt().item() for n in names]


def measure(name: str) -> dict:
    import sprout

    model = sprout.load(name)
    seq = repeated_tokens(model)
    with torch.no_grad():
        nll = _nll(model(seq, return_type="logits"), seq)
    induction, prev = head_scores(model, seq)
    layer, head = divmod(int(induction.argmax()), induction.size(1))
    out = {
        "model": name,
        "held_out_loss": held_out_loss(model),
        "rep_first": nll[:, :HALF - 1].mean().item(),
        "rep_second": nll[:, HALF:].mean().item(),
        "induction_head": f"L{layer}H{head}",
        "induction_score": induction[layer, head].item(),
        "ablated_rep_second": second_half_loss(model, seq, ablate=(layer, head)),
        "rms": [round(r, 3) for r in residual_rms(model, seq)],
    }
    if layer > 0:
        pl, ph = divmod(int(prev[:layer].argmax()), prev.size(1))
        out.update(prev_token_head=f"L{pl}H{ph}", prev_token_score=prev[pl, ph].item())
    if model.tokenizer is not None:
        out["name_prob"], out["name_pieces"] = name_piece_probability(model)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="measure the demo models (induction, loss, heads)")
    p.add_argument("models", nargs="+", help="demo names or checkpoint paths")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    results = []
    for m in args.models:
        results.append(measure(m))
        print(json.dumps(results[-1]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
