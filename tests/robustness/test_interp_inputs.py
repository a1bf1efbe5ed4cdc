"""interp takes integer token ids, integer layers and heads, quantile levels in [0, 1], with the model's
own rule and message; NaN weights give NaN statistics throughout; run_all writes only into a folder it
made and says in one line what is wrong."""
import math

import numpy as np
import pandas as pd
import pytest
import torch

import interp
from experiments import run_all
from sprout import Sprout
from tests.conftest import TINY


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return Sprout(TINY).eval()


def model_refusal(model, ids) -> str:
    with pytest.raises(TypeError) as err:
        model(ids)
    return str(err.value)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.bool])
@pytest.mark.parametrize("call", [
    lambda m, t: interp.residual_rms(m, t),
    lambda m, t: interp.logit_lens(m, t),
    lambda m, t: interp.attention_patterns(m, t),
    lambda m, t: interp.ablate_heads(m, [(0, 0)], t),
    lambda m, t: interp.residual_rms(m, [t[0]]),  # a list of id tensors
], ids=["residual_rms", "logit_lens", "attention_patterns", "ablate_heads", "list"])
def test_non_integer_token_tensors_are_a_type_error_as_in_forward(model, dtype, call):
    ids = (torch.rand(2, 8) * 5 + 1.7).to(dtype)  # 1.7 must not quietly become token 1
    with pytest.raises(TypeError) as err:
        call(model, ids)
    assert str(err.value) == model_refusal(model, ids)  # one rule, one message
    assert str(err.value).startswith(f"token ids must be an integer tensor, got dtype {dtype}")


def test_integer_ids_of_any_width_still_work(model):
    ids = torch.randint(0, TINY.vocab_size, (2, 8))
    expected = interp.residual_rms(model, ids)
    pd.testing.assert_frame_equal(interp.residual_rms(model, ids.to(torch.int32)), expected)


@pytest.mark.parametrize("heads, what", [([(0, 0.7)], "head must be an integer, got 0.7"),
                                         ([(True, 0)], "layer must be an integer, got True"),
                                         ([(0, np.float64(1.0))], "head must be an integer"),
                                         ([(0, torch.tensor(True))], "head must be an integer"),
                                         ([(0,)], r"each head is a \(layer, head\) pair"),
                                         (pd.DataFrame(dict(layer=[0.5], head=[1])), "layer must be an integer")])
def test_ablate_heads_refuses_non_integer_layers_and_heads(model, heads, what):
    with pytest.raises(TypeError, match=what):
        interp.ablate_heads(model, heads, half_len=4, n_seqs=2)


def test_ablate_heads_accepts_numpy_integers_as_the_same_heads(model):
    plain = interp.ablate_heads(model, [(1, 2)], half_len=4, n_seqs=2)
    numpy = interp.ablate_heads(model, [(np.int64(1), np.int32(2))], half_len=4, n_seqs=2)
    pd.testing.assert_frame_equal(plain, numpy)


@pytest.mark.parametrize("quantiles", [(0.05, 0.5, 1.5), (-0.1, 0.5, 0.9), (float("nan"), 0.5, 0.9),
                                       (0.05, "0.5", 0.95), (True, 0.5, 0.9), "abc"])
def test_residual_rms_quantiles_outside_0_1_are_refused(model, quantiles):
    with pytest.raises(ValueError, match="quantiles must be"):
        interp.residual_rms(model, torch.randint(0, TINY.vocab_size, (2, 8)), quantiles=quantiles)


def test_nan_weights_give_nan_quantiles_beside_a_nan_mean():
    torch.manual_seed(0)
    model = Sprout(TINY).eval()
    with torch.no_grad():
        model.blocks[1].ffn.w2.weight[0, 0] = float("nan")
    df = interp.residual_rms(model, torch.randint(0, TINY.vocab_size, (2, 16))).set_index("site")
    for site, row in df.iterrows():
        stats = [row["mean"], row.q05, row.q50, row.q95]
        assert all(math.isnan(v) for v in stats) or all(math.isfinite(v) for v in stats), (site, stats)
    assert math.isnan(df.loc["blocks.1.hook_resid_post", "q05"])
    assert math.isfinite(df.loc["blocks.0.hook_resid_post", "q05"])


def test_log_histogram_quantiles_match_torch_and_ignore_nothing():
    values = torch.rand(10_000).double() * 10 + 0.01
    h = interp.measures.LogHistogram()
    h.add(values)
    for q in (0.0, 0.05, 0.5, 0.95, 1.0):
        assert h.quantile(q) == pytest.approx(torch.quantile(values, q).item(), rel=0.006)
    h.add(torch.tensor([float("inf")]))  # counted in the top bin, not as garbage
    assert h.n == 10_001 and h.counts[-1] == 1 and math.isfinite(h.quantile(0.5))
    h.add(torch.tensor([float("nan")]))
    assert math.isnan(h.quantile(0.5))


# --- run_all --out and model names ----------------------------------------------------------------

def test_run_all_refuses_out_that_is_a_file(tmp_path, capsys):
    (tmp_path / "results").write_text("my notes")
    assert run_all.main(["--models", "gpt-4", "--out", str(tmp_path / "results")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("run_all: --out ") and "is a file" in err and "Traceback" not in err
    assert (tmp_path / "results").read_text() == "my notes"


def test_run_all_refuses_a_folder_it_did_not_write(tmp_path, model):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "index.html").write_text("my own page")
    with pytest.raises(FileExistsError, match=r"not empty and was not written by run_all .*index\.html"):
        run_all.run_all({"tiny": model}, out, only=["param_counts"], progress=False)
    assert [p.name for p in out.iterdir()] == ["index.html"]
    assert (out / "index.html").read_text() == "my own page"


def test_run_all_writes_again_into_its_own_folder(tmp_path, model):
    out = tmp_path / "results"
    run_all.run_all({"tiny": model}, out, only=["param_counts"], progress=False)
    (out / "my_notes.txt").write_text("kept")
    run_all.run_all({"tiny": model}, out, only=["param_counts"], progress=False)
    assert (out / run_all.MARKER).is_file() and (out / "index.html").is_file()
    assert (out / "my_notes.txt").read_text() == "kept"


def test_run_all_names_an_unknown_model_in_one_line(tmp_path, capsys):
    assert run_all.main(["--models", "gpt-5", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "'gpt-5'" in err and "demo models:" in err
    assert not (tmp_path / "r").exists()  # nothing made before the models loaded
