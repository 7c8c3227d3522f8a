#!/bin/bash
# The checks that need a CUDA GPU, as one run of about 9 minutes on an H100
# host with 16 cores: the most important numbers first, every step under its
# own time limit (seconds in the *_S variables), each step's log in $OUT.
# Usage: OUT=<dir> bash scripts/gpu_checks.sh      (EXTRA=1: also the older
# bench_training / grouping / region runs and the per-family Triton kernel benchmark at the end)
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_checks}; mkdir -p "$OUT"
XDIST=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8")

# ---- [gpu-path] 1. environment (~20 s) -------------------------------------------------------
nvidia-smi -L
timeout ${ENV_S:-60} python3 - <<'PY' 2>&1 | tee "$OUT/env.log"
import subprocess, torch
import torch.nn.functional as F
print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())
print("capability", torch.cuda.get_device_capability(), torch.cuda.get_device_name())
get = getattr(torch._C, "_get_sdp_priority_order", None)
print("sdp priority before any SDPA call", list(get()) if get else None)
x = torch.zeros(1, 1, 8, 8, device="cuda", dtype=torch.bfloat16)
F.scaled_dot_product_attention(x, x, x)
print("sdp priority after the first call", list(get()) if get else None)
q = torch.zeros(8, 16, 512, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
kv = torch.zeros(8, 4, 512, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
print("eager's SDPA backend for HF Llama's GQA call (0 math 1 flash 2 efficient 3 cudnn):",
      torch.ops.aten._fused_sdp_choice(q, kv, kv, None, 0.0, True, enable_gqa=True))
import thunderlite, thunderlite.executors  # noqa: F401
from thunderlite.executors.registry import executor_status
print("thunderlite imports; executors:", executor_status())
print("commit", subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip())
PY

# ---- [gpu-path] 2. training steps, bf16: GPT and Llama, every variant (~4.5 min) -------------
timeout ${MODELS_S:-270} python3 benchmarks/bench_gpu.py --only models --budget ${MODEL_BUDGET_S:-125} \
  2>&1 | grep -v -i "warn" | tee "$OUT/bench_models.log"

# ---- [gpu-path] 3. the CUDA tests (~2.5 min) --------------------------------------------------
timeout ${TEST_S:-150} python3 -m pytest -q -rs $XDIST -p no:cacheprovider \
  thunderlite/tests/test_cudagraphs.py thunderlite/tests/test_attention_kernels.py \
  thunderlite/tests/test_grad_kernels.py thunderlite/tests/test_fusion_executors.py \
  thunderlite/tests/test_symm_mem.py::test_on_gpu_one_shot_and_declared_args_real_backend \
  thunderlite/tests/test_prims.py thunderlite/tests/test_triton.py thunderlite/tests/test_dynamic_shapes.py \
  thunderlite/tests/test_triton_kernels.py \
  --junitxml="$OUT/junit.xml" 2>&1 | tee "$OUT/tests.log" | tail -n 60

# ---- [dtensor] FSDP2 and tensor parallelism under jit on a one-rank NCCL group (the [cuda] cases) --
timeout ${DIST_S:-60} python3 -m pytest -q -rs -p no:cacheprovider thunderlite/tests/test_distributed.py -k cuda \
  2>&1 | tee "$OUT/distributed.log" | tail -n 20

# ---- [gpu-path] 4. kernels, bf16, forward and forward+backward (~1.5 min) -------------------
timeout ${KERNELS_S:-90} python3 benchmarks/bench_gpu.py --only kernels --budget ${KERNEL_BUDGET_S:-80} \
  2>&1 | grep -v -i "warn" | tee "$OUT/bench_kernels.log"

# ---- [gpu-path] 5. optional (EXTRA=1): the older training benchmark, grouping, regions ------
if [ -n "$EXTRA" ]; then
  timeout ${BENCH_S:-120} python3 benchmarks/bench_training.py --steps 12 --dtype bfloat16 \
    ${BENCH_ARGS:---dim 512 --layers 4 --seq 256 --batch 8} 2>&1 | tee "$OUT/bench_bfloat16.log"
  # layers grouped into regions (the default, executors/cost.py) against one region per layer
  timeout ${AB_S:-90} python3 benchmarks/bench_training.py --steps 8 --dtype bfloat16 --models llama \
    --variants eager,thunderlite+tc,thunderlite+tc1,torch.compile ${BENCH_ARGS:---dim 512 --layers 4 --seq 256 --batch 8} \
    2>&1 | tee "$OUT/bench_grouping.log"
  for model in gpt llama; do     # how thunderlite+tc splits the step on CUDA (regions, calls between them)
    timeout ${REGIONS_S:-40} python3 scripts/tc_regions.py --model $model --dtype bfloat16 2>&1 | grep -v -i warn \
      | tee -a "$OUT/regions.log"
  done
  # [triton-kernels] every generated-kernel family alone, forward and forward+backward, against eager and Inductor
  timeout ${TRITON_BENCH_S:-240} python3 benchmarks/bench_triton_kernels.py ${TRITON_BENCH_ARGS:---quick} \
    --json "$OUT/triton_kernels.json" 2>&1 | tee "$OUT/bench_triton_kernels.log"
fi
# ---- end of [gpu-path] blocks ------------------------------------------------------------------
