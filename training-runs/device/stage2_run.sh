#!/usr/bin/env bash
# stage 2 of the GPU demos: the two induction demos from their stage-1 weights
set -euo pipefail
out=$1
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/c2/whl/*.whl
export PYTHONPATH=/tmp/site
python3 -c "import datasets" 2>/dev/null || export PYTHONPATH=$PWD/.gpu/c2/stubs:/tmp/site
mkdir -p /tmp/s2 runs && tar -C /tmp/s2 -xJf .gpu/c2/stage2.tar.xz
for r in gpt-4 sprout-mini; do ln -sfn /tmp/s2/init/$r-english-long runs/$r-english-long; done
ls -la runs/ /tmp/s2/data
pids=()
for r in gpt-4 sprout-mini; do
  (python3 -m sprout.training.cli --recipe $r-english-long-induction --out /tmp/out/$r-english-long-induction \
     --data-cache /tmp/s2/data --device cuda --threads 4 --no-progress 2>&1 | sed -u "s/^/[$r] /") &
  pids+=($!)
done
for p in "${pids[@]}"; do wait $p || echo "a run failed: $p"; done
for r in gpt-4 sprout-mini; do
  d=/tmp/out/$r-english-long-induction
  last=$(ls -d $d/checkpoints/step_* | sort | tail -1)
  mkdir -p /tmp/pack/$r-english-long-induction/checkpoints/$(basename $last)
  cp $d/recipe.json $d/train_log.csv $d/run.json /tmp/pack/$r-english-long-induction/ || true
  cp $last/config.json $last/model.safetensors $last/tokenizer.json /tmp/pack/$r-english-long-induction/checkpoints/$(basename $last)/
  tar -C /tmp/pack -czf $out/$r-induction.tar.gz $r-english-long-induction
  ls -la $out
done
