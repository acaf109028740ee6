#!/bin/bash
# The learner's accelerator check in one go (~5 min on an H200): the attention kernels against the einsum
# reference, then the learner's SFT and RL steps at Qwen2.5-0.5B's and 1.5B's shapes beside a transformers
# step. Run from the project's root on the accelerator machine, with .devcheck/whl holding the Python 3.12
# wheels the machine lacks (docs/benchmarks.md, "The learner on an accelerator", says which and how).
# Writes $OUT/attention.json, $OUT/learner.json and $OUT/log.txt, each as soon as its phase ends.
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false TOKENIZERS_PARALLELISM=false
OUT=${OUT:-/tmp/device-learner}; mkdir -p "$OUT"; L=$OUT/log.txt
SITE=$(mktemp -d)
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; python3 --version; git log -1 --oneline; } \
  > "$OUT/env.txt" 2>&1
if compgen -G ".devcheck/whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    .devcheck/whl/*.whl >> "$L" 2>&1
  export PYTHONPATH=$SITE
fi
python3 -c "import jax, flax; print('jax', jax.__version__, 'flax', flax.__version__, jax.devices())" >> "$OUT/env.txt" 2>&1
phase() { local name=$1 limit=$2; shift 2
          timeout "$limit" python3 "$@" --json "$OUT/$name.json" >> "$L" 2>&1
          echo "phase $name rc=$? at $(date +%T)" | tee -a "$L"; }
phase attention 150 tests/benchmarks/bench_attention.py --lengths 1024 3000 16384
phase learner 480 tests/benchmarks/bench_learner.py ${LEARNER_ARGS:-}
grep -v "^\[" "$L" | grep -E "^(learner|xla|blockwise|pallas|splash|NVIDIA)" | cut -c1-200
