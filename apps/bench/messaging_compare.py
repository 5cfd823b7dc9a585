#!/usr/bin/env python3
"""nerve's default placement against `packed` and CAF 0.17, workload by workload (issue 24).

For each workload: `nerve-bench messaging` with no placement flag (placement auto: the
runtime's default), the same with `--placement packed`, and `nerve-bench-caf messaging`,
back to back, 2 threads, medians of REPEATS; prints one line per workload with the ratios,
the moves the default made and the core round-trip probes; the heavy fan (--work-us 50)
also on one loop. Raw JSON goes to OUT.

    python3 apps/bench/messaging_compare.py [BUILD_DIR] [REPEATS] [OUT]
"""
import json
import subprocess
import sys

build = sys.argv[1] if len(sys.argv) > 1 else "build"
rep = sys.argv[2] if len(sys.argv) > 2 else "5"
out_path = sys.argv[3] if len(sys.argv) > 3 else "messaging_compare.json"
B = build + "/bin/"
jobs = [("pingpong", ["-w", "pingpong"]), ("oneway", ["-w", "oneway"]), ("payload", ["-w", "payload"]),
        ("chain/1", ["-w", "chain", "--inflight", "1"]), ("chain/64", ["-w", "chain", "--inflight", "64"]),
        ("fan/1", ["-w", "fan"]), ("fan/8", ["-w", "fan", "--inflight", "8"]), ("many", ["-w", "many"]),
        ("fan/1 work-us 50", ["-w", "fan", "--work-us", "50"])]


def run(binary, args, threads=2):
    p = subprocess.run([B + binary, "messaging", "-t", str(threads), "-r", rep, "--json", "-q"] + args,
                       capture_output=True, text=True, timeout=1800)
    if p.returncode:
        raise RuntimeError(f"{binary} {' '.join(args)}: {p.stderr[-300:]}")
    return json.loads(p.stdout)


out = {"loadavg_before": open("/proc/loadavg").read().split()[:3]}
print("load before", out["loadavg_before"], flush=True)
for name, args in jobs:
    r = {"auto": run("nerve-bench", args), "packed": run("nerve-bench", args + ["--placement", "packed"]),
         "caf": run("nerve-bench-caf", args)}
    if "work-us" in name:
        r["auto_one_loop"] = run("nerve-bench", args, threads=1)
    out[name] = r
    key = "median_seconds" if name == "many" else "median_per_s"
    a, p, c = r["auto"][key], r["packed"][key], r["caf"][key]
    rtt = [round(x) for k in ("auto", "packed", "caf") for x in r[k].get("core_round_trip_ns", [])]
    mig = r["auto"].get("extra", {}).get("migrations")
    if name == "many":
        print(f"{name}: auto {a:.3f} s, packed {p:.3f} s, caf {c:.3f} s; caf/auto {c / a:.2f}; "
              f"peak RSS {r['auto'].get('peak_rss_mib'):.1f} MiB; probe {rtt}", flush=True)
        continue
    line = f"{name}: auto {a:.4g}, packed {p:.4g}, caf {c:.4g}; auto/caf {a / c:.2f}, auto/packed {a / p:.2f}"
    if "auto_one_loop" in r:
        one = r["auto_one_loop"][key]
        line += f"; one loop {one:.4g}, two/one {a / one:.2f}"
    print(line + f"; moves {mig}; probe {rtt}", flush=True)
out["loadavg_after"] = open("/proc/loadavg").read().split()[:3]
print("load after", out["loadavg_after"], flush=True)
with open(out_path, "w") as f:
    json.dump(out, f, indent=1)
