"""Training figures that say what they show (issue 41, item 5): stages on one axis of tokens seen, the pure
curriculum marked where the held-out loss rises, round ticks on second axes."""
import shutil

import numpy as np
import pandas as pd
import pytest

import figures
from experiments.training_dynamics import stage_logs
from figures.style import round_axis, round_ticks
from sprout.training.recipes import Recipe
from sprout.training.ship import earlier_stage, ship_stages


@pytest.mark.parametrize("lo, hi, ticks", [
    (4.13, 5.505, [4.0, 4.5, 5.0, 5.5, 6.0]),  # the 4.13, 4.817, 5.505
    (2.08, 9.39, [2.0, 4.0, 6.0, 8.0, 10.0]),
    (-3.42, 0.22, [-4.0, -3.0, -2.0, -1.0, 0.0, 1.0]),
    (0.0, 1.0, [0.0, 0.25, 0.5, 0.75, 1.0]),
    (0.0012, 0.0041, [0.001, 0.002, 0.003, 0.004, 0.005]),
])
def test_round_ticks_cover_the_range_in_round_steps(lo, hi, ticks):
    got = round_ticks(lo, hi)
    assert got == pytest.approx(ticks)
    assert got[0] <= lo and got[-1] >= hi
    steps = np.diff(got)
    assert np.allclose(steps, steps[0])
    mantissa = steps[0] / 10 ** np.floor(np.log10(steps[0]))
    assert any(np.isclose(mantissa, m) for m in (1, 2, 2.5, 5))


def test_round_axis_ranges_to_its_ticks_and_skips_missing_values():
    axis = round_axis([4.3, None, float("nan"), 5.2])
    # a span of 0.9 over 4 steps: 0.225, rounded up to 0.25
    assert axis["tickvals"] == [4.25, 4.5, 4.75, 5.0, 5.25] and axis["range"] == [4.25, 5.25]
    assert axis["ticktext"][:2] == ["4.25", "4.5"]
    with pytest.raises(ValueError, match="finite"):
        round_ticks(0, float("inf"))


def test_second_axes_carry_round_ticks():
    rows = [dict(tokens=t, layer=0, head=0, score=0.1, val_loss=v) for t, v in ((1e5, 5.505), (1e6, 4.817), (1e7, 4.13))]
    fig = figures.induction_over_training(pd.DataFrame(rows))
    assert list(fig.layout.yaxis2.tickvals) == [4.0, 4.5, 5.0, 5.5, 6.0] and list(fig.layout.yaxis2.range) == [4.0, 6.0]
    phase = pd.DataFrame(dict(tokens=[1, 2, 3, 1, 2, 3], measure=["induction score"] * 3 + ["in-context score"] * 3,
                              value=[0.1, 0.5, 0.9, 0.22, -1.4, -3.42]))
    assert list(figures.phase_change(phase).layout.yaxis2.tickvals) == [-4.0, -3.0, -2.0, -1.0, 0.0, 1.0]


def test_loss_curves_mark_each_stage_in_its_models_colour():
    log = pd.DataFrame(dict(step=range(1, 5), tokens=np.arange(1, 5) * 1000, train_loss=[9, 6, 5, 4],
                            val_loss=[9, 15, 5, 4]))
    stages = pd.DataFrame(dict(model=["b"], stage=["pure induction curriculum"], start=[0.0], end=[2000.0]))
    fig = figures.loss_curves(pd.concat([log.assign(model="a"), log.assign(model="b")]), stages=stages)
    band, line = fig.layout.shapes
    assert (band.x0, band.x1, band.fillcolor) == (0, 2000, fig.data[2].line.color)  # model b's colour
    assert line.x0 == line.x1 == 0 and line.line.dash == "dot"
    assert [a.text for a in fig.layout.annotations if a.text.startswith("b:")] == ["b: pure induction curriculum"]
    assert "shaded" in fig.layout.title.text
    assert not figures.loss_curves(log).layout.shapes  # no stages, nothing drawn
    with pytest.raises(ValueError, match="stage"):
        figures.loss_curves(log, stages=stages.drop(columns="end"))


def write_run(folder, recipe: Recipe, steps, per_step):
    folder.mkdir(parents=True)
    (folder / "recipe.json").write_text(recipe.to_json())
    pd.DataFrame(dict(step=steps, tokens=[s * per_step for s in steps], train_loss=1.0, val_loss=2.0)).to_csv(
        folder / "train_log.csv", index=False)


def test_stage_logs_put_every_stage_on_one_axis_of_tokens(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    write_run(first, Recipe(curriculum_steps=2, max_steps=4), [1, 2, 3, 4], 100)
    write_run(second, Recipe(init=str(first), curriculum_steps=0, max_steps=2), [1, 2], 50)
    log, stages = stage_logs("m", second)
    assert log["tokens"].tolist() == [100, 200, 300, 400, 450, 500] and log["stage"].tolist() == [1] * 4 + [2] * 2
    assert stages.to_dict("records") == [
        dict(model="m", stage="stage 1: first", start=0.0, end=400.0),
        dict(model="m", stage="pure induction curriculum (no text trained)", start=0.0, end=200.0),
        dict(model="m", stage="stage 2: second", start=400.0, end=500.0)]
    # the earlier stage's folder gone: the figure says so instead of starting the run at zero silently
    (first / "train_log.csv").unlink()
    log, stages = stage_logs("m", second)
    assert log["tokens"].tolist() == [50, 100]
    assert stages["stage"].tolist() == [f"continues {first} (its log is not here)"]


def test_shipped_stages_keep_the_chain_when_the_runs_are_gone(tmp_path):
    first, second, demo = tmp_path / "runs" / "first", tmp_path / "runs" / "second", tmp_path / "demo"
    write_run(first, Recipe(curriculum_steps=2, max_steps=4), [1, 2, 3, 4], 100)
    write_run(second, Recipe(init="elsewhere/first", curriculum_steps=0, max_steps=2), [1, 2], 50)
    # init written relative to another working directory: found beside the run
    assert earlier_stage(second, "elsewhere/first") == first and earlier_stage(second, "") is None
    demo.mkdir()
    for f in ("recipe.json", "train_log.csv"):
        (demo / f).write_bytes((second / f).read_bytes())
    assert ship_stages(second, demo) == [demo / "stages" / "first"]
    shutil.rmtree(tmp_path / "runs")
    log, stages = stage_logs("m", demo)
    assert log["tokens"].tolist() == [100, 200, 300, 400, 450, 500]
    assert stages["stage"].tolist()[0] == "stage 1: first" and stages["end"].tolist()[-1] == 500.0


def test_stale_stages_go_and_foreign_folders_stay(tmp_path, capsys):
    from sprout.training.ship import drop_stale_stages
    demo = tmp_path / "demo"
    kept, stale, foreign = (demo / "stages" / n for n in ("kept", "stale", "notes"))
    for d in (kept, stale, foreign):
        d.mkdir(parents=True)
        (d / "recipe.json").write_text("{}")
    (stale / "train_log.csv").write_text("step\n")
    (foreign / "mine.txt").write_text("the user's")
    drop_stale_stages(demo, [kept])
    assert kept.is_dir() and not stale.exists() and (foreign / "mine.txt").read_text() == "the user's"
    assert "notes" in capsys.readouterr().err
