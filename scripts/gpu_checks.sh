#!/bin/bash
# The checks that need a CUDA GPU, as one run: environment facts, the test
# files whose GPU tests skip on a CPU machine, and the training benchmark on
# CUDA. Usage: OUT=<dir> bash scripts/gpu_checks.sh
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_checks}; mkdir -p "$OUT"
nvidia-smi -L
python3 - <<'PY' 2>&1 | tee "$OUT/env.log"
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())
print("capability", torch.cuda.get_device_capability(), torch.cuda.get_device_name())
get = getattr(torch._C, "_get_sdp_priority_order", None)
print("sdp priority", list(get()) if get else None)
import thunderlite, thunderlite.executors  # noqa: F401
print("thunderlite imports")
PY
timeout ${TEST_S:-220} python3 -m pytest -q -rs -n 8 -p no:cacheprovider \
  thunderlite/tests/test_grad_kernels.py thunderlite/tests/test_prims.py thunderlite/tests/test_symm_mem.py \
  thunderlite/tests/test_fusion_executors.py thunderlite/tests/test_triton.py thunderlite/tests/test_dynamic_shapes.py \
  --junitxml="$OUT/junit.xml" 2>&1 | tee "$OUT/tests.log" | tail -n 60
for dtype in ${BENCH_DTYPES-float32 bfloat16}; do     # BENCH_DTYPES= (empty): no benchmark
  timeout ${BENCH_S:-170} python3 benchmarks/bench_training.py --steps 12 --dtype $dtype \
    ${BENCH_ARGS:---dim 512 --layers 4 --seq 256 --batch 8} 2>&1 | tee "$OUT/bench_$dtype.log"
done
# layers grouped into regions (the default, executors/cost.py) against one region per layer
timeout ${AB_S:-120} python3 benchmarks/bench_training.py --steps 8 --dtype bfloat16 --models llama \
  --variants eager,thunderlite+tc,thunderlite+tc1,torch.compile ${BENCH_ARGS:---dim 512 --layers 4 --seq 256 --batch 8} \
  2>&1 | tee "$OUT/bench_grouping.log"
for model in gpt llama; do     # how thunderlite+tc splits the step on CUDA (regions, calls between them)
  timeout ${REGIONS_S:-60} python3 scripts/tc_regions.py --model $model --dtype bfloat16 2>&1 | grep -v -i warn \
    | tee -a "$OUT/regions.log"
done
# --- generated Triton kernels (issue 27, part 2): looped/online reductions, backward kernels, autotuning ---
# the kernel tests natively, then each family forward and forward+backward against eager and Inductor
timeout ${TRITON_TEST_S:-150} python3 -m pytest -q -rs -p no:cacheprovider thunderlite/tests/test_triton_kernels.py \
  2>&1 | tee "$OUT/triton_kernels_tests.log" | tail -n 30
timeout ${TRITON_BENCH_S:-300} python3 benchmarks/bench_triton_kernels.py ${TRITON_BENCH_ARGS:---quick} \
  --json "$OUT/triton_kernels.json" 2>&1 | tee "$OUT/bench_triton_kernels.log"
# --- end generated Triton kernels ---
