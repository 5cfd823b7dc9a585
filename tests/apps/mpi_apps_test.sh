#!/usr/bin/env bash
# mpi_apps_test.sh MPIEXEC PIPELINE TRAIN CASE: nerve-pipeline and nerve-train as a user
# runs them under mpirun (issue #21).
#   bitwise   stages and replicas on 2, 3 (and 4) ranks give the weights of one process, byte
#             for byte, for every schedule and for stand-in device stages and replicas; rank 0 alone
#             prints (one JSON object)
#   mismatch  ranks started with different arguments stop at once, saying so
#   ranks     a rank count that does not fit the stages x replicas is refused
#   kill      rank 1 killed with SIGKILL mid-run: the job ends within 10 s, non-zero, naming
#             rank 1, and the checkpoint left behind is whole; then SIGTERM to one rank of
#             nerve-pipeline --stages 2 (rank 1, then rank 0) and of nerve-train --replicas 2:
#             every rank stops at the same step, the job exits 143 within 10 s naming the
#             rank, and its checkpoint resumed under mpirun ends with one process's bits
#   inputs    each rank reads --data and --resume from its own directory (mpirun -wdir): the
#             same files train; shifted labels, another seed's checkpoint or one further on
#             on rank 1 are refused within 10 s, naming the file and rank 1
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

# pid_of_rank PROGRAM RANK: the process of PROGRAM whose environment says it is RANK (no
# procps needed); empty when there is none.
pid_of_rank() {
  local d
  for d in /proc/[0-9]*; do
    [ "$d/exe" -ef "$1" ] 2>/dev/null || continue
    grep -qz "^OMPI_COMM_WORLD_RANK=$2\$" "$d/environ" 2>/dev/null && { echo "${d#/proc/}"; return; }
  done
}

# whole FILE: the checkpoint is a complete safetensors file (written whole, then renamed).
whole() {
  python3 - "$1" <<'EOF'
import json, struct, sys
data = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + n])
end = max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__")
assert 8 + n + end == len(data), (8 + n + end, len(data))
print("checkpoint whole:", len(header) - 1, "tensors,", len(data), "bytes")
EOF
}

# term_round NAME VICTIM PROGRAM ARGS...: SIGTERM to rank VICTIM of a 2-rank job of PROGRAM
# ARGS (a run of a fixed number of steps), the other rank held (SIGSTOP) until the signal
# is in, so the stop lands mid-run however busy the machine is. Every rank stops at the
# same step: the job exits 143 within 10 s, rank 0 alone says which rank was signalled,
# the checkpoint is whole, and resumed under mpirun the run ends with one process's weights.
term_round() {
  local name=$1 victim=$2 prog=$3
  shift 3
  local other=$((1 - victim)) d="$dir/term-$victim-$(basename "$prog")"
  mkdir -p "$d"
  "$prog" "$@" --save "$d/one.st" >/dev/null 2>&1 || fail "$name: one process failed"
  : >"$d/metrics"
  "$mpiexec" --oversubscribe -np 2 "$prog" "$@" --metrics "$d/metrics" --checkpoint "$d/ckpt" >"$d/out" 2>&1 &
  local job=$!
  # Rank 0 writes the run line once both ranks are up: their processes are found before the
  # first step, so the signal follows step 1 closely.
  timeout 60 tail -n +1 -f "$d/metrics" | grep -m1 -q '"kind":"run"' || { kill "$job"; fail "$name: no run line within 60 s"; }
  local vp op
  vp=$(pid_of_rank "$prog" "$victim")
  op=$(pid_of_rank "$prog" "$other")
  [ -n "$vp" ] && [ -n "$op" ] || { kill "$job"; fail "$name: the ranks' processes not found"; }
  timeout 60 tail -n +1 -f "$d/metrics" | grep -m1 -q '"kind":"step","step":1,' ||
    { kill "$job"; fail "$name: no step 1 within 60 s"; }
  kill -STOP "$op"
  kill -TERM "$vp"
  kill -CONT "$op"
  local start rc ms
  start=$(date +%s%N)
  if ! timeout 30 tail --pid="$job" -f /dev/null; then
    grep -v '^$' "$d/out" | head -8
    kill -KILL "$vp" "$op" 2>/dev/null
    wait "$job"
    fail "$name: the job did not end within 30 s of SIGTERM to rank $victim"
  fi
  wait "$job"
  rc=$?
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  grep "interrupted by\|rank [01]" "$d/out"
  echo "$name: exit $rc after $ms ms"
  [ $rc -eq 143 ] || fail "$name: the job exited $rc, not 143"
  [ $ms -lt 10000 ] || fail "$name: the job took $ms ms to stop (limit 10 s)"
  grep -q "interrupted by SIGTERM to rank $victim after [0-9]* steps" "$d/out" ||
    fail "$name: rank 0 does not say the run stopped on SIGTERM to rank $victim"
  [ "$(grep -c 'interrupted by' "$d/out")" -eq 1 ] || fail "$name: more than rank 0 reported the stop"
  tail -1 "$d/metrics" | grep -q '"kind":"epoch".*"interrupted":true' ||
    fail "$name: the metrics do not end with the interrupted epoch"
  [ -f "$d/ckpt" ] || fail "$name: no checkpoint written at the stop"
  whole "$d/ckpt" || fail "$name: the checkpoint is not whole"
  run -np 2 "$prog" --resume "$d/ckpt" --save "$d/ranks.st" --quiet >"$d/resumed" 2>&1 ||
    { cat "$d/resumed"; fail "$name: the resumed job failed"; }
  cmp -s "$d/one.st" "$d/ranks.st" || fail "$name: stopped and resumed, the weights differ from one process's"
  echo "ok: $name: stopped together, resumed to one process's bits"
}

