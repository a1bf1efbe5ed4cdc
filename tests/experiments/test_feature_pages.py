"""The feature pages a person can read (issue 38, items 5-6): links both ways, definitions on the page,
latents ordered by held-out score, whole-word contexts, whitespace and byte pieces shown, and each
dictionary's interpretability score beside PCA and random directions."""
import re

import pandas as pd
import pytest
import torch

import interp
import sprout
from experiments.common import Models
from experiments.feature_text import token_label, whole_words
from experiments.run_all import run_all
from interp._core.identity import fingerprint, model_config
from sprout import Sprout, SproutConfig
from sprout.material import generate_corpus
from sprout.tokenizer import train_bpe


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    root = tmp_path_factory.mktemp("features")
    tok = train_bpe(generate_corpus(10_000, seed=5), vocab_size=300)
    torch.manual_seed(0)
    sprout.save(Sprout(SproutConfig(vocab_size=300, context=128, n_layer=1, n_head=2, d_model=32, d_ff=64), tok), root / "tiny")
    model = sprout.load(root / "tiny")
    for d, folder in ((interp.SAE(32, 64, kind="topk", k=4, hook_name="blocks.0.hook_resid_post"), "blocks.0.hook_resid_post"),
                      (interp.Transcoder(32, 64, kind="topk", k=4, layer=0), "transcoder-0")):
        d.model_fingerprint, d.model_config = fingerprint(model), model_config(model)
        d.save(root / "tiny" / "saes" / folder)
    out = root / "results"
    run_all(Models({"tiny": model}, {"tiny": root / "tiny"}), out, only=["features"], progress=False,
            options={"features": ["--chars", "2000", "--show", "4", "--score-latents", "6"]})
    return out


def test_pages_link_both_ways_and_define_their_terms(pages):
    index = (pages / "index.html").read_text(encoding="utf-8")
    assert "href='features/tiny.html'" in index
    model_page = (pages / "features" / "tiny.html").read_text(encoding="utf-8")
    assert "href='../index.html'" in model_page and "<b>EV</b>" in model_page and "<b>L0</b>" in model_page
    page = (pages / "features" / "tiny" / "resid-post-0.html").read_text(encoding="utf-8")
    assert "href='../tiny.html'" in page and "<b>CE rec.</b>" in page and "shown below" in page


def test_latents_are_ordered_by_held_out_auroc_and_scores_are_shown(pages):
    page = (pages / "features" / "tiny" / "resid-post-0.html").read_text(encoding="utf-8")
    table = page.split("<th>held-out description</th></tr>")[1].split("</table>")[0]
    aurocs = [float(a) for a in re.findall(r"<tr><td>.*?</td><td class=num>.*?</td><td class=num>.*?</td>"
                                           r"<td class=num>.*?</td><td class=num>([0-9.]+|nan)</td>", table)]
    assert len(aurocs) == 4 and aurocs == sorted(aurocs, reverse=True)
    scores = pd.read_csv(pages / "features" / "tiny_resid-post-0_descriptions.csv")
    assert set(scores.source) == {"dictionary", "pca", "random"}
    model_page = (pages / "features" / "tiny.html").read_text(encoding="utf-8")
    cells = re.findall(r"<td class=num>(\d+%) / (\d+%) / (\d+%)</td>", model_page)
    assert len(cells) == 2


def test_tokens_are_visible_and_contexts_whole_words():
    model = sprout.load("gpt-4")
    space = model.to_single_token(" ")
    assert token_label(model, space, " ") == "·" and token_label(model, 0, "\n\n") == "⏎⏎"
    byte = next(i for i in range(300) if "\ufffd" in model.to_string([i]))
    shown = token_label(model, byte, model.to_string([byte]))
    assert re.fullmatch(r"(\\x[0-9a-f]{2})+", shown), shown
    ex = pd.DataFrame(dict(offset=range(-4, 3), pos=range(10, 17),
                           token_str=["ing", " the", " Zor", "bin", " sat", " do", "wn"]))
    kept = whole_words(ex[::-1]).token_str.tolist()
    assert kept == [" the", " Zor", "bin", " sat"]  # "ing" ends a cut word; " do" "wn" would cut the last one


def test_a_context_never_starts_mid_word_even_at_its_window_start():
    ex = pd.DataFrame(dict(offset=range(-3, 1), pos=range(0, 4), token_str=["ene", " me", " thar", "."]))
    assert whole_words(ex).token_str.tolist() == [" me", " thar", "."]
    alone = pd.DataFrame(dict(offset=[-1, 0], pos=[0, 1], token_str=["ab", "cd"]))
    assert whole_words(alone).token_str.tolist() == ["cd"]  # no word start before the peak: the peak alone


def test_a_run_folder_and_ones_own_text(tmp_path, capsys):
    """`python -m experiments.features --model RUN --text-file FILE`: the latest checkpoint of a `sprout train`
    folder, its dictionary saved in RUN/saes/<hook>/, the page titled by the run's name and its contexts
    read from the file."""
    from experiments import features

    tok = train_bpe(generate_corpus(10_000, seed=5), vocab_size=300)
    torch.manual_seed(0)
    run = tmp_path / "my-run"
    sprout.save(Sprout(SproutConfig(vocab_size=300, context=64, n_layer=1, n_head=2, d_model=32, d_ff=64), tok),
                run / "checkpoints" / "step_00000040")
    model = sprout.load(run)
    sae = interp.SAE(32, 64, kind="topk", k=4, hook_name="blocks.0.hook_resid_post")
    sae.model_fingerprint, sae.model_config = fingerprint(model), model_config(model)
    sae.save(run / "saes" / "blocks.0.hook_resid_post")
    own = tmp_path / "mine.txt"
    own.write_text("The quokka Wibbleton sat by the pond. " * 40, encoding="utf-8")
    out = tmp_path / "out"
    assert features.main(["--model", str(run), "--text-file", str(own), "--out", str(out), "--show", "2",
                          "--score-latents", "4", "--threads", "1"]) == 0
    assert (out / "my-run.html").is_file() and not list(out.glob("step_*"))
    assert "<title>my-run: features" in (out / "my-run.html").read_text(encoding="utf-8")
    page = (out / "my-run" / "resid-post-0.html").read_text(encoding="utf-8")
    assert "Wibbleton" in re.sub(r"<[^>]+>", "", page) or "quokka" in re.sub(r"<[^>]+>", "", page)
    assert features.main(["--model", str(run), "--text-file", str(tmp_path / "none.txt"), "--out", str(out)]) == 2
    assert "--text-file" in capsys.readouterr().err
