#!/usr/bin/env bash
# The scripts a user runs first: each answers --help with the comment at its top (its
# first line names the script) and touches nothing; demo, example, api-docs, deps and
# fuzz refuse an argument they do not take, before they install or build anything;
# check-sizes holds trees to the size rule (at most two big files, each saying why).
#
#   scripts_test.sh SOURCE_DIR
# Exit: 0 pass, 1 fail.
set -uo pipefail
cd "$1"
err=$(mktemp)
trap 'rm -f "$err"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
for s in demo test example fuzz api-docs build deps mpi-hosts check-sizes; do
  out=$(timeout 5 scripts/$s --help 2>&1)
  status=$?
  [ $status = 0 ] || fail "scripts/$s --help: status $status"
  [[ "$out" == "scripts/$s"* ]] || fail "scripts/$s --help does not start with its name: $(head -c 200 <<<"$out")"
  grep -q '^#' <<<"$out" && fail "scripts/$s --help printed comment markers"
done
# expect TEXT -- COMMAND...: status 2 and TEXT on stderr, nothing built or installed.
expect() {
  local text=$1
  shift 2
  local status=0
  "$@" >/dev/null 2>"$err" || status=$?
  [ $status = 2 ] && grep -qF -- "$text" "$err" || fail "$* -> status $status, stderr: $(head -c 300 "$err")"
}
expect "scripts/demo: unknown argument 'now'" -- scripts/demo now
expect "scripts/example: unknown argument '--fast'" -- scripts/example --fast
expect "scripts/api-docs: unknown argument 'x'" -- scripts/api-docs x
expect "scripts/deps: unknown argument '--all'" -- scripts/deps --all
expect "scripts/test: unknown option '--ful'" -- scripts/test --ful
expect "scripts/fuzz: SECONDS must be a whole number from 1 to 9999999 (got '0')" -- scripts/fuzz 0
expect "scripts/fuzz: unknown target 'json'" -- scripts/fuzz 5 idx json
expect "scripts/check-sizes: one DIR at most" -- scripts/check-sizes a b

# check-sizes on small trees: TREE EXPECTED-STATUS TEXT, TEXT in its output.
tree=$(mktemp -d)
trap 'rm -f "$err"; rm -rf "$tree"' EXIT
git -C "$tree" init -q
lines() { seq "$1" | sed 's/^/int x/'; }  # N lines of code
sizes() {
  local want=$1 text=$2 out status=0
  out=$(timeout 10 scripts/check-sizes "$tree" 2>&1) || status=$?
  [ $status = "$want" ] && grep -qF -- "$text" <<<"$out" || fail "check-sizes: want status $want and '$text', got $status: $(head -c 400 <<<"$out")"
}
mkdir -p "$tree/a" "$tree/tests" "$tree/apps/bench"
lines 600 >"$tree/a/small.cpp"
lines 900 >"$tree/tests/big_test.cpp"
lines 900 >"$tree/apps/bench/big.cpp"
lines 700 >"$tree/a/notes.txt"
sizes 0 "the rule holds"
{ echo "// One file: the reason."; lines 700; } >"$tree/a/one.cpp"
{ echo "#pragma once"; echo "/// One file: the reason."; lines 700; } >"$tree/a/two.hpp"
sizes 0 "701 a/one.cpp"
lines 601 >"$tree/a/three.cu"
sizes 1 "3 source files over 600 lines; at most 2"
rm "$tree/a/three.cu"
{ lines 30; echo "// One file: too far down."; lines 600; } >"$tree/a/one.cpp"
sizes 1 "a/one.cpp: no '// One file:' line in its first 20 lines"
[ $failures = 0 ] && echo "scripts: all passed"
exit $((failures > 0))
