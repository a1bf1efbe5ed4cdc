"""One token-input contract (interp._core.inputs.token_batch / token_rows) for every analysis: float ids are
refused with the forward's own words, lists of unequal length are padded and the mask is honoured (the
result does not depend on what sits in the padded slots) or refused naming the padding."""
import inspect
import math

import numpy as np
import pandas as pd
import pytest
import torch

import interp
from interp._core import inputs as _inputs
from interp._core.inputs import TokenBatch, token_batch, token_rows
from sprout import Sprout, SproutConfig
from sprout.material import generate_corpus
from sprout.tokenizer import encode, train_bpe
from tests.conftest import TINY

V = TINY.vocab_size


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return Sprout(TINY).eval()


@pytest.fixture(scope="module")
def text_model():
    tok = train_bpe(generate_corpus(4_000, seed=2), vocab_size=300)
    torch.manual_seed(0)
    return Sprout(SproutConfig(vocab_size=300, context=64, n_layer=2, n_head=2, d_model=32, d_ff=64), tok).eval()


def refusal(model, ids) -> str:
    with pytest.raises(TypeError) as err:
        model(ids)
    return str(err.value)


# --- token_batch itself ---------------------------------------------------------------------------

def test_ids_pass_unchanged_and_unpadded(model):
    ids = torch.randint(0, V, (2, 6), dtype=torch.int32)
    batch = token_batch(model, ids)
    assert isinstance(batch, TokenBatch) and batch.mask is None
    assert batch.ids.dtype == torch.long and torch.equal(batch.ids, ids.long())
    one = token_batch(model, ids[0])
    assert one.ids.shape == (1, 6) and one.unpadded("x").shape == (1, 6)


def test_rows_of_unequal_length_are_padded_with_a_mask(model):
    rows = [torch.tensor([5, 6, 7]), torch.tensor([1, 2, 3, 4, 9])]
    right = token_batch(model, rows)
    assert right.ids.tolist() == [[5, 6, 7, 0, 0], [1, 2, 3, 4, 9]]
    assert right.mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    left = token_batch(model, rows, padding_side="left")
    assert left.ids.tolist() == [[0, 0, 5, 6, 7], [1, 2, 3, 4, 9]]
    assert left.mask.tolist() == [[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]]
    with pytest.raises(ValueError, match=r"patch cannot honour padding: the rows have \[3, 5\] real tokens"):
        right.unpadded("patch")


def test_texts_are_padded_as_the_forward_pads_them(text_model):
    texts = ["Once upon a time", "The cat sat on the mat and then it slept"]
    ids, mask = token_batch(text_model, texts)
    assert torch.equal(ids, text_model.to_tokens(texts))
    assert mask.sum(1).tolist() == [len(encode(text_model.tokenizer, t)) for t in texts]
    assert torch.equal(token_batch(text_model, texts[1]).ids[0], torch.tensor(encode(text_model.tokenizer, texts[1])))
    assert token_batch(text_model, (texts[0], texts[0])).mask is None  # equal lengths: no mask


def test_an_all_ones_mask_is_no_mask_and_a_bad_mask_is_refused(model):
    ids = torch.randint(0, V, (2, 4))
    assert token_batch(model, ids, attention_mask=torch.ones(2, 4, dtype=torch.long)).mask is None
    given = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    assert torch.equal(token_batch(model, ids, attention_mask=given).mask, given)
    with pytest.raises(ValueError, match="attention_mask has shape"):
        token_batch(model, ids, attention_mask=torch.ones(2, 3))


