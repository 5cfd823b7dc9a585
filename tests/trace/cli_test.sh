#!/usr/bin/env bash
# nerve-trace on inputs and options it must refuse: each case checks the exit status
# and that the one-line message names the problem (the file and event, or the option
# and its range). A crash (abort, segfault) shows as a status above 128 and fails.
#
#   cli_test.sh NERVE_TRACE WORKDIR
# Exit: 0 pass, 1 fail.
set -uo pipefail
tool=$1
work=$2
rm -rf "$work"
mkdir -p "$work"
cd "$work"
# No case may write more than a few MB; a limit that lets a file grow without bound is a bug.
ulimit -f 65536

failures=0
# expect STATUS TEXT -- COMMAND...: runs COMMAND, wants exit STATUS and TEXT in its stderr.
expect() {
  local want=$1 text=$2
  shift 3
  local got=0
  "$@" >out.txt 2>err.txt || got=$?
  if [ "$got" != "$want" ] || ! grep -qF -- "$text" err.txt; then
    echo "FAIL: $* -> status $got (want $want), stderr:"
    head -c 600 err.txt
    echo
    echo "  (wanted to see: $text)"
    failures=$((failures + 1))
  fi
  # Usage errors and refusals are one short line (plus CLI11's hint), not a dump.
  if [ "$(head -c 2000 err.txt | awk 'length > 400' | wc -l)" != 0 ]; then
    echo "FAIL: $* printed a line over 400 characters"
    failures=$((failures + 1))
  fi
}

# --- files the reader refuses
printf '{"traceEvents":[{"name":"a","ph":"X","pid":0,"tid":0,"ts":1e400,"dur":1}]}' >inf.json
expect 1 'inf.json: event 0: error: "ts": a number too large for a double' -- "$tool" validate inf.json
expect 1 'inf.json: event 0: error: "ts": a number too large for a double' -- "$tool" summary inf.json

{
  printf '{"traceEvents":[{"name":"a","ph":"X","pid":0,"tid":0,"ts":1'
  head -c 1000000 /dev/zero | tr '\0' '0'
  printf ',"dur":1}]}'
} >digits.json
expect 1 'digits.json: event 0: error: "ts": a number too large for a double' -- "$tool" validate digits.json

{
  printf '{"traceEvents":[{"name":"a","ph":"X","pid":0,"tid":0,"ts":1,"dur":1,"args":{"x":'
  head -c 100000 /dev/zero | tr '\0' '['
  head -c 100000 /dev/zero | tr '\0' ']'
  printf '}}]}'
} >deep.json
expect 1 'deep.json: event 0: error: JSON nested deeper than 256 levels' -- "$tool" summary deep.json
expect 1 'deep.json: event 0: error: JSON nested deeper than 256 levels' -- "$tool" html deep.json -o deep.html

mkdir -p adir
expect 1 'adir: error: cannot read it: it is a directory' -- "$tool" validate adir
expect 1 'missing.json: error: cannot open the file: no such file' -- "$tool" summary missing.json
if [ -e /proc/self/mem ]; then  # its read fails with EIO, whoever runs the test
  expect 1 '/proc/self/mem: error: cannot read the file' -- "$tool" validate /proc/self/mem
fi

printf '{"traceEvents":[{"name":"a","ph":"X","pid":0,"tid":1,"ts":1e308,"dur":1}]}' >huge.json
expect 1 'huge.json: event 0: error: ph "X" name "a": "ts" 1e+308 is out of range: times must lie from 0 to 4e+15' -- "$tool" summary huge.json
printf '{"traceEvents":[{"name":"a","ph":"X","pid":0,"tid":1,"ts":-5,"dur":1}]}' >negative.json
expect 1 'negative.json: event 0: error: ph "X" name "a": "ts" -5 is out of range' -- "$tool" validate negative.json
printf '{"traceEvents":[{"name":"a","ph":"X","pid":0,"tid":1,"ts":5,"dur":1e308}]}' >long.json
expect 1 'long.json: event 0: error: ph "X" name "a": "dur" 1e+308 ends the event after 4e+15' -- "$tool" summary long.json

