#!/usr/bin/env bash
# The scripts a user runs first: each answers --help with the comment at its top (its
# first line names the script) and touches nothing; demo, example, api-docs, deps and
# fuzz refuse an argument they do not take, before they install or build anything.
#
#   scripts_test.sh SOURCE_DIR
# Exit: 0 pass, 1 fail.
set -uo pipefail
cd "$1"
err=$(mktemp)
trap 'rm -f "$err"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
for s in demo test example fuzz api-docs build deps mpi-hosts; do
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
[ $failures = 0 ] && echo "scripts: all passed"
exit $((failures > 0))
