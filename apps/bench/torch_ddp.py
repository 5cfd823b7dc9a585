#!/usr/bin/python3
"""PyTorch's DistributedDataParallel over gloo: the baseline of nerve's data-parallel training.

N processes × 1 thread (OMP_NUM_THREADS=OPENBLAS_NUM_THREADS=1), each a replica of --model
with --batch random rows per step; forward, cross-entropy, backward (DDP's bucketed
all-reduce overlaps it), SGD with momentum 0.9. Prints one JSON object: per repeat the
samples per second of all replicas together (--steps timed steps after --warmup), and the
median. Run by apps/bench/distributed_compare.py; also usable alone:

    /usr/bin/python3 apps/bench/torch_ddp.py --ranks 2 --model deep-mlp --batch 256

Needs Debian's python3-torch (1.13).
"""
import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch import nn  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_train import model  # noqa: E402  (the presets' shapes, shared with nerve-bench train)


def replica(rank, args, port, out):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    torch.manual_seed(0)
    net = nn.parallel.DistributedDataParallel(model(args.model))
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(args.batch, 784, generator=g)
    y = torch.randint(0, 10, (args.batch,), generator=g)

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(net(x), y).backward()
        opt.step()

    rates = []
    for _ in range(args.repeats):
        for _ in range(args.warmup):
            step()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step()
        dist.barrier()
        rates.append(args.ranks * args.batch * args.steps / (time.perf_counter() - t0))
    if rank == 0:
        out.put(rates)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--model", default="deep-mlp", choices=["mlp", "deep-mlp"])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--port", type=int, default=29517)
    args = ap.parse_args()
    for name in ("ranks", "batch", "steps", "repeats"):
        if getattr(args, name) < 1:
            raise SystemExit(f"torch_ddp.py: --{name} must be at least 1")
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    mp.spawn(replica, args=(args, args.port, out), nprocs=args.ranks, join=True)
    rates = out.get()
    print(json.dumps({"benchmark": "torch_ddp", "torch": torch.__version__, "backend": "gloo", "ranks": args.ranks,
                      "model": args.model, "batch_per_replica": args.batch, "samples_per_s": rates,
                      "median_samples_per_s": statistics.median(rates)}))


if __name__ == "__main__":
    main()
