#!/usr/bin/env bash
# gpu/bench/device_run.sh: the one batched run on a lent GPU machine (docs/gpu.md).
# Run from the repository root there, with the binaries in .carry/ and the
# Fashion-MNIST files in .data/. Writes everything under ${OUT:-out}/.
#
# Here, before carrying (no OpenBLAS: its 37 MB do not fit beside the data):
#   scripts/build build-gpu-dev -DNERVE_ENABLE_CUDA=ON -DNERVE_ARCH=x86-64-v3 -DCMAKE_DISABLE_FIND_PACKAGE_PkgConfig=ON
#   (cmake --build build-gpu-dev --target nerve-train nerve-bench gpu_device_test gpu_fault_test)
#   mkdir -p .carry .data && cp build-gpu-dev/bin/{nerve-train,nerve-bench,gpu_device_test,gpu_fault_test} .carry/
#   strip .carry/*; cp /lib/x86_64-linux-gnu/libgomp.so.1 .carry/
#   cp /usr/share/datasets/fashion-mnist/*.gz .data/
# libcudart/libcublas(Lt).so.13 come from the machine's toolkit or PyTorch's
# nvidia wheels (libcublasLt alone is 540 MB: it cannot be carried).
set -uo pipefail
out=${OUT:-out}
mkdir -p "$out"
libs=.carry
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && libs="$libs:$d"
done
py_libs=$(python3 -c 'import glob, os, nvidia; print(":".join(sorted({os.path.dirname(p) for p in glob.glob(os.path.join(list(nvidia.__path__)[0], "*", "lib", "*.so*"))})))' 2>/dev/null)
[ -n "$py_libs" ] && libs="$libs:$py_libs"
export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  nvcc --version | tail -2
  python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'
  ldd .carry/nerve-bench | grep -E "not found|cublas|cudart"
} > "$out/machine.txt" 2>&1
run() { local name=$1; shift; echo "== $name: $*"; timeout "${LIMIT:-300}" "$@" > "$out/$name.txt" 2>&1; echo "rc=$?" | tee -a "$out/$name.txt"; }
run device_test .carry/gpu_device_test
run fault_poller env NERVE_GPU_FAULT_MODE=poller .carry/gpu_fault_test
run fault_blocking env NERVE_GPU_FAULT_MODE=blocking NERVE_GPU_FAULT_KIND=trap .carry/gpu_fault_test
run bench .carry/nerve-bench gpu --steps 200
run train_mlp .carry/nerve-train --model mlp --device cuda --epochs 2 --data .data --json --quiet
run train_lenet .carry/nerve-train --model lenet --device cuda --epochs 1 --data .data --json --quiet
