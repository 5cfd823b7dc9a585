#!/usr/bin/env bash
# The nerve-trace page in a real browser: headless Chromium loads a generated page and
# the page reports, in an element it writes after drawing, whether any script failed and
# which lanes have pixels on them. Also takes a screenshot (kept next to the page).
#
#   browser_test.sh NERVE_TRACE WORKDIR
# Exit: 0 pass, 1 fail, 77 skipped because no Chromium is installed.
set -euo pipefail
tool=$1
work=$2
browser=""
for b in chromium chromium-browser google-chrome; do
  if command -v "$b" >/dev/null 2>&1; then browser=$(command -v "$b"); break; fi
done
if [ -z "$browser" ]; then
  echo "SKIP: no chromium on PATH (scripts/deps installs it)"
  exit 77
fi

rm -rf "$work"
mkdir -p "$work"
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT

"$tool" synth --stages 3 --microbatches 4 --actors-per-stage 2 --steps 2 --jitter 0.2 -o "$work/synth.json" >/dev/null
"$tool" html "$work/synth.json" -o "$work/page.html" --title "browser test" > "$work/html.txt"
cat "$work/html.txt"
lanes=$(sed -n 's/.*: \([0-9]*\) lanes.*/\1/p' "$work/html.txt")

flags=(--headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking
       --disable-component-update --disable-sync --user-data-dir="$profile" --virtual-time-budget=5000 --window-size=1400,900)
# One launch: the DOM after the page ran (with its status element) and a screenshot.
timeout 60 "$browser" "${flags[@]}" --screenshot="$work/page.png" --dump-dom "file://$work/page.html" \
  > "$work/dom.html" 2> "$work/chromium.log" || {
  echo "FAIL: chromium exited with $? (log: $work/chromium.log)"; tail -5 "$work/chromium.log"; exit 1; }

status=$(sed -n 's/.*<pre id="nerve-status">\([^<]*\)<\/pre>.*/\1/p' "$work/dom.html")
echo "page status: $status"
fail=0
case "$status" in
  ok\ *) ;;
  *) echo "FAIL: the page did not report ok (script error or no drawing): '$status'"; fail=1 ;;
esac
field() { echo "$status" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
[ "$(field lanes)" = "$lanes" ] || { echo "FAIL: page has $(field lanes) lanes, nerve-trace wrote $lanes"; fail=1; }
[ "$(field visible)" = "$lanes" ] || { echo "FAIL: only $(field visible) of $lanes lanes fit the window"; fail=1; }
[ "$(field painted)" = "$lanes" ] || { echo "FAIL: only $(field painted) of $lanes lanes have pixels drawn"; fail=1; }
[ "$(field critical)" -gt 0 ] || { echo "FAIL: no critical path on the page"; fail=1; }
for lane in "outside" "data" "stage 0" "stage 2" "s0.fc0" "s2.fc1" "s1.fc0 · mailbox" "stage 1 · credits"; do
  grep -q "^$lane\$" <(sed -n '/<pre id="nerve-lanes">/,/<\/pre>/p' "$work/dom.html" | sed 's/<[^>]*>//g') ||
    { echo "FAIL: lane '$lane' missing"; fail=1; }
done
if [ ! -s "$work/page.png" ]; then echo "FAIL: no screenshot"; fail=1; fi
[ $fail = 0 ] && echo "PASS: $lanes lanes drawn; screenshot $work/page.png"
exit $fail