@pytest.mark.parametrize("bad, kind, words", [
    (torch.tensor([[1.7, 2.0]]), TypeError, "token ids must be an integer tensor, got dtype torch.float32"),
    (torch.tensor([[True, False]]), TypeError, "token ids must be an integer tensor, got dtype torch.bool"),
    ([torch.tensor([1.7, 2.0])], TypeError, "token ids must be an integer tensor"),
    ([1, 2, 3], TypeError, "pass token ids as a torch.Tensor"),
    (np.arange(3), TypeError, "expected token ids as a torch.Tensor"),
    (None, TypeError, "expected token ids"),
    ([torch.tensor([1, 2]), "text"], TypeError, "only texts or only 1-D token id tensors"),
    ([], ValueError, "no texts given"),
    (torch.tensor([[1, V]]), ValueError, f"token id {V} is out of range for a vocabulary of {V}"),
    (torch.tensor([[-1, 2]]), ValueError, "token id -1 is out of range"),
    (torch.zeros(1, TINY.context + 1, dtype=torch.long), ValueError, "longer than the model's context"),
    (torch.zeros(1, 0, dtype=torch.long), ValueError, "empty"),
])
def test_bad_input_is_refused_as_the_forward_refuses_it(model, bad, kind, words):
    with pytest.raises(kind, match=words):
        token_batch(model, bad)
    if isinstance(bad, torch.Tensor) and kind is TypeError:
        with pytest.raises(TypeError) as err:
            token_batch(model, bad)
        assert str(err.value) == refusal(model, bad)


def test_token_rows_cut_long_rows_into_windows_and_check_every_window(model):
    rows = token_rows(model, torch.arange(150)[None] % V, seq_len=64)
    assert [len(r) for r in rows] == [64, 64, 22]
    assert torch.equal(torch.cat(rows), torch.arange(150) % V)
    assert [len(r) for r in token_rows(model, [torch.arange(3), torch.arange(5)])] == [3, 5]  # never padded
    with pytest.raises(ValueError, match=f"token id {V + 3} is out of range"):
        token_rows(model, torch.arange(V + 4)[None], seq_len=64)  # caught in the last window, before any forward
    for bad in (0, 65, 2.0, True):
        with pytest.raises(ValueError, match="seq_len must be an integer in 1..64"):
            token_rows(model, torch.arange(10), seq_len=bad)


# --- every public analysis that reads text or ids -------------------------------------------------

# the parameter names under which an analysis takes text or ids (its first parameter is the model)
TEXT_PARAMS = {"text_or_tokens", "data", "tokens", "clean", "corrupted", "held_out", "input", "text", "texts",
               "prompts", "batch", "dataset"}


def nan_safe(logits):
    """A metric that reads real positions only (padded ones are NaN)."""
    return logits[..., 3].nanmean() - logits[..., 7].nanmean()


def corrupt(x):
    if isinstance(x, list):
        return [(r + 1) % V if not r.is_floating_point() else r + 1 for r in x]
    return x + 1 if x.is_floating_point() or x.dtype == torch.bool else (x + 1) % V


