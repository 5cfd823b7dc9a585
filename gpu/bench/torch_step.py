#!/usr/bin/env python3
"""PyTorch eager twin of `nerve-bench gpu`'s training steps (run by it, same GPU).

    torch_step.py --model mlp --batch 256 --steps 200 [--warmup 20]

Prints one JSON object: the median time of a synchronous step (forward, loss,
backward, SGD momentum 0.9 step, then torch.cuda.synchronize: what nerve's
`train_step().get()` measures) and the mean time per step when steps are queued
back to back (one synchronize at the end). fp32, TF32 off, as nerve's default.
"""
import argparse
import json
import sys
import time


def build(model, torch):
    nn = torch.nn
    if model == "mlp":
        return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))
    if model == "deep-mlp":
        layers = [nn.Linear(784, 1024), nn.ReLU()]
        for _ in range(3):
            layers += [nn.Linear(1024, 1024), nn.ReLU()]
        layers.append(nn.Linear(1024, 10))
        return nn.Sequential(*layers)
    raise SystemExit("unknown model " + model)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    a = ap.parse_args()
    try:
        import torch
    except ImportError as e:
        print(json.dumps({"error": "no torch: %s" % e}))
        return 0
    if not torch.cuda.is_available():
        print(json.dumps({"error": "torch sees no CUDA device"}))
        return 0
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    net = build(a.model, torch).to(dev)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    x = torch.randn(a.batch, 784, device=dev)
    y = torch.randint(0, 10, (a.batch,), device=dev)

    def step():
        opt.zero_grad(set_to_none=False)
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()
        return loss

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        loss = step()
        loss.item()  # the host needs the loss, as nerve's step result
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    times.sort()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    torch.cuda.synchronize()
    queued = (time.perf_counter() - t0) / a.steps
    print(json.dumps({
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0),
        "model": a.model,
        "batch": a.batch,
        "step_median_us": times[len(times) // 2] * 1e6,
        "step_p99_us": times[min(len(times) - 1, len(times) * 99 // 100)] * 1e6,
        "queued_step_us": queued * 1e6,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
