"""Hooks never outlive the call that added them: not after an exception in a user hook, in the forward
or in a backward pass, not after 1,000 mixed calls; nested `hooks()` contexts remove only their own
level; a cache whose names_filter matches nothing is empty and says so."""
import gc
import random
import warnings

import pytest
import torch

from tests.conftest import TINY

IDS = torch.randint(0, TINY.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))


class HookFailed(RuntimeError):
    pass


def boom(x, hook):
    raise HookFailed(hook.name)


def interrupt(x, hook):
    raise KeyboardInterrupt  # a BaseException, as Ctrl-C inside a hook


def live_hooks(model) -> list[str]:
    """Every hook still attached anywhere: TransformerLens' LensHandle lists on each HookPoint and
    torch's own hook dicts on every module (HookPoints included)."""
    found = []
    for name, hp in model.hook_dict.items():
        found += [f"{name}: LensHandle fwd"] * len(hp.fwd_hooks) + [f"{name}: LensHandle bwd"] * len(hp.bwd_hooks)
    for name, module in model.named_modules():
        for kind in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks"):
            found += [f"{name or 'model'}: torch {kind}"] * len(getattr(module, kind))
    return found


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


# --- the calls: (what it does, the exception it must raise or None) -------------------------------

def good_run_with_hooks(model):
    seen = []
    logits = model.run_with_hooks(IDS, fwd_hooks=[("blocks.1.hook_resid_post", lambda x, hook: seen.append(x.shape))])
    assert logits.shape == (2, 16, TINY.vocab_size) and seen == [(2, 16, TINY.d_model)]


def good_run_with_cache(model):
    _, cache = model.run_with_cache(IDS, names_filter=lambda n: n.endswith("hook_pattern"))
    assert sorted(cache.keys()) == [f"blocks.{l}.attn.hook_pattern" for l in range(TINY.n_layer)]


def good_hooks_context(model):
    seen = []
    with model.hooks(fwd_hooks=[(lambda n: n.endswith("hook_z"), lambda x, hook: seen.append(hook.name))]):
        model(IDS)
    assert seen == [f"blocks.{l}.attn.hook_z" for l in range(TINY.n_layer)]


def bad_user_hook(model):
    model.run_with_hooks(IDS, fwd_hooks=[("hook_embed", lambda x, hook: x), ("blocks.1.attn.hook_pattern", boom)])


def bad_interrupt_in_hook(model):
    model.run_with_hooks(IDS, fwd_hooks=[("blocks.0.mlp.hook_post", interrupt)])


def bad_hook_while_caching(model):
    with model.hooks(fwd_hooks=[("blocks.1.hook_mlp_out", boom)]):
        model.run_with_cache(IDS)


def bad_ids_while_caching(model):
    model.run_with_cache(IDS + TINY.vocab_size)  # the forward refuses them after the hooks are added


def bad_forward_after_hooks_fired(model):
    seen = []
    # an impossible stop_at_layer: refused before any hook fires
    model.run_with_hooks(IDS, fwd_hooks=[("hook_embed", lambda x, hook: seen.append(1))], stop_at_layer=99)


def bad_inside_nested_contexts(model):
    with model.hooks(fwd_hooks=[("blocks.0.hook_resid_pre", lambda x, hook: x)]):
        with model.hooks(fwd_hooks=[("blocks.0.hook_resid_post", boom)]):
            model(IDS)


def bad_backward_hook(model):
    with model.hooks(bwd_hooks=[("blocks.0.hook_resid_mid", boom)]):
        loss = model(IDS, return_type="loss", targets=IDS)
        loss.backward()


def bad_code_in_the_with_body(model):
    with model.hooks(fwd_hooks=[("ln_final.hook_normalized", lambda x, hook: x)]):
        model(IDS)
        raise HookFailed("the user's own code, after the forward")


def bad_hook_name(model):
    model.run_with_hooks(IDS, fwd_hooks=[("blocks.0.hook_resid_pre", lambda x, hook: x),
                                         ("blocks.7.hook_resid_post", lambda x, hook: x)])


CALLS = [(good_run_with_hooks, None), (good_run_with_cache, None), (good_hooks_context, None),
         (bad_user_hook, HookFailed), (bad_interrupt_in_hook, KeyboardInterrupt),
         (bad_hook_while_caching, HookFailed), (bad_ids_while_caching, ValueError),
         (bad_forward_after_hooks_fired, ValueError), (bad_inside_nested_contexts, HookFailed),
         (bad_backward_hook, HookFailed), (bad_code_in_the_with_body, HookFailed), (bad_hook_name, KeyError)]


def call(model, fn, raises):
    if raises is None:
        fn(model)
        return
    with pytest.raises(raises):
        fn(model)


