#!/usr/bin/env bash
# gpu/bench/device_run.sh: the one batched run on a lent GPU machine (docs/gpu.md).
# Run from the repository root there, with the binaries in .carry/ and the
# Fashion-MNIST files in .data/. Writes under ${OUT:-out}/: device.log (every
# step's output, each under a "== name" line with its exit status), bench1.json and
# bench2.json (nerve-bench gpu's object, two runs; old1/old2.json from .carry-old/ if carried),
# trace.json (a short traced nerve-train run) and trace_pipe.json (a traced 2-stage pipeline on one GPU).
# The device tool brings back at most 8 files, so the steps share one log.
#
# Here, before carrying (no OpenBLAS: its 37 MB do not fit beside the data):
#   scripts/build build-gpu-dev -DNERVE_ENABLE_CUDA=ON -DNERVE_ARCH=x86-64-v3 -DCMAKE_DISABLE_FIND_PACKAGE_PkgConfig=ON
#   (or cmake --build build-gpu-dev --target nerve-train nerve-bench nerve-pipeline gpu_device_test gpu_fault_test)
#   mkdir -p .carry .data && cp build-gpu-dev/bin/{nerve-train,nerve-bench,nerve-pipeline,gpu_device_test,gpu_fault_test} .carry/
#   cp build-gpu-dev/lib/{libnerve_gpu_cuda.so,libnerve_bench_cudnn.so} .carry/   # the CUDA modules: found beside the binaries
#   strip .carry/*; cp /lib/x86_64-linux-gnu/{libgomp.so.1,libz.so.1} .carry/
#   cp /usr/share/datasets/fashion-mnist/*.gz .data/
# libcudart/libcublas(Lt).so.13 come from the machine's toolkit or PyTorch's
# nvidia wheels (libcublasLt alone is 540 MB: it cannot be carried). Only the modules
# need them (the binaries link no CUDA library); a carried build folder works too:
# build/bin/* find build/lib/libnerve_gpu_cuda.so through ../lib.
# STEPS=name,name,... runs only those steps (a rerun after a fix).
set -uo pipefail
out=${OUT:-out}
mkdir -p "$out"
log=$out/device.log
libs=.carry
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && libs="$libs:$d"
done
py_libs=$(python3 -c 'import glob, os, nvidia; print(":".join(sorted({os.path.dirname(p) for p in glob.glob(os.path.join(list(nvidia.__path__)[0], "*", "lib", "*.so*"))})))' 2>/dev/null)
[ -n "$py_libs" ] && libs="$libs:$py_libs"
export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NERVE_FASHION_MNIST=$PWD/.data   # for gpu_device_test's training case
{
  echo "== machine"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  grep -m1 "model name" /proc/cpuinfo; nproc
  nvcc --version | tail -2
  python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'
  ldd .carry/nerve-bench | grep -E "not found|cublas|cudart|gomp"   # no cudart/cublas: only the modules link them
  ldd .carry/libnerve_gpu_cuda.so .carry/libnerve_bench_cudnn.so | grep -E "not found|cublas|cudart|cudnn"
} >> "$log" 2>&1
want() { [ -z "${STEPS:-}" ] || [[ ",$STEPS," == *",$1,"* ]]; }
# run NAME LIMIT_S CMD...: output to the log, exit status after it; a hang costs at most LIMIT_S.
run() {
  local name=$1 limit=$2; shift 2
  want "$name" || return 0
  local t0=$SECONDS
  echo "== $name: $*" | tee -a "$log"
  timeout -k 5 "$limit" "$@" >> "$log" 2>&1
  local rc=$?
  echo "-- $name rc=$rc ($((SECONDS - t0)) s)" | tee -a "$log"
}
run device_test 150 .carry/gpu_device_test --duration=true
run fault_poller 30 env NERVE_GPU_FAULT_MODE=poller .carry/gpu_fault_test
run fault_blocking 30 env NERVE_GPU_FAULT_MODE=blocking NERVE_GPU_FAULT_KIND=trap .carry/gpu_fault_test
run fault_shared 30 env NERVE_GPU_FAULT_MODE=poller NERVE_GPU_FAULT_KIND=shared .carry/gpu_fault_test
run fault_eager 30 env CUDA_MODULE_LOADING=EAGER NERVE_GPU_FAULT_MODE=poller .carry/gpu_fault_test
# A baseline build carried in .carry-old/ (its nerve-bench and its CUDA module) runs
# after each run of this one, so old and new are compared on the same machine and minute.
for k in 1 2; do   # twice: the spread between two runs is part of the figure
  want bench || break
  for side in bench old; do
    dir=.carry; [ $side = old ] && dir=.carry-old
    [ -x $dir/nerve-bench ] || continue
    echo "== $side $k" | tee -a "$log"; t0=$SECONDS
    timeout -k 5 150 $dir/nerve-bench gpu --steps 200 > "$out/$side$k.json" 2>> "$log"
    echo "-- $side $k rc=$? ($((SECONDS - t0)) s)" | tee -a "$log"
  done
done
run conv 120 .carry/nerve-bench conv --json   # im2col + cuBLAS against cuDNN (needs libcudnn.so.9 there)
run train_mlp 90 .carry/nerve-train --model mlp --device cuda --epochs 10 --data .data --json --quiet
run train_lenet 120 .carry/nerve-train --model lenet --device cuda --data .data --json --quiet
run trace_mlp 60 .carry/nerve-train --model mlp --device cuda --steps 20 --no-eval --data .data --quiet --trace "$out/trace.json"
run trace_pipe 60 .carry/nerve-pipeline --model mlp --stages 2 --devices cuda:0,cuda:0 --schedule 1f1b --steps 10 --data .data --quiet --trace "$out/trace_pipe.json"
run pipe_mixed 90 .carry/nerve-pipeline --model mlp --stages 2 --devices cpu,cuda:0 --epochs 1 --data .data --json --quiet
run pipe_replicas 90 .carry/nerve-pipeline --model mlp --stages 2 --replicas 2 --devices cuda:0,cuda:0 --epochs 1 --data .data --json --quiet
run pipe_gpu4 90 .carry/nerve-pipeline --model deep-mlp --stages 4 --devices cuda:0,cuda:0,cuda:0,cuda:0 --schedule zb-h1 --steps 100 --data .data --json --quiet
exit 0
