"""experiments.common.load_models: loads, and returns what it found (the folders) instead of setting anything."""
import pytest
import torch

from experiments.common import Models, folder_of, held_out_text, load_models, model_dir, model_label, set_threads, text_file
from sprout.files import demo_dir


def test_load_models_sets_nothing_on_torch_or_on_the_models(tmp_path):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        models = load_models(["gpt-1"])
        assert torch.get_num_threads() == 1  # the thread count is the script's main's (--threads), not the loader's
        set_threads(2)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    model = models["gpt-1"]
    assert "spec" not in vars(model)
    assert isinstance(models, Models) and models.folder("gpt-1") == demo_dir() / "gpt-1" == folder_of(models, "gpt-1")
    assert folder_of({"gpt-1": model}, "gpt-1") is None  # a plain dict knows no folders


def test_model_dir_of_a_spec_and_held_out_text_from_the_folder_given(tmp_path):
    (tmp_path / "run").mkdir()
    weights = tmp_path / "run" / "model.safetensors"
    weights.write_bytes(b"")
    assert model_dir(tmp_path / "run") == tmp_path / "run" == model_dir(str(weights))
    assert model_dir("no-such-demo") is None
    (tmp_path / "run" / "val.txt").write_text("held out words " * 10)
    assert held_out_text(None, 20, tmp_path / "run") == ("held out words " * 10)[:20]




def test_a_checkpoint_inside_a_run_is_labelled_by_the_run(tmp_path):
    """RUN/checkpoints/step_N and RUN itself both get the run's name (the page title), a lone folder its own."""
    run = tmp_path / "my-run"
    assert model_label(str(run / "checkpoints" / "step_00000040")) == "my-run"
    assert model_label(str(run / "checkpoints" / "step_00000040" / "model.safetensors")) == "my-run"
    assert model_label(str(run)) == "my-run"
    assert model_label(str(tmp_path / "step_00000040")) == "step_00000040"  # not inside a run's checkpoints/


def test_text_file_reads_utf8_and_names_the_flag_on_bad_files(tmp_path):
    good = tmp_path / "mine.txt"
    good.write_text("Zorbin Plax — naïve text", encoding="utf-8")
    assert text_file(str(good)) == "Zorbin Plax — naïve text" and text_file(None) is None
    (tmp_path / "latin1.txt").write_bytes("naïve".encode("latin-1"))
    (tmp_path / "empty.txt").write_text(" \n")
    for name, why in (("latin1.txt", "not UTF-8"), ("empty.txt", "the file holds no text"), ("missing.txt", "no such file")):
        with pytest.raises(ValueError, match=f"--text-file .*{name}: {why}"):
            text_file(str(tmp_path / name))