# how to call each analysis with `x` where its text or ids go; anything else detected is called as f(model, x)
CALLS = {
    "ablate_heads": lambda m, x: interp.ablate_heads(m, [(0, 0)], x),
    "attribution_patch": lambda m, x: interp.attribution_patch(m, x, corrupt(x), nan_safe, site="z", by="head"),
    "patch": lambda m, x: interp.patch(m, x, corrupt(x), nan_safe, site="z", by="head"),
    "path_patch": lambda m, x: interp.path_patch(m, x, corrupt(x), nan_safe, ["L0H0", "L0H1"], ["L1H0"]),
    "joint_path_patch": lambda m, x: interp.patching.joint_path_patch(m, x, corrupt(x), nan_safe, [["L0H0"], ["L0H0", "L0H1"]], "L1H0"),
    "greedy_feeders": lambda m, x: interp.patching.greedy_feeders(m, x, corrupt(x), nan_safe, "L1H0"),
    "head_score_tensor": lambda m, x: interp.heads.head_score_tensor(m, "previous_token", x),
    "edge_scores": lambda m, x: interp.edge_scores(m, x, corrupt(x), nan_safe, method="eap"),
    "discover": lambda m, x: interp.discover(m, x, corrupt(x), nan_safe, method="eap", budget=0.1).edges,
    "faithfulness_curve": lambda m, x: interp.faithfulness_curve(m, x, corrupt(x), nan_safe, fractions=(0.5, 1.0),
                                                                 baselines=("random",)),
    "head_scores": lambda m, x: interp.head_scores(m, "previous_token", x),
    "induction_circuit": lambda m, x: interp.induction_circuit(m, data=(x, corrupt(x)), stories=False, min_score=0.0),
    "induction_table": lambda m, x: interp.induction_table(m, x),
    "lens_comparison": lambda m, x: interp.lens_comparison(m, x, interp.TunedLens(m)),
    "tuned_lens": lambda m, x: interp.tuned_lens(m, x, interp.TunedLens(m)),
    "stream_windows": lambda m, x: interp.data.stream_windows(m, x, seq_len=4),
    "train_tuned_lens": lambda m, x: interp.train_tuned_lens(m, x, steps=1, batch_size=1, seq_len=4, progress=False),
    "loss_table": lambda m, x: interp.loss_table(m, {"x": x}, torch.arange(V)),
    "sae_metrics": lambda m, x: interp.sae_metrics(m, resid_sae(m), x),
    "dead_fractions": lambda m, x: interp.saes.dead_fractions(m, [resid_sae(m)], x, seq_len=4),
    "run_with_saes": lambda m, x: real_logits(m, x, interp.run_with_saes(m, x, [resid_sae(m)])[0]),
    "train_sae": lambda m, x: interp.train_sae(m, "blocks.0.hook_resid_post", data=x, d_sae=8, k=2, steps=1,
                                               batch_size=4, seq_len=4, progress=False),
    "train_transcoder": lambda m, x: interp.train_transcoder(m, x, 0, d_sae=8, k=2, steps=1, batch_size=4,
                                                             seq_len=4, progress=False),
    "finetune_kl": lambda m, x: interp.finetune_kl(
        m, interp.SAE(int(m.cfg.d_model), 8, kind="topk", k=2, hook_name="blocks.0.hook_resid_post"), x, steps=1,
        batch_windows=2, seq_len=4, progress=False),
    "clt_metrics": lambda m, x: interp.saes.clt_metrics(m, tiny_clt(m), x, seq_len=4),
    "clt_dead_fractions": lambda m, x: interp.saes.clt_dead_fractions(m, tiny_clt(m), x, seq_len=4),
    "train_clt": lambda m, x: interp.train_clt(m, x, d_sae=8, k=2, steps=1, batch_size=4, seq_len=4, progress=False),
}
ALSO_WALKED = ["train_sae"]  # its first parameter is `source` (a model or activations), so the walk does not see it


def real_logits(model, x, logits):
    """The logits at real positions only (what a padded slot's logits are is nobody's business)."""
    mask = token_batch(model, x).mask
    return logits if mask is None else logits[mask.bool()]


def tiny_clt(model):
    return interp.CrossLayerTranscoder(TINY.n_layer, TINY.d_model, 8, kind="batchtopk", k=2, seed=0)


def resid_sae(model):
    return interp.SAE(TINY.d_model, 8, kind="topk", k=2, hook_name="blocks.0.hook_resid_post", seed=0)
TEXT_ONLY = {"induction_table"}  # reads characters: ids are refused, but not with the forward's words


ROOMS = (interp, interp.data, interp.heads, interp.induction, interp.lens, interp.measures, interp.patching, interp.saes)


def public_functions() -> dict:
    """Every public name of interp's top and of each room (a room's `__all__` is its whole API)."""
    return {name: getattr(room, name) for room in ROOMS for name in room.__all__}


def text_readers():
    out = []
    for name, fn in public_functions().items():
        if not callable(fn) or inspect.isclass(fn):
            continue
        params = list(inspect.signature(fn).parameters)
        if params and params[0] in ("model", "models") and TEXT_PARAMS & set(params):
            out.append(name)
    return out + ALSO_WALKED


