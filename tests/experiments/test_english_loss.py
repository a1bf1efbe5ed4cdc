"""experiments.english_loss on a tiny run folder: the texts, and the unigram fitted on the recipe's corpus."""
import pandas as pd
import pytest
import torch

import interp
import sprout
from experiments import english_loss
from sprout import Sprout, SproutConfig
from sprout.material import generate_corpus
from sprout.tokenizer import train_bpe
from sprout.training.recipes import RECIPES


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    recipe = RECIPES["tiny"].override(corpus_chars=30_000, corpus_seed=5)
    tok = train_bpe(generate_corpus(30_000, seed=5) + interp.everyday_english(), vocab_size=300)
    root = tmp_path_factory.mktemp("english") / "run"
    torch.manual_seed(0)
    sprout.save(Sprout(SproutConfig(vocab_size=300, context=32, n_layer=1, n_head=2, d_model=16, d_ff=32),
                       tokenizer=tok), root / "checkpoints" / "step_00000040")
    (root / "recipe.json").write_text(recipe.to_json())
    return root, recipe


def test_a_run_is_measured_on_everyday_english_and_fresh_stories(run_dir):
    root, recipe = run_dir
    table = english_loss.measure(str(root)).set_index("source")
    assert list(table.index) == ["everyday English", "held-out stories"]
    model = sprout.load(root)
    expected = interp.loss_table(model, {"e": interp.everyday_english()}, generate_corpus(30_000, seed=5))
    assert table.loc["everyday English", "unigram"] == pytest.approx(expected.loc[0, "unigram"])
    assert table.loc["everyday English", "loss"] == pytest.approx(expected.loc[0, "loss"])
    # the same from a checkpoint folder (the recipe two levels up)
    again = english_loss.measure(str(root / "checkpoints" / "step_00000040"))
    pd.testing.assert_series_equal(again["loss"], table["loss"].reset_index(drop=True))
