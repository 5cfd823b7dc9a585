#!/usr/bin/env bash
# mpi_apps_test.sh MPIEXEC PIPELINE TRAIN CASE: nerve-pipeline and nerve-train as a user
# runs them under mpirun (issue #21).
#   bitwise   stages and replicas on 2, 3 (and 4) ranks give the weights of one process, byte
#             for byte, for every schedule and for stand-in device stages and replicas; rank 0 alone
#             prints (one JSON object)
#   mismatch  ranks started with different arguments stop at once, saying so
#   ranks     a rank count that does not fit the stages x replicas is refused
#   kill      rank 1 killed with SIGKILL mid-run: the job ends within 10 s, non-zero, naming
#             rank 1, and the checkpoint left behind is whole
#   throw     a layer failing on one rank ends the job within 10 s with that error
#   stall     rank 1 stopped with SIGSTOP mid-run: with --stall-timeout 2 the job ends within
#             2 + 5 s, non-zero, rank 0 naming stage 1 (rank 1) and that nothing came from it,
#             and rank 0's trace so far is written
#   hosts     a 2-stage pipeline across two network namespaces over TCP (scripts/mpi-hosts),
#             bitwise the one-process weights (exit 77, skipped, where namespaces cannot be made)
set -u
mpiexec=$1 pipeline=$2 train=$3 case=$4
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# One interface for Open MPI's own traffic (docs/distributed.md); data goes by shared memory.
export OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
run() { timeout 120 "$mpiexec" --oversubscribe "$@"; }
small=(--model deep-mlp --steps 3 --batch 48 --no-eval --quiet)

case $case in
bitwise)
  check() {  # check NAME RANKS PROGRAM ARGS...: one process, then RANKS ranks
    local name=$1 n=$2 prog=$3
    shift 3
    "$prog" "$@" --save "$dir/one.st" >/dev/null || fail "$name: one process failed"
    run -np "$n" "$prog" "$@" --save "$dir/ranks.st" --json >"$dir/out.json" 2>"$dir/err" ||
      { cat "$dir/err"; fail "$name: $n ranks failed"; }
    cmp -s "$dir/one.st" "$dir/ranks.st" || fail "$name: the weights of $n ranks differ from one process's"
    python3 -c "import json,sys; j=json.load(open(sys.argv[1])); assert j['ranks']==int(sys.argv[2]), j['ranks']" \
      "$dir/out.json" "$n" || fail "$name: stdout is not rank 0's one JSON object"
    echo "ok: $name on $n ranks, bitwise"
  }
  for s in gpipe 1f1b zb-h1 emergent; do
    check "pipeline $s" 2 "$pipeline" "${small[@]}" --stages 2 --microbatches 4 --schedule $s
  done
  check "pipeline interleaved" 2 "$pipeline" "${small[@]}" --stages 2 --microbatches 4 --schedule interleaved --chunks 2
  check "pipeline 1f1b, 3 stages" 3 "$pipeline" "${small[@]}" --stages 3 --microbatches 3
  check "pipeline resmlp zb-h1" 2 "$pipeline" --model resmlp --steps 3 --batch 48 --no-eval --quiet --stages 2 \
    --microbatches 3 --schedule zb-h1
  # Device stages on ranks: values leave a stand-in device through pinned host memory.
  check "pipeline standin,standin" 2 "$pipeline" "${small[@]}" --stages 2 --microbatches 4 --devices standin,standin
  check "pipeline 2 stages x 2 replicas" 4 "$pipeline" "${small[@]}" --stages 2 --replicas 2 --microbatches 2
  check "train 2 replicas" 2 "$train" "${small[@]}" --replicas 2
  check "train 3 replicas" 3 "$train" "${small[@]}" --replicas 3 --microbatches 2
  # Device replicas one per rank: the stand-in's gradients cross through the host to the
  # ranks' member-order sum, the bits of the replicas summed on one device in one process.
  check "train 2 standin replicas" 2 "$train" "${small[@]}" --replicas 2 --device standin
  check "pipeline 2 standin stages x 2 replicas" 4 "$pipeline" "${small[@]}" --stages 2 --replicas 2 --microbatches 2 \
    --devices standin,standin
  ;;
mismatch)
  start=$(date +%s%N)
  out=$(run -np 1 "$pipeline" "${small[@]}" --stages 2 : -np 1 "$pipeline" "${small[@]}" --stages 3 2>&1)
  rc=$?
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  echo "$out"
  [ $rc -ne 0 ] || fail "the job exited 0"
  [ $ms -lt 10000 ] || fail "it took $ms ms to refuse"
  grep -q "disagree on the command line" <<<"$out" || fail "the error does not say the ranks disagree"
  grep -q "rank 1 has '.*--stages 3" <<<"$out" || fail "the error does not name rank 1 and its arguments"
  ;;
ranks)
  out=$(run -np 3 "$pipeline" "${small[@]}" --stages 2 2>&1)
  [ $? -ne 0 ] || fail "3 ranks for 2 stages ran"
  echo "$out" | head -3
  grep -q "start 2 ranks (mpirun -np 2), not 3" <<<"$out" || fail "the error does not say how many ranks to start"
  out=$(run -np 3 "$train" "${small[@]}" --replicas 2 2>&1)
  [ $? -ne 0 ] || fail "3 ranks for 2 replicas ran"
  grep -q "mpirun -np 2" <<<"$out" || fail "nerve-train does not say how many ranks to start"
  ;;
