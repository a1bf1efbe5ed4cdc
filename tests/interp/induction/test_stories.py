"""The induction table: the right tokens of each occurrence, probabilities from the model's own output."""
import random

import pytest
import torch
import torch.nn.functional as F

import interp
from sprout import Sprout, SproutConfig
from sprout.material import generate_corpus, generate_story
from sprout.tokenizer import train_bpe

TEXT = "Once there was a fox called Zorbin Plax. The fox slept. Everyone liked Zorbin Plax, and Zorbin Plax ran."


@pytest.fixture(scope="module")
def models():
    tok = train_bpe(generate_corpus(20_000, seed=1), vocab_size=400)
    cfg = SproutConfig(vocab_size=400, context=128, n_layer=1, n_head=2, d_model=32, d_ff=64)
    out = {}
    for seed in (0, 1):
        torch.manual_seed(seed)
        out[f"m{seed}"] = Sprout(cfg, tokenizer=tok).eval()
    return out


def test_table_rows_are_the_names_tokens_with_the_models_probabilities(models):
    df = interp.induction_table(models, TEXT, "Zorbin Plax")
    assert sorted(df.model.unique()) == ["m0", "m1"]
    for (label, occ), rows in df.groupby(["model", "occurrence"]):
        assert "".join(rows.sort_values("token_index").token).strip() == "Zorbin Plax"
        model = models[label]
        ids = torch.tensor(model.tokenizer.encode(TEXT, add_special_tokens=False).ids)[None]
        with torch.no_grad():
            probs = F.softmax(model(ids, return_type="logits")[0].float(), -1)
        for r in rows.itertuples():
            assert r.prob == pytest.approx(probs[r.pos - 1, ids[0, r.pos]].item(), abs=1e-6)
    assert sorted(df.occurrence.unique()) == [1, 2, 3]
    with pytest.raises(ValueError, match="at least twice"):
        interp.induction_table(models, TEXT, "Plaxo")


def test_story_names_known_answer():
    story = ('Once upon a time there lived a baker named Zorbin. Zorbin had a friend called Quaxa Bel. '
             '"Where is Bel?" asked Zorbin. The cat ran. The dog sat. Quaxa laughed.')
    names = interp.induction.story_names(story)
    assert sorted(names) == ["Bel", "Quaxa", "Zorbin"]  # "The" repeats but only opens sentences
    assert [story[a:b] for a, b in names["Zorbin"]] == ["Zorbin"] * 3


def test_stories_aggregate(models):
    df = interp.induction_stories(models, n_stories=2, seed=0)
    assert set(df.columns) == {"model", "token_index", "occurrence", "mean_prob", "median_prob", "n", "n_names"}
    assert set(df.occurrence) == {"first", "later"}
    assert df.mean_prob.between(0, 1).all()
    first = df[(df.model == "m0") & (df.token_index == 0) & (df.occurrence == "first")]
    expected = sum(len(interp.induction.story_names(generate_story(random.Random(f"0-{i}")))) for i in range(2))
    assert first.n.item() == first.n_names.item() <= expected  # one first token per name that fits the context


def test_names_found_when_not_given(models):
    df = interp.induction_table(models["m0"], TEXT)
    assert set(df.name) == {"Zorbin", "Plax"}
    assert df.groupby("name").occurrence.max().to_dict() == {"Plax": 3, "Zorbin": 3}
