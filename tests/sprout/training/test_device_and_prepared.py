"""Training on another device (issue 41): `--device`, and a token cache prepared where the packaged English is
installed, used where it is not (a GPU machine without network)."""
import pytest
import torch

from sprout.files import latest_checkpoint, load
from sprout.training import english
from sprout.training.cli import main
from sprout.training.corpus import data_stamp, prepare_data
from sprout.training.english import MissingSource
from sprout.training.loop import check_device, train
from sprout.training.prepared import prepared_stamp, stamp_for
from sprout.training.recipes import get_recipe

from .test_english import fakes  # noqa: F401  (the fake installed packages)

# the packaged English at character level, small enough for the fake packages' few lines
ENGLISH = get_recipe("tiny").override(data="english", tokenizer="char", story_fraction=0.5, val_fraction=0.2,
                                      context=16, repeat_min=4, repeat_max=8, max_steps=3, eval_every=3,
                                      ckpt_every=3, eval_batches=1, batch_size=4)


@pytest.mark.parametrize("bad", ["gpu", "cuda:x", "tpu", "CPU", ""])
def test_an_unknown_device_is_refused_naming_the_flag(bad):
    with pytest.raises(ValueError, match=r"--device must be 'cpu', 'cuda' or 'cuda:N'"):
        check_device(bad)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_a_gpu_is_refused_before_any_work(tmp_path, capsys):
    with pytest.raises(ValueError, match=r"--device cuda: no such CUDA device here \(0 visible\); train with --device cpu"):
        check_device("cuda")
    with pytest.raises(SystemExit) as e:
        main(["--recipe", "tiny", "--out", str(tmp_path / "run"), "--device", "cuda"])
    assert e.value.code == 2 and "no such CUDA device" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_the_prepared_cache_stands_in_for_missing_packages(fakes, tmp_path, monkeypatch):  # noqa: F811
    cache = tmp_path / "cache"
    built = prepare_data(ENGLISH, cache)  # where the packages are installed
    assert stamp_for(ENGLISH, cache) == data_stamp(ENGLISH) == built.stamp
    for source, (_, folder, version, cmd) in list(english._PACKAGES.items()):  # now they are not
        monkeypatch.setitem(english._PACKAGES, source, ("no-such-dist-for-sprout", folder, version, cmd))
    with pytest.raises(MissingSource):
        data_stamp(ENGLISH)
    assert stamp_for(ENGLISH, cache) == built.stamp  # the files' hashes, as read where they were installed
    model = train(ENGLISH, tmp_path / "run", data_cache=cache, progress=False)
    assert load(latest_checkpoint(tmp_path / "run")).tokenizer.get_vocab() == built.tokenizer.get_vocab()
    assert model.cfg.d_vocab == built.tokenizer.get_vocab_size()


def test_a_cache_for_other_settings_is_not_used(fakes, tmp_path, monkeypatch):  # noqa: F811
    cache = tmp_path / "cache"
    prepare_data(ENGLISH, cache)
    other = ENGLISH.override(story_fraction=0.25)  # another text: another cache
    assert prepared_stamp(other, cache) is None
    for source, (_, folder, version, cmd) in list(english._PACKAGES.items()):
        monkeypatch.setitem(english._PACKAGES, source, ("no-such-dist-for-sprout", folder, version, cmd))
    with pytest.raises(MissingSource, match=r"not installed; .*or prepare the data where the packages are installed "
                                            r"and give that cache folder with --data-cache \(none for this recipe in "):
        stamp_for(other, cache)
    with pytest.raises(MissingSource, match="--data-cache"):
        stamp_for(ENGLISH, tmp_path / "empty")


def test_an_explicit_cpu_device_trains_the_very_weights_of_the_default(tmp_path):
    recipe = get_recipe("tiny").override(max_steps=4, eval_every=4, ckpt_every=4, eval_batches=1, batch_size=4)
    cache = tmp_path / "cache"
    a = train(recipe, tmp_path / "a", data_cache=cache, progress=False)
    b = train(recipe, tmp_path / "b", data_cache=cache, progress=False, device="cpu")
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), name
