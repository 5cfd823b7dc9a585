#!/usr/bin/env bash
# mpi_fault_test.sh MPIEXEC PROGRAM MODE: a job that loses rank 1 (MODE kill: SIGKILL;
# throw: an actor's exception; channel: a frame for a channel nothing listens to) must end
# on every rank within 10 s, exit non-zero, and
# say which rank was lost (and, for throw, the error itself).
set -u
mpiexec=$1 prog=$2 mode=$3
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
start=$(date +%s%N)
out=$(timeout 30 "$mpiexec" -np 2 --oversubscribe "$prog" "$mode" 2>&1)
rc=$?
ms=$(( ($(date +%s%N) - start) / 1000000 ))
echo "$out"
echo "exit $rc after $ms ms"
fail() { echo "FAIL: $*"; exit 1; }
[ $rc -ne 0 ] || fail "the job exited 0"
[ $rc -ne 124 ] || fail "the job hung (killed by timeout after 30 s)"
[ $ms -lt 10000 ] || fail "the job took $ms ms to end (limit 10 s)"
case $mode in
  kill) grep -q "rank 1 .*exited on signal 9" <<<"$out" || fail "the output does not name rank 1 and its signal" ;;
  throw) grep -q "rank 1: error: .*layer fc2 failed on micro-batch 100" <<<"$out" || fail "the output lacks rank 1's error" ;;
  channel) grep -q "rank 1: error: .*channel 424242, which nothing on rank 1 listens to" <<<"$out" ||
      fail "the output lacks rank 1's error naming the channel" ;;
esac
echo PASS
