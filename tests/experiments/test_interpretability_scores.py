"""experiments.interpretability_scores: one row per shipped per-layer dictionary, each the share of
described units with held-out AUROC >= 0.8 per source, and "beats both" only by more than two standard
errors over each baseline."""
import pandas as pd
import pytest

import sprout
from experiments import interpretability_scores as scores
from interp.saes.shipped import CLT
from sprout.files import demo_dir


def fake_score(aurocs: dict):
    """An interpretability_score stand-in: `aurocs[source]` is that source's list of held-out AUROCs."""
    def score(model, sae, train, test, n):
        rows = [dict(source=s, index=i, auroc=a, fuzz=0.5, precision=0.0, recall=0.0)
                for s, values in aurocs.items() for i, a in enumerate(values)]
        return pd.DataFrame(rows)
    return score


@pytest.mark.parametrize("aurocs, share, beats", [
    # 100% of 4 against 0% and 25%: 1 - 0.25 > 2 x sqrt(0.1875 / 4) = 0.43
    ({"dictionary": [0.9, 0.85, 0.8, 0.95], "pca": [0.81, 0.5, 0.5, 0.5], "random": [0.5] * 4}, ("100%", "25%", "0%"), "yes"),
    # 75% against 25%: 0.5 < 2 x sqrt(2 x 0.1875 / 4) = 0.61, a win too small for 4 each
    ({"dictionary": [0.9, 0.85, 0.8, 0.6], "pca": [0.81, 0.5, 0.5, 0.5], "random": [0.5] * 4}, ("75%", "25%", "0%"), "no"),
    ({"dictionary": [0.9, 0.5, 0.5, 0.5], "pca": [0.5] * 4, "random": [0.8, 0.5, 0.5, 0.5]}, ("25%", "0%", "25%"), "no"),
])
def test_each_row_is_the_share_at_auroc_0_8_and_beats_only_by_two_standard_errors(monkeypatch, aurocs, share, beats):
    monkeypatch.setattr(scores, "interpretability_score", fake_score(aurocs))
    frame = pd.DataFrame(scores.demo_rows("gpt-4", 4, 1000, "test"))
    shipped = sorted(p.name for p in (demo_dir() / "gpt-4" / "saes").glob("*/") if p.name != CLT)
    assert len(frame) == len(shipped)  # every per-layer dictionary, the cross-layer transcoder left out
    assert set(frame.dictionary) == {"resid SAE", "transcoder, skip", "transcoder, no skip"}
    assert (frame[["score: dictionary", "score: pca", "score: random"]].apply(tuple, axis=1) == share).all()
    assert (frame["beats both (2 s.e.)"] == beats).all() and (frame.described == "4 / 4 / 4").all()


def test_the_shipped_dictionaries_are_scored_for_real():
    frame = scores.table(n=3, chars=2_000, demos=["gpt-4"])
    n_layers = int(sprout.load("gpt-4").cfg.n_layers)
    assert len(frame) == 3 * n_layers and sorted(set(frame.block)) == list(range(n_layers))
    for col in ("score: dictionary", "score: pca", "score: random"):
        assert frame[col].str.rstrip("%").astype(int).between(0, 100).all()
    assert (frame.described == "3 / 3 / 3").all()


def test_a_block_rewrite_for_some_demos_only_is_refused(tmp_path):
    with pytest.raises(SystemExit):
        scores.main(["--readme", str(tmp_path / "x.md"), "--demo", "gpt-4"])
