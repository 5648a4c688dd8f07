"""More room and fewer bubbles (issue 19): measured step time and peak memory of the planner's best
plan for the transformer example on 4 ranks under a memory limit, without and with each new
option (ZeRO-1: zero=auto, interleaved 1F1B: virtual_stages=auto, both), side by side in one run,
next to the planner's predictions; then forced interleaving (v=2) and forced ZeRO-1, whichever the
planner did not pick; then the simulator's view of the same options for GPT/BERT shapes on 32 to
1024 devices (`autostage plan --json`). Prints figures; never passes or fails.

    /usr/bin/python3 bench/schedules/schedules.py [--steps 8] [--mem-limit-gb 0.03] [--skip-run]
        [--skip-sim] [--json]

Each configuration runs bench/memory_accuracy/run_plan.py (the transformer, model returning its
loss, train_step) under mpirun on 4 ranks (OMP_NUM_THREADS=1, oversubscribed on this 2-core
machine, so measured times carry the oversubscription's noise: read ratios of medians).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench", "memory_accuracy"))
import memory_accuracy  # noqa: E402  (run(): one configuration under mpirun)

CLI = os.path.join(ROOT, "build", "bindings", "cli", "autostage")

# name, options added to the common ones
CONFIGS = [
    ("baseline (zero=0, v=1)", "zero=0 virtual_stages=1"),
    ("+ ZeRO-1 (zero=auto)", "zero=auto virtual_stages=1"),
    ("+ interleaving (v=auto)", "zero=0 virtual_stages=auto"),
    ("+ both (auto, auto)", "zero=auto virtual_stages=auto"),
    ("forced v=2", "zero=0 virtual_stages=2"),
    ("forced zero=1", "zero=1 virtual_stages=1"),
]

SHAPES = [("gpt", "gpt:layers=48,hidden=1600,heads=25,seq=1024", [32, 128, 1024], "40GiB"),
          ("bert", "bert:layers=96,hidden=2048,heads=32,seq=512", [32, 128, 1024], "40GiB")]


def plan_text(records):
    r = records[0]
    zero = "z" if any(r.get("zero", [])) else ""
    return (f"{r['stages']}st x{'/'.join(map(str, r['replicas']))} m{r['micro_batches']} "
            f"{r['schedule']} v{r['virtual_stages']}{' ' + zero if zero else ''}")


def measure(options, steps):
    records = memory_accuracy.run("transformer", 4, options + f" --steps {steps}")
    peak = max((r["memory"]["measured"] for r in records if r["memory"]), default=0)
    predicted = max((r["memory"]["predicted"] for r in records if r["memory"]), default=0)
    return {"plan": plan_text(records), "measured_ms": statistics.median(
        r["measured_seconds"] for r in records) * 1e3,
        "predicted_ms": records[0]["predicted_seconds"] * 1e3,
        "peak_mib": peak / 2**20, "predicted_mib": predicted / 2**20}


def simulate(spec, devices, memory, zero, virtual):
    env = dict(os.environ, AUTOSTAGE_ZERO=zero, AUTOSTAGE_LOG_LEVEL="warn")
    cmd = [CLI, "plan", "--synthetic", spec, "--devices", str(devices), "--devices-per-node", "8",
           "--device-memory", memory, "--batch", str(max(256, 2 * devices)),
           "--virtual-stages", virtual, "--json"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        return {"error": (done.stdout + done.stderr).strip().splitlines()[-1][:100]}
    plan = json.loads(done.stdout)
    return {"ms": plan["simulated_iteration_ms"], "stages": plan["stages"],
            "v": plan["virtual_stages"], "micro": plan["micro_batches"],
            "peak_gib": plan["peak_memory_bytes"] / 2**30, "plan_s": plan["plan_seconds"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--mem-limit-gb", type=float, default=0.03)
    parser.add_argument("--skip-run", action="store_true", help="only the simulator's view")
    parser.add_argument("--skip-sim", action="store_true", help="only the measured runs")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    everything = {"measured": [], "simulated": []}
    if not args.skip_run:
        common = (f"schedule=1f1b mem_limit_gb={args.mem_limit_gb} max_pipeline=8 comm_latency=0 "
                  "comm_bandwidth=1e11 allreduce_bandwidth=1e11")
        print(f"transformer example, 4 ranks, train_step, {common}")
        print(f"{'option':<26}{'plan':<34}{'pred ms':>9}{'meas ms':>9}{'x base':>8}"
              f"{'pred MiB':>10}{'meas MiB':>10}")
        base = None
        for name, options in CONFIGS:
            try:
                r = measure(common + " " + options, args.steps)
            except RuntimeError as e:
                print(f"{name:<26}failed: {str(e).splitlines()[-1][:90]}", flush=True)
                continue
            base = base or r["measured_ms"]
            everything["measured"].append(dict(r, option=name))
            print(f"{name:<26}{r['plan']:<34}{r['predicted_ms']:>9.1f}{r['measured_ms']:>9.1f}"
                  f"{r['measured_ms'] / base:>8.2f}{r['predicted_mib']:>10.2f}"
                  f"{r['peak_mib']:>10.2f}", flush=True)
    if not args.skip_sim:
        print("\nsimulator (autostage plan --json), fp16 synthetic shapes, 8 devices per node")
        print(f"{'model':<6}{'devices':>8}  {'zero=0 v=1':<26}{'zero=auto v=1':<26}"
              f"{'zero=0 v=auto':<26}{'auto, auto':<26}")
        for name, spec, counts, memory in SHAPES:
            for devices in counts:
                cells, row = [], {}
                for zero, virtual in (("0", "1"), ("auto", "1"), ("0", "auto"), ("auto", "auto")):
                    s = simulate(spec, devices, memory, zero, virtual)
                    row[f"zero={zero} v={virtual}"] = s
                    cells.append(s["error"][:24] if "error" in s else
                                 f"{s['ms']:.0f}ms {s['stages']}st v{s['v']} m{s['micro']}")
                everything["simulated"].append({"model": name, "devices": devices, **row})
                print(f"{name:<6}{devices:>8}  " + "".join(f"{c:<26}" for c in cells), flush=True)
    if args.json:
        print(json.dumps(everything))


if __name__ == "__main__":
    main()