# --- metrics files (nerve-trace curves): every bad line named by its number, no page written
printf '{"kind":"run"}\n{"kind":"step","step":0,"epoch":1,"loss":1,"accuracy":0.5,"lr":0.1}\n{"kind":"step","step":1,]\n' >cut.jsonl
expect 1 'cut.jsonl: line 3: error: not a JSON object: syntax error' -- "$tool" curves cut.jsonl -o cut.html
expect 1 'cut.jsonl has errors (see above); no page written' -- "$tool" curves cut.jsonl -o cut.html
[ -e cut.html ] && { echo "FAIL: curves wrote a page for a file with errors"; failures=$((failures + 1)); }
# A torn line (a full disk cut it short, and a writer that went on appended its
# run line to it; the last line cut short too) is a warning: the rest is drawn.
{
  printf '{"kind":"run"}\n{"kind":"step","step":0,"epoch":1,"loss":1,"accuracy":0.5,"lr":0.1}\n'
  printf '{"kind":"step","step":1,"ep{"kind":"run","resume":{"step":1,"epoch":1}}\n'
  printf '{"kind":"step","step":1,"epoch":1,"loss":0.5,"accuracy":0.5,"lr":0.1}\n{"kind":"step","step":2,"epoch":1,"lo'
} >torn.jsonl
expect 0 'torn.jsonl: line 3: warning: a torn line: its first 27 bytes were cut short' -- "$tool" curves torn.jsonl -o torn.html
expect 0 'torn.jsonl: line 5: warning: a torn line of 37 bytes' -- "$tool" curves torn.jsonl -o torn.html
grep -qF '2 steps, 0 epochs, 2 run(s)' out.txt || { echo "FAIL: curves of torn.jsonl: $(cat out.txt)"; failures=$((failures + 1)); }
printf '{"kind":"step","step":0,"epoch":1,"loss":1e400,"accuracy":0.5,"lr":0.1}\n' >big.jsonl
expect 1 'big.jsonl: line 1: error: a number too large for a double' -- "$tool" curves big.jsonl -o big.html
printf '{"kind":"step","step":0,"epoch":1,"loss":1,"accuracy":2,"lr":0.1}\n' >acc.jsonl
expect 1 'acc.jsonl: line 1: error: "accuracy": 2 is not a number from 0 to 1 (or null)' -- "$tool" curves acc.jsonl -o acc.html
printf '{"kind":"run"}\n' >started.jsonl
expect 1 'started.jsonl: no step or epoch lines, nothing to draw yet' -- "$tool" curves started.jsonl -o started.html
expect 1 'adir: error: cannot read it: it is a directory, not a metrics file' -- "$tool" curves adir -o adir.html
expect 1 'missing.jsonl: error: cannot open the file: no such file' -- "$tool" curves missing.jsonl -o missing.html
expect 2 '--output is required' -- "$tool" curves cut.jsonl

# --- options: each numeric option refuses what is not finite or out of its range
"$tool" synth -o ok.json --stages 2 --microbatches 2 >/dev/null || { echo "FAIL: synth of a small trace"; failures=$((failures + 1)); }
expect 2 "--window wants A:B in µs, two finite numbers with 0 <= A < B <= 4e+15, got '5:1'" -- "$tool" summary --window 5:1 ok.json
expect 2 "got 'nan:inf'" -- "$tool" summary --window nan:inf ok.json
expect 2 "got '3:3'" -- "$tool" summary --window 3:3 ok.json
expect 2 "got '1:5x'" -- "$tool" summary --window 1:5x ok.json
expect 2 "--top: '-1' is not a whole number from 0 to 1000000" -- "$tool" summary --top -1 ok.json
expect 2 "--step: '-3' is not a whole number from 0 to 2^31-1" -- "$tool" summary --step -3 ok.json
expect 2 "--step: '1.5' is not a whole number" -- "$tool" html --step 1.5 ok.json -o ok.html
for opt in --forward-us --backward-us --load-us --optimizer-us; do
  for bad in nan inf -1 1e308 1e7x; do
    expect 2 "$opt: '$bad' is not a finite number from 0 to 10000000 µs" -- "$tool" synth -o bad.json "$opt" "$bad"
  done
done
expect 2 "--jitter: 'nan' is not a finite number from 0 to 0.99" -- "$tool" synth -o bad.json --jitter nan
expect 2 "--jitter: '1' is not a finite number from 0 to 0.99" -- "$tool" synth -o bad.json --jitter 1
expect 2 "--stages: '0' is not a whole number from 1 to 1024" -- "$tool" synth -o bad.json --stages 0
expect 2 "--microbatches: '4097' is not a whole number from 1 to 4096" -- "$tool" synth -o bad.json --microbatches 4097
expect 2 "--actors-per-stage: '-2' is not a whole number from 1 to 64" -- "$tool" synth -o bad.json --actors-per-stage -2
expect 2 "--steps: '0' is not a whole number from 1 to 100000" -- "$tool" synth -o bad.json --steps 0
expect 2 "--events: '-1' is not a whole number from 0 to 10000000" -- "$tool" synth -o bad.json --events -1
expect 2 "--seed: '-1' is not a whole number from 0 to 2^64-1" -- "$tool" synth -o bad.json --seed -1
expect 2 "synth: the run would write" -- "$tool" synth -o bad.json --steps 100000
[ -e bad.json ] && { echo "FAIL: a refused synth wrote bad.json"; failures=$((failures + 1)); }

# The largest times synth accepts still make a trace its own validate accepts.
if ! "$tool" synth -o slow.json --stages 2 --microbatches 2 --actors-per-stage 1 --forward-us 1e7 --backward-us 1e7 \
     --load-us 1e7 --optimizer-us 1e7 --jitter 0.99 >/dev/null ||
   ! "$tool" validate --strict slow.json >/dev/null; then
  echo "FAIL: synth at its limits does not write a valid trace"
  failures=$((failures + 1))
fi

if [ $failures != 0 ]; then
  echo "cli_test: $failures failure(s)"
  exit 1
fi
echo "cli_test: all cases passed"