@pytest.mark.parametrize("fn, raises", CALLS, ids=[fn.__name__ for fn, _ in CALLS])
def test_each_kind_of_call_leaves_no_hook(tiny_model, fn, raises):
    call(tiny_model, fn, raises)
    assert live_hooks(tiny_model) == []
    assert tiny_model.context_level == 0 and not tiny_model.is_caching


def test_a_thousand_mixed_calls_leave_no_hook_and_no_growing_memory(tiny_model):
    model, threads = tiny_model, torch.get_num_threads()
    torch.set_num_threads(1)  # a thousand tiny forwards: thread hand-offs would cost more than the maths
    try:
        with torch.no_grad():
            before = model(IDS)
        rng = random.Random(0)
        plan = [rng.choice(CALLS) for _ in range(1000)]
        assert {fn for fn, _ in plan} == {fn for fn, _ in CALLS}
        for fn, raises in plan[:100]:  # warm up: allocator pools, lazily built caches
            call(model, fn, raises)
        objects_before, rss_before = live_objects(model), rss_bytes()
        for i, (fn, raises) in enumerate(plan[100:]):
            call(model, fn, raises)
            if i % 100 == 0:
                assert live_hooks(model) == [], f"hooks left after call {100 + i} ({fn.__name__})"
        objects_growth, rss_growth = live_objects(model) - objects_before, rss_bytes() - rss_before
        assert live_hooks(model) == []
        assert model.context_level == 0 and not model.is_caching
        # One leaked hook leaves a closure, a LensHandle and a torch handle behind; a leaked cache also
        # keeps its activations (~300 KB here). 900 calls that leaked would be far past these bounds.
        assert objects_growth < 200, f"{objects_growth} more Python objects after 900 calls"
        assert rss_growth < 16 * 1024 * 1024, f"RSS grew by {rss_growth} bytes over 900 calls"
        with torch.no_grad():
            assert torch.equal(model(IDS, return_type="logits"), before)  # no edit survived either
    finally:
        torch.set_num_threads(threads)


def live_objects(model) -> int:
    model.zero_grad(set_to_none=True)
    gc.collect()
    return len(gc.get_objects())


# --- nested contexts --------------------------------------------------------------------------------

def test_nested_hooks_contexts_remove_only_their_own_level(tiny_model):
    model, fired = tiny_model, []
    point = model.hook_dict["blocks.0.hook_resid_post"]
    tag = lambda label: (lambda x, hook: fired.append(label))
    model.add_hook("blocks.0.hook_resid_post", tag("outside"))  # added outside any context
    model.add_perma_hook("blocks.0.hook_resid_post", tag("permanent"))

    def run():
        fired.clear()
        model(IDS)
        return sorted(fired)

    with model.hooks(fwd_hooks=[("blocks.0.hook_resid_post", tag("outer"))]):
        with model.hooks(fwd_hooks=[("blocks.0.hook_resid_post", tag("inner"))]):
            assert model.context_level == 2
            assert run() == ["inner", "outer", "outside", "permanent"]
            with pytest.raises(HookFailed):  # an exception two levels down
                with model.hooks(fwd_hooks=[("blocks.0.hook_resid_post", boom)]):
                    model(IDS)
            assert run() == ["inner", "outer", "outside", "permanent"]
        assert run() == ["outer", "outside", "permanent"]
        _, cache = model.run_with_cache(IDS, names_filter="blocks.0.hook_resid_post")  # a level of its own
        assert list(cache.keys()) == ["blocks.0.hook_resid_post"]
        assert run() == ["outer", "outside", "permanent"]
    assert run() == ["outside", "permanent"]
    assert len(point.fwd_hooks) == len(point._forward_hooks) == 2
    model.reset_hooks()
    assert run() == ["permanent"]
    model.reset_hooks(including_permanent=True)
    assert run() == [] and live_hooks(model) == []


# --- names_filter that matches nothing ----------------------------------------------------------------

@pytest.mark.parametrize("names_filter", ["blocks.0.hook_resid_psot", ["blocks.9.hook_resid_post"],
                                          lambda name: name.endswith("hook_nothing")])
def test_a_names_filter_that_matches_nothing_gives_an_empty_cache_and_a_warning(tiny_model, names_filter):
    n = len(tiny_model.hook_dict)
    with pytest.warns(UserWarning, match=f"names_filter.* matched none of the model's {n} hook points, "
                                         "so the cache will be empty") as caught:
        logits, cache = tiny_model.run_with_cache(IDS, names_filter=names_filter)
    if not callable(names_filter):
        assert repr(names_filter) in str(caught[0].message)  # the filter is quoted back
    assert len(cache) == 0 and logits.shape == (2, 16, TINY.vocab_size)
    assert live_hooks(tiny_model) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a filter that matches warns about nothing
        _, cache = tiny_model.run_with_cache(IDS, names_filter="blocks.0.hook_resid_post")
    assert list(cache.keys()) == ["blocks.0.hook_resid_post"]
