#!/usr/bin/python3
"""Training across processes, nerve against PyTorch, in one command.

    /usr/bin/python3 apps/bench/distributed_compare.py BUILD_DIR [REPEATS]

Alternates, REPEATS times (default 5), `mpirun -np 2 nerve-bench-mpi training --json -r 1`
(data-parallel replicas and pipeline stages on 2 ranks, and the same in one process) and
`torch_ddp.py --repeats 1` (PyTorch 1.13's DistributedDataParallel over gloo, 2 processes
× 1 thread), so a noisy neighbour hits both; prints the medians and the ratios issue #21
names: nerve's data parallel on 2 ranks over PyTorch DDP, over nerve's 2 replicas in one
process, and the 2-stage pipeline on 2 ranks over one process. Needs Debian's python3-torch.
"""
import json
import os
import statistics
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    build = sys.argv[1]
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    if repeats < 1:
        raise SystemExit("distributed_compare.py: REPEATS must be at least 1")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    nerve = [os.path.join(build, "bin", "nerve-bench-mpi"), "training", "--json", "-r", "1"]
    dp_ranks, dp_one, pipe_ranks, pipe_one, torch_ddp = [], [], [], [], []
    for r in range(repeats):
        print(f"\rrepeat {r + 1}/{repeats}", end="", file=sys.stderr, flush=True)
        out = subprocess.run(["mpirun", "-np", "2"] + nerve, env=env, check=True, capture_output=True, text=True)
        j = json.loads(out.stdout)
        dp_ranks.append(j["data_parallel"]["ranks_samples_per_s"])
        dp_one.append(j["data_parallel"]["one_process_samples_per_s"])
        pipe_ranks.append(j["pipeline"]["ranks_samples_per_s"])
        pipe_one.append(j["pipeline"]["one_process_samples_per_s"])
        out = subprocess.run(["/usr/bin/python3", os.path.join(here, "torch_ddp.py"), "--repeats", "1"], env=env,
                             check=True, capture_output=True, text=True)
        torch_ddp.append(json.loads(out.stdout)["median_samples_per_s"])
    print(file=sys.stderr)
    med = statistics.median
    result = {
        "repeats": repeats,
        "deep_mlp_data_parallel_2_ranks": {
            "nerve_ranks_samples_per_s": med(dp_ranks), "nerve_one_process_samples_per_s": med(dp_one),
            "torch_ddp_gloo_samples_per_s": med(torch_ddp),
            "nerve_over_torch_ddp": med(dp_ranks) / med(torch_ddp),
            "ranks_over_one_process": med(dp_ranks) / med(dp_one),
            "per_repeat_nerve_over_torch": [a / b for a, b in zip(dp_ranks, torch_ddp)]},
        "deep_mlp_pipeline_1f1b_2_ranks": {
            "ranks_samples_per_s": med(pipe_ranks), "one_process_samples_per_s": med(pipe_one),
            "ranks_over_one_process": med(pipe_ranks) / med(pipe_one),
            "per_repeat": [a / b for a, b in zip(pipe_ranks, pipe_one)]},
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
