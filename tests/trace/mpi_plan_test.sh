#!/usr/bin/env bash
# mpi_plan_test.sh MPIEXEC PIPELINE TRACE DIR: nerve-trace on the trace of a 2-stage 1F1B
# pipeline that ran on two MPI ranks (one merged file, rank s running stage s) and in one
# process, both with an evaluation after the epoch.
#   - the merged trace's planned bubble per stage is the one of the same actions recorded
#     in one process (the merged file folded onto one pid), and not 0; the one-process run
#     has a planned bubble too
#   - every rank records its evaluation (`evaluation` slice on tid 0), and the summary
#     counts it apart: the stages' bubble% is over training time (window - evaluation)
set -u
mpiexec=$1 pipeline=$2 trace=$3 dir=$4
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
rm -rf "$dir" && mkdir -p "$dir" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
run=(--model deep-mlp --stages 2 --schedule 1f1b --microbatches 4 --batch 48 --steps 3 --quiet)

timeout 120 "$pipeline" "${run[@]}" --trace "$dir/one.json" >"$dir/one.out" 2>&1 ||
  { cat "$dir/one.out"; fail "one process failed"; }
timeout 120 "$mpiexec" --oversubscribe -np 2 "$pipeline" "${run[@]}" --trace "$dir/job.json" >"$dir/job.out" 2>&1 ||
  { cat "$dir/job.out"; fail "mpirun -np 2 failed"; }
for f in one job; do
  timeout 60 "$trace" summary "$dir/$f.json" --json >"$dir/$f.summary.json" 2>"$dir/$f.err" ||
    { cat "$dir/$f.err"; fail "nerve-trace summary $f.json failed"; }
done

python3 - "$dir" "$trace" <<'EOF' || exit 1
import json, subprocess, sys
d, trace = sys.argv[1], sys.argv[2]
def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)
def stages(name):
    return {(s["pid"], s["stage"]): s for s in json.load(open(f"{d}/{name}.summary.json"))["stages"]}

job_trace = json.load(open(f"{d}/job.json"))
job = stages("job")
one = stages("one")
if sorted(job) != [(0, 0), (1, 1)]: fail(f"the merged trace's stages are {sorted(job)}, not stage s on rank s")

# The merged file's actions folded onto one process: what one process running them records.
events = [dict(e, pid=0) for e in job_trace["traceEvents"] if e.get("cat") == "action"]
folded = {"traceEvents": events, "nerve": {"version": 1, "schedule": job_trace["nerve"]["schedule"],
          "stages": [{"stage": s["stage"], "actors": []} for s in job_trace["nerve"]["stages"]]}}
json.dump(folded, open(f"{d}/folded.json", "w"))
out = subprocess.run([trace, "summary", f"{d}/folded.json", "--json"], capture_output=True, text=True, timeout=60)
if out.returncode != 0: fail("nerve-trace summary folded.json: " + out.stderr)
folded = {s["stage"]: s for s in json.loads(out.stdout)["stages"]}
for (pid, stage), s in sorted(job.items()):
    planned, expect = s["planned_bubble_pct"], folded[stage]["planned_bubble_pct"]
    print(f"rank {pid} stage {stage}: planned {planned}%, the same actions in one process {expect}%")
    if planned is None or expect is None or abs(planned - expect) > 1e-6:
        fail(f"rank {pid} stage {stage}: planned bubble {planned}% in the merged trace, {expect}% in one process")
if not job[(0, 0)]["planned_bubble_pct"] > 0: fail("stage 0 of 1F1B plans no bubble in the merged trace")
if not (one[(0, 0)]["planned_bubble_pct"] or 0) > 0: fail("stage 0 of 1F1B plans no bubble in one process")

# Every rank's evaluation is on its tid 0; the stages count it apart from training.
for pid in (0, 1):
    n = sum(1 for e in job_trace["traceEvents"] if e.get("cat") == "evaluation" and e.get("ph") == "X"
            and e.get("pid") == pid and e.get("tid") == 0 and e.get("args", {}).get("epoch") == 1)
    if n != 1: fail(f"rank {pid} recorded {n} evaluation slices for epoch 1, not 1")
for name, table in (("merged", job), ("one process", one)):
    for key, s in sorted(table.items()):
        if not s["evaluation_us"] > 0: fail(f"{name} stage {key}: no evaluation time")
        if abs(s["training_us"] - (s["window_us"] - s["evaluation_us"])) > 1e-3: fail(f"{name} {key}: training time")
        bubble = 100 * (s["training_us"] - s["busy_us"]) / s["training_us"]
        if abs(s["bubble_pct"] - bubble) > 1e-6: fail(f"{name} stage {key}: bubble {s['bubble_pct']}% is not over training time ({bubble}%)")
        print(f"{name} stage {key}: window {s['window_us']:.0f} µs, evaluation {s['evaluation_us']:.0f}, bubble {s['bubble_pct']:.1f}%")
EOF
echo "mpi_plan_test: ok"
