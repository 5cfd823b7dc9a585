#!/usr/bin/env bash
# The nerve-trace curves page in a real browser: headless Chromium loads a page drawn
# from a metrics file of known content (a run killed at step 17, resumed from its
# checkpoint of step 15; one step's loss null; the last epoch without test figures) and
# the DOM it leaves is read back: the page reports ok, each series is one SVG path with
# as many points as the file has finite values for it, and the learning rate goes down
# the chart as the schedule does. Also takes a screenshot (kept next to the page).
#
#   curves_browser_test.sh NERVE_TRACE WORKDIR
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

# 3 epochs of 10 steps, cosine from 0.1 over 30 steps, as the trainer writes them.
awk 'function step(t, loss) {
       lr = 0.05 * (1 + cos(3.141592653589793 * t / 30))
       printf "{\"kind\":\"step\",\"step\":%d,\"epoch\":%d,\"batch\":%d,\"loss\":%s,\"accuracy\":%.4f,\"lr\":%.17g,\"samples\":64,\"seconds\":0.01,\"samples_per_s\":6400}\n", t, int(t / 10) + 1, t % 10 + 1, loss, 0.1 + t / 40, lr
     }
     function epoch(e, test_loss, test_acc) {
       printf "{\"kind\":\"epoch\",\"epoch\":%d,\"step\":%d,\"steps\":10,\"train_loss\":%.3f,\"train_accuracy\":%.3f,\"test_loss\":%s,\"test_accuracy\":%s,\"seconds\":0.1,\"samples_per_s\":6400,\"interrupted\":false}\n", e, 10 * e, 2 / e, 0.3 * e, test_loss, test_acc
     }
     BEGIN {
       print "{\"kind\":\"run\",\"format\":\"nerve-metrics-1\",\"settings\":{\"model\":\"mlp\",\"lr\":0.1,\"schedule\":\"cosine\"}}"
       for (t = 0; t < 17; t++) { step(t, 2.3 / (1 + t / 5)); if (t == 9) epoch(1, 1.9, 0.35) }
       print "{\"kind\":\"run\",\"format\":\"nerve-metrics-1\",\"resume\":{\"step\":15,\"epoch\":2},\"settings\":{\"model\":\"mlp\"}}"
       for (t = 15; t < 30; t++) {
         step(t, t == 22 ? "null" : 2.3 / (1 + t / 5))
         if (t == 19) epoch(2, 1.0, 0.6)
         if (t == 29) epoch(3, "null", "null")
       }
     }' > "$work/metrics.jsonl"

"$tool" curves "$work/metrics.jsonl" -o "$work/curves.html" --title "curves browser test" > "$work/curves.txt"
cat "$work/curves.txt"
grep -q "30 steps, 3 epochs, 2 run(s), 2 replayed records replaced" "$work/curves.txt" ||
  { echo "FAIL: nerve-trace curves did not count 30 steps, 3 epochs, 2 runs, 2 replaced"; exit 1; }

flags=(--headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking
       --disable-component-update --disable-sync --user-data-dir="$profile" --virtual-time-budget=5000 --window-size=1200,900)
timeout 60 "$browser" "${flags[@]}" --screenshot="$work/curves.png" --dump-dom "file://$work/curves.html" \
  > "$work/dom.html" 2> "$work/chromium.log" || {
  echo "FAIL: chromium exited with $? (log: $work/chromium.log)"; tail -5 "$work/chromium.log"; exit 1; }

status=$(sed -n 's/.*<pre id="nerve-status">\([^<]*\)<\/pre>.*/\1/p' "$work/dom.html")
echo "page status: $status"
fail=0
[ "$status" = "ok steps=30 epochs=3 runs=2 paths=7" ] ||
  { echo "FAIL: the page did not report 'ok steps=30 epochs=3 runs=2 paths=7' (script error or missing data)"; fail=1; }