# idx PATH N LABEL_SHIFT: a Fashion-MNIST-shaped IDX pair of N random samples (seeded by
# N), its labels shifted by LABEL_SHIFT (mod 10): PATH-images-idx3-ubyte, PATH-labels-idx1-ubyte.
idx() {
  python3 - "$@" <<'EOF'
import random, struct, sys
path, n, shift = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(n)
with open(path + "-images-idx3-ubyte", "wb") as f:
    f.write(struct.pack(">IIII", 0x803, n, 28, 28) + bytes(rng.randrange(256) for _ in range(n * 784)))
with open(path + "-labels-idx1-ubyte", "wb") as f:
    f.write(struct.pack(">II", 0x801, n) + bytes((rng.randrange(10) + shift) % 10 for _ in range(n)))
EOF
}

# two_dirs PROGRAM ARGS...: a 2-rank job, rank 0 in $dir/a and rank 1 in $dir/b (each with
# its own files under the same names), its output in $dir/out.
two_dirs() {
  local prog=$1
  shift
  run -np 1 -wdir "$dir/a" "$prog" "$@" : -np 1 -wdir "$dir/b" "$prog" "$@" >"$dir/out" 2>&1
}

# refused NAME PROGRAM ARGS...: `two_dirs` must end within 10 s, non-zero, with an error
# that names rank 1.
refused() {
  local name=$1 start rc ms
  shift
  start=$(date +%s%N)
  two_dirs "$@"
  rc=$?
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  grep -v '^$' "$dir/out" | head -4
  [ $rc -ne 0 ] || fail "$name: the job exited 0"
  [ $ms -lt 10000 ] || fail "$name: it took $ms ms to refuse"
  grep -q "the ranks disagree on .*rank 1 has '" "$dir/out" || fail "$name: the error does not name rank 1"
}

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
  victim=$(pid_of_rank "$pipeline" 1)
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
  whole "$dir/ckpt" || fail "the checkpoint left behind is not whole"
  # SIGTERM to one rank: a stop the ranks agree on, not a job left waiting in a step.
  steps=(--model deep-mlp --steps 40 --batch 48 --no-eval --quiet)
  term_round "pipeline, SIGTERM to rank 1" 1 "$pipeline" "${steps[@]}" --stages 2 --microbatches 4
  term_round "pipeline, SIGTERM to rank 0" 0 "$pipeline" "${steps[@]}" --stages 2 --microbatches 4
  term_round "train --replicas 2, SIGTERM to rank 1" 1 "$train" "${steps[@]}" --replicas 2
  ;;
inputs)
  mkdir -p "$dir/a/data" "$dir/b/data"
  idx "$dir/a/data/train" 480 0
  idx "$dir/a/data/t10k" 100 0
  cp "$dir/a/data/"* "$dir/b/data/"
  tiny=(--model deep-mlp --batch 48 --quiet --data data)
  two_dirs "$pipeline" "${tiny[@]}" --steps 3 --stages 2 || { cat "$dir/out"; fail "the same data on both ranks did not train"; }
  echo "ok: the same data in each rank's directory trains"
  # Labels shifted by one on rank 1: every sample of the wrong class, trained on silently before.
  idx "$dir/b/data/train" 480 1
  for prog in "$pipeline" "$train"; do
    [ "$prog" = "$pipeline" ] && place=(--stages 2) || place=(--replicas 2)
    refused "$(basename "$prog"): shifted labels" "$prog" "${tiny[@]}" --steps 3 "${place[@]}"
    grep -q "disagree on the data file 'data/train-labels-idx1-ubyte'" "$dir/out" ||
      fail "$(basename "$prog"): the error does not name the labels file"
    echo "ok: $(basename "$prog"): shifted labels on rank 1 refused"
  done
  cp "$dir/a/data/"* "$dir/b/data/"
  # Checkpoints: rank 0's own (at step 12), another seed's, and one 8 steps further on.
  ckpt() {  # ckpt NAME ARGS...: a 2-rank run in $dir/a; its checkpoint goes to $dir/NAME
    run -np 2 -wdir "$dir/a" "$pipeline" "${tiny[@]}" --no-eval --stages 2 --checkpoint ck "${@:2}" >"$dir/out" 2>&1 ||
      { cat "$dir/out"; fail "the run making checkpoint $1 failed"; }
    mv "$dir/a/ck" "$dir/$1"
  }
  ckpt mine --epochs 3 --steps 12
  ckpt seed --epochs 3 --steps 12 --seed 1
  ckpt ahead --epochs 3 --steps 20
  cp "$dir/mine" "$dir/a/ck"
  cp "$dir/mine" "$dir/b/ck"
  two_dirs "$pipeline" --resume ck --quiet || { cat "$dir/out"; fail "the same checkpoint on both ranks did not resume"; }
  echo "ok: the same checkpoint in each rank's directory resumes"
  for other in seed ahead; do
    cp "$dir/mine" "$dir/a/ck"
    cp "$dir/$other" "$dir/b/ck"
    refused "a checkpoint of $other on rank 1" "$pipeline" --resume ck --quiet
    grep -q "disagree on the checkpoint --resume 'ck'" "$dir/out" || fail "$other: the error does not name the checkpoint"
    echo "ok: a checkpoint of $other on rank 1 refused"
  done
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
