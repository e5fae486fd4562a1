#!/usr/bin/env bash
# The GPU checks in one run, for a machine lent briefly: the GPU and the versions, the GPU tests
# with the model's and the step's tests on the GPU, GPT-2 small beside its torch.compile twin
# (benchmarks/gpu_mfu.py), and the README's main job trained there. Each part has its own time
# limit, so a slow or failing part leaves the others their time; each part's log is OUTDIR/PART.log.
#
#   bash benchmarks/gpu_check.sh [OUTDIR] [gpu_mfu --variants NAMES...]
#
# PYTHON picks the interpreter (default python3); the project comes from this checkout
# (PYTHONPATH), so nothing is installed. On an H200 with a 16-core host (2026-12-04) the parts
# took: tests 206 s, gpu_mfu about 100 s, main_job 35 s; three variants did not finish
# compiling in 150 s. A 15-minute loan fits the parts but the variants; name two at most.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu_check}
shift || true
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# Every part: the test processes share the GPU, and gpu_mfu's JAX and torch columns share it
# in one process (JAX would otherwise take 75% of its memory at start).
export XLA_PYTHON_CLIENT_PREALLOCATE=false

part() {  # part NAME SECONDS COMMAND...: run it under a limit, log to $out/NAME.log
    local name=$1 limit=$2 start=$SECONDS
    shift 2
    echo "== $name (limit ${limit} s) $(date -u +%T)"
    timeout "$limit" "$@" 2>&1 | tee "$out/$name.log"
    echo "== $name: exit ${PIPESTATUS[0]} after $((SECONDS - start)) s"
}

# The host CPU too (benchmarks/machine.py: its extensions, AMX included, and peaks): a loan's
# host may be a CPU no development machine has been.
part machine 60 bash -c "nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap \
    --format=csv; $py -c '
import os
from benchmarks import machine
cpu = machine.this_cpu()
print(chr(10).join(machine.describe(cpu, os.cpu_count(), machine.peaks(cpu, os.cpu_count()))))
import importlib.metadata as m
for name in (\"jax\", \"jaxlib\", \"flax\", \"optax\", \"chex\", \"orbax-checkpoint\", \"torch\"):
    print(name, m.version(name))
import jax; print(jax.devices())'"

# The GPU tests, and the everyday tier of the files whose code runs on the device: the model,
# attention kernels, embeddings, sampling, the step and its backend choices.
part tests 240 "$py" -m pytest -q -p no:cacheprovider -p no:benchmark -n auto -m "not slow" \
    -rfEs --tb=short --durations=10 \
    tests/test_gpu.py tests/test_backend.py tests/test_model.py tests/test_attention.py \
    tests/test_embeddings.py tests/test_dense.py tests/test_gqa.py tests/test_documents.py \
    tests/test_sampling.py tests/test_train.py tests/test_objective.py

part gpu_mfu 180 "$py" -m benchmarks.gpu_mfu --rounds 3

part main_job 90 "$py" -m minigpt_jax train --config configs/default.py \
    --workdir "$(mktemp -d)/default"

if [ $# -gt 0 ]; then
    part gpu_mfu_variants 200 "$py" -m benchmarks.gpu_mfu --no-torch --rounds 2 --variants "$@"
fi
