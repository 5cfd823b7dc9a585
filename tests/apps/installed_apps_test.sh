#!/usr/bin/env bash
# `cmake --install` of this build into a scratch prefix, then the installed programs run
# from there as a user of the package runs them: each one's --help, and nerve-trace's
# pages (compiled into it) drawn from a trace it writes. scripts/example does the same
# for a shared-library install, from a project built against the prefix.
#
#   installed_apps_test.sh BUILD_DIR PREFIX
# Exit: 0 pass, 1 fail.
set -uo pipefail
build=$1 prefix=$2
rm -rf "$prefix"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
out=$(timeout 120 cmake --install "$build" --prefix "$prefix" 2>&1) || { echo "$out"; echo "FAIL: cmake --install"; exit 1; }
for app in nerve-train nerve-pipeline nerve-generate nerve-trace; do
  bin=$prefix/bin/$app
  [ -x "$bin" ] || { fail "$app is not installed in $prefix/bin"; continue; }
  help=$(cd "$prefix" && timeout 10 "$bin" --help 2>&1) || fail "$bin --help: status $?: $(head -c 300 <<<"$help")"
  grep -q "$app" <<<"$help" || fail "$bin --help does not name $app: $(head -c 300 <<<"$help")"
done
[ -f "$prefix/lib/cmake/nerve/nerveApps.cmake" ] || fail "nerveApps.cmake (the programs' imported targets) is not installed"
# The viewer's pages come with the program, not from the build tree.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
trace=$prefix/bin/nerve-trace
if [ -x "$trace" ]; then
  (cd "$work" && timeout 30 "$trace" synth -o t.json --steps 2 >/dev/null) || fail "nerve-trace synth from the prefix"
  (cd "$work" && timeout 30 "$trace" html t.json -o t.html >/dev/null) || fail "nerve-trace html from the prefix"
  grep -qi '<html' "$work/t.html" 2>/dev/null || fail "nerve-trace html from the prefix wrote no page"
fi
[ $failures = 0 ] && echo "installed apps: all ran from $prefix"
[ $failures = 0 ]