kill)
  : >"$dir/metrics"
  "$mpiexec" --oversubscribe -np 2 "$pipeline" --model deep-mlp --stages 2 --epochs 50 --no-eval --quiet \
    --metrics "$dir/metrics" --checkpoint "$dir/ckpt" --checkpoint-every 2 >"$dir/out" 2>&1 &
  job=$!
  # Wait until two checkpoints were written: rank 0 writes a line per step (tail blocks until then).
  timeout 60 tail -f "$dir/metrics" | grep -m1 -q '"kind":"step","step":5,' || fail "no step 5 within 60 s"
  # Rank 1's process: the one of this program whose environment says so (no procps needed).
  victim=""
  for d in /proc/[0-9]*; do
    [ "$(readlink "$d/exe" 2>/dev/null)" = "$(readlink -f "$pipeline")" ] || continue
    grep -qz '^OMPI_COMM_WORLD_RANK=1$' "$d/environ" 2>/dev/null && victim=${d#/proc/}
  done
  [ -n "$victim" ] || fail "rank 1's process not found"
  start=$(date +%s%N)
  kill -KILL "$victim"
  timeout 30 tail --pid="$job" -f /dev/null
  wait "$job"
  rc=$?
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  cat "$dir/out" | grep -v '^$' | head -20
  echo "exit $rc after $ms ms"
  [ $rc -ne 0 ] || fail "the job exited 0"
  [ $ms -lt 10000 ] || fail "the job took $ms ms to end (limit 10 s)"
  grep -q "rank 1 .*exited on signal 9" "$dir/out" || fail "the output does not name rank 1 and its signal"
  # The checkpoint is written whole, then renamed: what is there is a complete safetensors file.
  [ -f "$dir/ckpt" ] || fail "no checkpoint was written before the kill"
  python3 - "$dir/ckpt" <<'EOF' || fail "the checkpoint left behind is not whole"
import json, struct, sys
data = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + n])
end = max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__")
assert 8 + n + end == len(data), (8 + n + end, len(data))
print("checkpoint whole:", len(header) - 1, "tensors,", len(data), "bytes")
EOF
  ;;
throw)
  start=$(date +%s%N)
  # A learning rate that makes the gradients overflow: the layers of both ranks fail in step 1.
  out=$(run -np 2 "$pipeline" "${small[@]}" --stages 2 --lr 1e30 2>&1)
  rc=$?
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  echo "$out" | grep -v '^$' | head -12
  [ $rc -ne 0 ] || fail "the job exited 0"
  [ $ms -lt 10000 ] || fail "the job took $ms ms to end"
  grep -q "rank [01]: actor 'fc[0-9]' failed: layer 'fc[0-9]': step [0-9]*: the gradient of .* is not finite" <<<"$out" ||
    fail "the output lacks a rank's error naming the layer"
  ;;
stall)
  : >"$dir/metrics"
  "$mpiexec" --oversubscribe -np 2 "$pipeline" --model deep-mlp --stages 2 --epochs 50 --no-eval --quiet \
    --stall-timeout 2 --metrics "$dir/metrics" --trace "$dir/trace.json" >"$dir/out" 2>&1 &
  job=$!
  timeout 60 tail -f "$dir/metrics" | grep -m1 -q '"kind":"step","step":3,' || fail "no step 3 within 60 s"
  victim=""
  for d in /proc/[0-9]*; do
    [ "$(readlink "$d/exe" 2>/dev/null)" = "$(readlink -f "$pipeline")" ] || continue
    grep -qz '^OMPI_COMM_WORLD_RANK=1$' "$d/environ" 2>/dev/null && victim=${d#/proc/}
  done
  [ -n "$victim" ] || fail "rank 1's process not found"
  start=$(date +%s%N)
  kill -STOP "$victim"
  timeout 30 tail --pid="$job" -f /dev/null
  ended=$?
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  kill -KILL "$victim" 2>/dev/null  # mpirun may leave a stopped process behind
  [ $ended -eq 0 ] || { kill -KILL "$job" 2>/dev/null; fail "the job still ran 30 s after rank 1 stopped"; }
  wait "$job"
  rc=$?
  grep -v '^$' "$dir/out" | head -12
  echo "exit $rc after $ms ms"
  [ $rc -ne 0 ] || fail "the job exited 0"
  [ $ms -lt 7000 ] || fail "the job took $ms ms to end (limit 2 + 5 s)"
  grep -q "rank 0: pipeline stalled" "$dir/out" || fail "rank 0 does not report the stall"
  grep -q "stage 1 (rank 1)" "$dir/out" || fail "the report does not name the stopped rank's stage"
  grep -q "nothing came from rank 1 for 2 s" "$dir/out" || fail "the report does not say nothing came from rank 1"
  [ -s "$dir/trace.json" ] || fail "rank 0's trace so far was not written"
  ;;
hosts)
  here=$(cd "$(dirname "$0")/../.." && pwd)
  "$pipeline" "${small[@]}" --stages 2 --save "$dir/one.st" >/dev/null || fail "one process failed"
  "$here/scripts/mpi-hosts" "$pipeline" "${small[@]}" --stages 2 --save "$dir/hosts.st"
  rc=$?
  [ $rc -eq 77 ] && exit 77
  [ $rc -eq 0 ] || fail "the job across namespaces failed ($rc)"
  cmp -s "$dir/one.st" "$dir/hosts.st" || fail "the weights across namespaces differ from one process's"
  ;;
*) fail "unknown case $case" ;;
esac
echo PASS