# Each series: its path's d attribute, and how many points (M and L commands) it draws.
grep -o 'data-series="[^"]*" data-points="[0-9]*" d="[^"]*"' "$work/dom.html" > "$work/paths.txt" || true
points() { grep "data-series=\"$1\"" "$work/paths.txt" | sed 's/.* d="\([^"]*\)"/\1/' | tr -cd 'ML' | wc -c; }
segments() { grep "data-series=\"$1\"" "$work/paths.txt" | sed 's/.* d="\([^"]*\)"/\1/' | tr -cd 'M' | wc -c; }
[ "$(wc -l < "$work/paths.txt")" = 7 ] || { echo "FAIL: $(wc -l < "$work/paths.txt") series paths, want 7"; fail=1; }
# 30 steps, one loss null (so two pieces); 3 epochs, the last one with no test figures.
for want in loss.train_step:29 accuracy.train_step:30 lr:30 loss.train_epoch:3 accuracy.train_epoch:3 \
            loss.test_epoch:2 accuracy.test_epoch:2; do
  series=${want%%:*} n=${want##*:}
  got=$(points "$series")
  [ "$got" = "$n" ] || { echo "FAIL: series $series draws $got points, want $n"; fail=1; }
done
[ "$(segments loss.train_step)" = 2 ] || { echo "FAIL: the null loss does not break the line in two"; fail=1; }
# The schedule decays, so the learning rate's points go down the chart (SVG y grows downward)
# from the top of the plot to its bottom.
grep 'data-series="lr"' "$work/paths.txt" | sed 's/.* d="\([^"]*\)"/\1/' | tr 'ML' '\n\n' | awk 'NF == 2 {
    if (n++ && $2 < last) { print "FAIL: lr rises at point " n; bad = 1 }
    if (n == 1) first = $2; last = $2 }
  END { if (!(last - first > 150)) { print "FAIL: lr spans " last - first " px, want most of the plot"; bad = 1 } exit bad }' ||
  fail=1
grep -q '>resumed</text>' "$work/dom.html" || { echo "FAIL: the resume is not marked"; fail=1; }
if [ ! -s "$work/curves.png" ]; then echo "FAIL: no screenshot"; fail=1; fi

# A learning-rate range test (nerve-train --lr-find): 8 steps at rates 1e-4 .. 1e-1, the
# last diverged. Its own panel draws each loss at its rate, left to right as the rates rise.
awk 'BEGIN {
       print "{\"kind\":\"run\",\"format\":\"nerve-metrics-1\",\"lr_find\":{\"min_lr\":0.0001,\"max_lr\":0.1,\"steps\":8},\"settings\":{\"model\":\"mlp\"}}"
       for (t = 0; t < 8; t++)
         printf "{\"kind\":\"step\",\"step\":%d,\"epoch\":1,\"batch\":%d,\"loss\":%.3f,\"accuracy\":0.1,\"lr\":%.17g,\"samples\":64,\"seconds\":0.01,\"samples_per_s\":6400}\n", t, t + 1, t < 7 ? 2.3 - 0.2 * t : 9.5, 0.0001 * 1000 ^ (t / 7)
     }' > "$work/lr.jsonl"
"$tool" curves "$work/lr.jsonl" -o "$work/lr.html" > /dev/null
timeout 60 "$browser" "${flags[@]}" --dump-dom "file://$work/lr.html" > "$work/lr-dom.html" 2>> "$work/chromium.log" ||
  { echo "FAIL: chromium exited with $? on the range test's page"; exit 1; }
lr_status=$(sed -n 's/.*<pre id="nerve-status">\([^<]*\)<\/pre>.*/\1/p' "$work/lr-dom.html")
[ "$lr_status" = "ok steps=8 epochs=0 runs=1 paths=8" ] ||
  { echo "FAIL: the range test's page reports '$lr_status', want 'ok steps=8 epochs=0 runs=1 paths=8'"; fail=1; }
grep -o 'data-series="loss.lr" data-points="[0-9]*" d="[^"]*"' "$work/lr-dom.html" | sed 's/.* d="\([^"]*\)"/\1/' |
  tr 'ML' '\n\n' | awk 'NF == 2 { if (n++ && $1 <= last) { print "FAIL: the rates do not go right at point " n; bad = 1 } last = $1 }
    END { if (n != 8) { print "FAIL: the loss against rate draws " n " points, want 8"; bad = 1 } exit bad }' || fail=1
grep -q 'learning rate (log scale)' "$work/lr-dom.html" || { echo "FAIL: no log-rate axis"; fail=1; }

[ $fail = 0 ] && echo "PASS: 7 series with the file's points; the range test's loss against rate; screenshot $work/curves.png"
exit $fail
