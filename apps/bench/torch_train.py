#!/usr/bin/python3
"""PyTorch side of `nerve-bench train`: the same models, steps and epoch in PyTorch.

Run by `nerve-bench train` (one process per thread count, with OMP_NUM_THREADS and
OPENBLAS_NUM_THREADS set to it); also usable alone:

    OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 /usr/bin/python3 apps/bench/torch_train.py \
        --threads 2 --models mlp,deep-mlp --batches 32,256 --repeats 5 --epoch

Prints one JSON object on stdout: the BLAS library PyTorch actually loaded (read from
/proc/self/maps, so it says OpenBLAS or the reference BLAS as it is), per model and batch
the median seconds of one training step (forward, cross-entropy, backward, SGD with
momentum 0.9, lr 0.1: what the nerve presets use), wall-clock and process CPU time, and with --epoch the seconds of one
`mlp` epoch on Fashion-MNIST (batch 256, shuffled, pixels in [0, 1]; data already in
memory, evaluation excluded, as nerve-train's epoch seconds).
Needs Debian's python3-torch (1.13).
"""
import argparse
import gzip
import json
import os
import statistics
import struct
import sys
import time

import torch
from torch import nn


def model(name):
    if name == "mlp":
        dims = [784, 256, 10]
    elif name == "deep-mlp":
        dims = [784, 1024, 1024, 1024, 1024, 10]
    else:
        raise SystemExit(f"torch_train.py: unknown model {name}")
    layers = []
    for i in range(len(dims) - 1):
        layers.append(nn.Linear(dims[i], dims[i + 1]))
        if i + 2 < len(dims):
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def loaded_blas():
    """The BLAS shared objects mapped into this process, resolved to real paths."""
    libs = set()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 6 and ("blas" in parts[-1] or "lapack" in parts[-1]):
                libs.add(os.path.realpath(parts[-1]))
    kind = "openblas" if any("openblas" in p for p in libs) else ("reference" if libs else "none")
    return kind, sorted(libs)


def step_seconds(name, batch, steps, repeats, warmup):
    torch.manual_seed(0)
    net = model(name)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.rand(batch, 784)
    y = torch.randint(0, 10, (batch,))

    def step():
        opt.zero_grad(set_to_none=False)
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()

    for _ in range(warmup):
        step()
    samples, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(steps):
            step()
        samples.append((time.perf_counter() - t0) / steps)
        cpu.append((time.process_time() - c0) / steps)
    return samples, cpu


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, = struct.unpack(">I", data[:4])
    dims = magic & 0xFF
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    return torch.frombuffer(bytearray(data[4 + 4 * dims:]), dtype=torch.uint8).reshape(shape)


def epoch_seconds(data_dir, repeats):
    x = read_idx(os.path.join(data_dir, "train-images-idx3-ubyte.gz")).reshape(-1, 784).float() / 255.0
    y = read_idx(os.path.join(data_dir, "train-labels-idx1-ubyte.gz")).long()
    samples = []
    for r in range(repeats):
        torch.manual_seed(r)
        net = model("mlp")
        opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        loss_fn = nn.CrossEntropyLoss()
        t0 = time.perf_counter()
        perm = torch.randperm(x.shape[0])
        for b in range(0, x.shape[0], 256):
            idx = perm[b:b + 256]
            opt.zero_grad(set_to_none=False)
            loss = loss_fn(net(x[idx]), y[idx])
            loss.backward()
            opt.step()
        samples.append(time.perf_counter() - t0)
    return samples


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--models", default="mlp,deep-mlp")
    ap.add_argument("--batches", default="32,64,256,1024")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--min-seconds", type=float, default=0.25, help="each repeat runs at least this long")
    ap.add_argument("--epoch", action="store_true", help="also time one mlp epoch on Fashion-MNIST")
    ap.add_argument("--epoch-repeats", type=int, default=3)
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--json", action="store_true", help="accepted for symmetry; output is always JSON")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    out = {"framework": "pytorch", "version": torch.__version__, "threads": a.threads,
           "torch_threads": torch.get_num_threads(),
           "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE", "LD_PRELOAD")},
           "steps": []}
    for name in [m for m in a.models.split(",") if m]:
        for batch in (int(b) for b in a.batches.split(",")):
            one = min(step_seconds(name, batch, 1, 1, 2)[0])
            steps = max(1, int(a.min_seconds / max(one, 1e-6)))
            s, c = step_seconds(name, batch, steps, a.repeats, warmup=2)
            out["steps"].append({"model": name, "batch": batch, "steps_per_repeat": steps,
                                 "median_seconds": statistics.median(s), "samples_seconds": s,
                                 "median_cpu_seconds": statistics.median(c), "samples_cpu_seconds": c})
    if a.epoch:
        if os.path.exists(os.path.join(a.data, "train-images-idx3-ubyte.gz")):
            s = epoch_seconds(a.data, a.epoch_repeats)
            out["epoch"] = {"model": "mlp", "batch": 256, "median_seconds": statistics.median(s), "samples_seconds": s}
        else:
            out["epoch"] = {"skipped": f"no Fashion-MNIST under {a.data}"}
    kind, libs = loaded_blas()  # after the work: every library PyTorch pulled in is mapped
    out["blas"] = kind
    out["blas_libraries"] = libs
    json.dump(out, sys.stdout)
    print()


if __name__ == "__main__":
    main()