def call(name, model, x):
    if name in CALLS:
        return CALLS[name](model, x)
    fn = public_functions()[name]
    params = inspect.signature(fn).parameters
    text = next(p for p in params if p in TEXT_PARAMS)
    required = [p for p, v in list(params.items())[1:] if v.default is inspect.Parameter.empty and p != text
                and v.kind not in (v.VAR_POSITIONAL, v.VAR_KEYWORD)]
    assert not required, f"interp.{name} needs {required}: add it to CALLS in {__file__}"
    return fn(model, **{text: x})


def test_the_walk_finds_the_known_readers():
    found = set(text_readers())
    assert {"patch", "attribution_patch", "path_patch", "logit_attribution", "induction_circuit", "phase_measures",
            "logit_lens", "lens_dataset_summary", "tuned_lens", "lens_comparison", "train_tuned_lens",
            "head_scores", "ablate_heads", "mean_loss", "residual_rms", "attention_patterns", "pattern_tensor",
            "icl_score", "positional_qk_scores"} <= found


@pytest.mark.parametrize("name", text_readers())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bool])
def test_every_reader_refuses_float_ids_with_the_forwards_words(model, name, dtype):
    ids = (torch.rand(2, 8, generator=torch.Generator().manual_seed(0)) * 5 + 1.7).to(dtype)  # 1.7 is not token 1
    with pytest.raises(TypeError) as err:
        call(name, model, ids)
    if name not in TEXT_ONLY:
        assert str(err.value) == refusal(model, ids)


def same(a, b) -> None:
    if isinstance(a, pd.DataFrame):
        pd.testing.assert_frame_equal(a, b, check_exact=False, rtol=0, atol=1e-5)
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            same(x, y)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            same(a[k], b[k])
    elif isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    elif isinstance(a, torch.nn.Module):
        same(a.state_dict(), b.state_dict())
    elif isinstance(a, float):
        assert a == pytest.approx(b, abs=1e-6) or (math.isnan(a) and math.isnan(b))
    else:
        assert a == b


@pytest.mark.parametrize("name", sorted(set(text_readers()) - TEXT_ONLY))
def test_every_reader_honours_the_mask_of_unequal_rows_or_refuses_them(model, name, monkeypatch):
    g = torch.Generator().manual_seed(1)
    rows = [torch.randint(1, V, (n,), generator=g) for n in (5, 9)]
    try:  # an analysis that cannot run on these rows even when they are of equal length refuses them anyway
        call(name, model, [r[:5] for r in rows])
        unrelated = None
    except ValueError as e:
        unrelated = str(e)
    results = []
    # left padding: real tokens come after the padded slots (with right padding a causal model never sees them)
    monkeypatch.setattr(_inputs, "_padding_side", lambda model: "left")
    for pad in (0, 17):  # what sits in the padded slots must not matter
        monkeypatch.setattr(_inputs, "_pad_id", lambda model, pad=pad: pad)
        try:
            torch.manual_seed(0)
            results.append(call(name, model, rows))
        except ValueError as e:
            # refused, saying why: it cannot honour padding, or it reads one sequence only
            clear = "padding" in str(e) or "one sequence" in str(e) or str(e) == unrelated
            assert clear, f"interp.{name} refused unequal rows unclearly: {e}"
            return
    same(*results)


def test_a_text_model_takes_texts_of_unequal_length(text_model):
    texts = ["Once upon a time there was a fox.", "The cat sat."]
    frame = interp.logit_attribution(text_model, texts)
    lengths = [len(encode(text_model.tokenizer, t)) for t in texts]
    per_seq = frame[frame.component == "embed"].groupby("seq").size().tolist()
    assert per_seq == [n - 1 for n in lengths]  # every real token that has a real next token, no padding


