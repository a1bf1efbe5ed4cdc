"""Labels made from user-supplied model paths name files inside `--out` only (issue 36, bad case 6:
`--model ..` labelled the model '..' and wrote its pages beside `--out`)."""
import os

import pytest

from experiments.common import model_label


@pytest.mark.parametrize("spec", ["..", ".", "/", "a/..", "../x/..", "../../etc", "x/.hidden", "a b/c$d",
                                  "runs/../model.safetensors", "C:\\\\evil\\\\..", "~"])
def test_a_label_is_one_plain_path_component_inside_out(tmp_path, spec):
    label = model_label(spec)
    assert label and not label.startswith(".") and os.sep not in label and "\\\\" not in label
    for name in (label, f"{label}.html", f"overview_{label}"):
        assert (tmp_path / name).resolve().parent == tmp_path.resolve()


def test_a_label_keeps_the_folder_name_people_recognise(tmp_path):
    assert model_label("gpt-4") == "gpt-4" and model_label("runs/sprout-12/model.safetensors") == "sprout-12"
    work = tmp_path / "my-run"
    work.mkdir()
    assert model_label(str(work / "sub" / "..")) == "my-run"
