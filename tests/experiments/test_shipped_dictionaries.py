"""experiments.shipped_dictionaries: the docs table is what the shipped cfg.json files record."""
import json
from pathlib import Path

import pytest

from experiments import readme
from experiments import shipped_dictionaries as sd

ROOT = Path(__file__).resolve().parents[2]


def _write(folder: Path, d_sae: int, steps: int, held: dict) -> None:
    folder.mkdir(parents=True)
    cfg = {"d_sae": d_sae, "metadata": {"sprout": {"info": {"steps": steps, "held_out": held}}}}
    (folder / "cfg.json").write_text(json.dumps(cfg))


def _held(l0, ev, margin, best, ce, dead, misses):
    return dict(l0=l0, explained_variance=ev, ev_margin=margin, best_baseline=best, ce_loss_recovered_mean=ce,
                dead_fraction=dead, misses=misses)


def test_one_row_per_dictionary_from_its_record_in_demo_kind_block_order(tmp_path):
    saes = tmp_path / "b-demo" / "saes"
    _write(saes / "transcoder-1-noskip", 64, 100, _held(7.96, 0.5, -0.05, "top_neurons", 0.6, 0.0, ["a", "b"]))
    _write(saes / "transcoder-0", 32, 200, _held(8.0, 0.8, 0.2, "regression", 0.95, 0.01, []))
    _write(saes / "blocks.1.hook_resid_post", 128, 300, _held(9.04, 0.9, 0.1, "pca", 0.97, 0.125, ["dead"]))
    _write(tmp_path / "a-demo" / "saes" / "blocks.0.hook_resid_post", 16, 1, _held(1, 0.1, 0.0, "pca", 0.1, 0, []))
    (saes / "clt").mkdir()
    (saes / "clt" / "cfg.json").write_text("{}")  # the CLT has its own block: not read here
    t = sd.table(tmp_path)
    assert list(zip(t.demo, t.dictionary, t.block)) == [
        ("a-demo", "resid SAE", 0), ("b-demo", "resid SAE", 1), ("b-demo", "transcoder, skip", 0),
        ("b-demo", "transcoder, no skip", 1)]
    last = t.iloc[3]
    assert (last.latents, last.steps, last.L0, last["EV margin (best baseline)"]) == (64, 100, "8.0", "-0.050 (top neurons)")
    assert last.targets == "a; b" and t.iloc[2].targets == "met" and t.iloc[1].dead == "12.5%"
    assert last["CE recovered (mean ablation) ± s.e."] == "0.600"  # recorded before standard errors were
    assert set(t.text) == {"in shares"}  # recipes from before train_mix: the text in its own shares


def test_the_training_texts_mix_is_shown(tmp_path):
    _write(tmp_path / "d" / "saes" / "transcoder-0", 32, 200, _held(8.0, 0.8, 0.2, "regression", 0.95, 0.01, []))
    cfg = json.loads((tmp_path / "d" / "saes" / "transcoder-0" / "cfg.json").read_text())
    cfg["metadata"]["sprout"]["info"]["recipe"] = {"train_mix": "equal"}
    (tmp_path / "d" / "saes" / "transcoder-0" / "cfg.json").write_text(json.dumps(cfg))
    assert sd.table(tmp_path).iloc[0].text == "equal shares"


def test_a_fine_tuned_dictionary_shows_its_kl_steps(tmp_path):
    _write(tmp_path / "d" / "saes" / "transcoder-0", 32, 200, _held(8.0, 0.8, 0.2, "regression", 0.95, 0.01, []))
    _write(tmp_path / "d" / "saes" / "transcoder-1", 32, 200, _held(8.0, 0.8, 0.2, "regression", 0.95, 0.01, []))
    path = tmp_path / "d" / "saes" / "transcoder-1" / "cfg.json"
    cfg = json.loads(path.read_text())
    cfg["metadata"]["sprout"]["info"]["kl_finetune"] = {"steps": 1500}
    path.write_text(json.dumps(cfg))
    assert list(sd.table(tmp_path)["KL fine-tuning"]) == ["none", "1500 steps"]


def test_the_standard_error_is_shown_where_recorded(tmp_path):
    _write(tmp_path / "d" / "saes" / "transcoder-0", 32, 200,
           {**_held(8.0, 0.8, 0.2, "regression", 0.8934, 0.01, ["CE"]), "ce_loss_recovered_mean_se": 0.0317})
    assert sd.table(tmp_path).iloc[0]["CE recovered (mean ablation) ± s.e."] == "0.893 ± 0.032"


def test_a_folder_that_is_not_a_dictionary_is_named():
    assert sd.kind_and_block("transcoder-7-noskip") == ("noskip", 7)
    with pytest.raises(ValueError, match="'transcoder-x'"):
        sd.kind_and_block("transcoder-x")


def test_the_docs_page_shows_what_the_shipped_files_record():
    page = readme.home(sd.BLOCK, ROOT)
    assert readme.block(readme.read(page), sd.BLOCK) == sd.markdown(sd.table())