@pytest.mark.parametrize("side", ["right", "left"])
def test_logit_attribution_of_a_padded_row_equals_the_row_alone(model, side, monkeypatch):
    monkeypatch.setattr(_inputs, "_padding_side", lambda model: side)
    g = torch.Generator().manual_seed(2)
    rows = [torch.randint(1, V, (n,), generator=g) for n in (4, 7)]
    frame = interp.logit_attribution(model, rows)  # the first row is padded to 7
    for i, row in enumerate(rows):
        alone = interp.logit_attribution(model, row[None])
        mine = frame[frame.seq == i].reset_index(drop=True)
        assert len(mine) == len(alone) == (len(row) - 1) * (1 + TINY.n_layer * (TINY.n_head + 1))
        np.testing.assert_allclose(mine.attribution.to_numpy(), alone.attribution.to_numpy(), atol=1e-4)
        assert mine.pos.tolist() == alone.pos.tolist() and mine.target.tolist() == alone.target.tolist()
        assert mine.component.tolist() == alone.component.tolist()


@pytest.mark.parametrize("side", ["right", "left"])
def test_patching_a_padded_batch_is_the_mean_of_patching_each_row_alone(model, side, monkeypatch):
    monkeypatch.setattr(_inputs, "_padding_side", lambda model: side)
    g = torch.Generator().manual_seed(3)
    rows = [torch.randint(1, V, (n,), generator=g) for n in (5, 8)]
    bad = [r.clone() for r in rows]
    for r in bad:
        r[1] = (r[1] + 7) % V
    lengths = torch.tensor([len(r) for r in rows])

    last = lengths - 1 if side == "right" else torch.full((2,), int(lengths.max()) - 1)

    def last_real(logits):  # each row's logit 3 at its own last real token
        return logits[torch.arange(2), last, 3]

    joint = interp.patch(model, rows, bad, last_real, site="resid_pre", by="layer")
    alone = []
    for i in range(2):
        n = int(lengths[i])
        alone.append(interp.patch(model, rows[i][None], bad[i][None],
                                  lambda logits, n=n: logits[:, n - 1, 3], site="resid_pre", by="layer"))
    expected = (alone[0]["metric"].to_numpy() + alone[1]["metric"].to_numpy()) / 2
    np.testing.assert_allclose(joint["metric"].to_numpy(), expected, atol=1e-4)
    assert joint["corrupted"].iloc[0] == pytest.approx((alone[0]["corrupted"].iloc[0] + alone[1]["corrupted"].iloc[0]) / 2, abs=1e-4)


def test_a_metric_that_reads_padded_positions_is_refused(model):
    rows = [torch.tensor([3, 4, 5]), torch.tensor([3, 4, 5, 6, 7])]
    bad = [torch.tensor([3, 9, 5]), torch.tensor([3, 9, 5, 6, 7])]
    for analysis in (interp.patch, interp.attribution_patch):
        with pytest.raises(ValueError, match="reads logits at padded positions"):
            analysis(model, rows, bad, lambda logits: logits[:, -1, 3].mean(), site="z", by="head")
    with pytest.raises(ValueError, match="reads logits at padded positions"):
        interp.path_patch(model, rows, bad, lambda logits: logits[:, -1, 3].mean(), ["L0H0"], ["L1H0"])
    with pytest.raises(ValueError, match="padded differently"):
        interp.patch(model, rows, [bad[1][:4], bad[1]], nan_safe, site="z", by="head")


def test_the_in_context_score_reads_129_ids_of_each_row_of_any_length():
    torch.manual_seed(0)
    m = Sprout(SproutConfig(vocab_size=64, context=128, n_layer=1, n_head=2, d_model=32, d_ff=64)).eval()
    ids = torch.randint(0, 64, (2, 129), generator=torch.Generator().manual_seed(0))
    expected = interp.icl_score(m, ids)  # 129 ids on a 128-token context: the last one is only a target
    assert interp.icl_score(m, [ids[0], torch.cat([ids[1], ids[1][:7]])]) == expected  # cut, never padded
    assert interp.phase_measures(m, ids)["in-context score (late - early loss)"] == expected
    with pytest.raises(ValueError, match=r"needs ids \[batch, >= 129\], got a row of 100 tokens"):
        interp.icl_score(m, [ids[0], ids[1][:100]])
    late = ids.clone()
    late[1, 128] = 64  # a target outside the vocabulary
    with pytest.raises(ValueError, match="token id 64 is out of range for a vocabulary of 64"):
        interp.icl_score(m, late)
