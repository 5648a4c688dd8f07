"""Predicted vs measured peak memory per rank (and with --time, step time) of the tutorial, the
transformer example and torchvision resnet18 under forced plans: 1-4 stages, 1-8 micro-batches,
gpipe and 1F1B, recompute on/off, fp32 and bf16, ZeRO-1, interleaving, tensor-parallel stages,
on 1-4 ranks. Prints figures; never passes or
fails (issue 15's target: every measured peak within +-15% of its prediction and never above the
usable memory the plan was made for).

    /usr/bin/python3 bench/memory_accuracy/memory_accuracy.py [--time] [--only MODEL]
        [--match OPTION] [--json]

Each configuration runs bench/memory_accuracy/run_plan.py under mpirun (OMP_NUM_THREADS=1,
oversubscribed). gpipe plans train through forward()/backward(), 1F1B plans through train_step
(the loss inside the model): the plan is made for the call that runs it (Note [Plan usage]).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
BUILD_PYTHON = os.path.join(ROOT, "build", "python")

# model, ranks, options (gpipe runs forward/backward, 1f1b train_step)
CONFIGS = [
    ("tutorial", 1, "partition_num=1 pipeline_num=1 schedule=gpipe recompute=never"),
    ("tutorial", 2, "partition_num=2 pipeline_num=2 schedule=gpipe recompute=never"),
    ("tutorial", 2, "partition_num=2 pipeline_num=8 schedule=1f1b recompute=never"),
    ("tutorial", 2, "partition_num=2 pipeline_num=4 schedule=gpipe recompute=always"),
    ("tutorial", 4, "partition_num=4 pipeline_num=4 schedule=1f1b recompute=never"),
    ("tutorial", 4, "partition_num=2 pipeline_num=2 schedule=gpipe recompute=never"),
    ("tutorial", 2, "partition_num=2 pipeline_num=2 schedule=gpipe recompute=never precision=bf16"),
    ("tutorial", 4, "mem_limit_gb=0.02"),  # the demo's: the planner's own choice under a limit
    ("transformer", 1, "partition_num=1 pipeline_num=1 schedule=gpipe recompute=never"),
    ("transformer", 2, "partition_num=2 pipeline_num=4 schedule=gpipe recompute=never"),
    ("transformer", 2, "partition_num=2 pipeline_num=4 schedule=1f1b recompute=always"),
    ("transformer", 4, "partition_num=4 pipeline_num=8 schedule=1f1b recompute=never"),
    ("transformer", 2, "partition_num=2 pipeline_num=2 schedule=gpipe recompute=never precision=bf16"),
    ("resnet18", 1, "partition_num=1 pipeline_num=1 schedule=gpipe recompute=never"),
    ("resnet18", 2, "partition_num=2 pipeline_num=2 schedule=gpipe recompute=never"),
    ("resnet18", 2, "partition_num=2 pipeline_num=4 schedule=gpipe recompute=always"),
    ("resnet18", 4, "partition_num=4 pipeline_num=4 schedule=1f1b recompute=never"),
    # Issue 19: interleaved 1F1B (2 positions x 2 virtual stages) and ZeRO-1 (2 replicas/stage).
    ("transformer", 4, "partition_num=4 pipeline_num=4 schedule=1f1b recompute=never "
                       "virtual_stages=2"),
    ("transformer", 4, "partition_num=2 pipeline_num=4 schedule=1f1b recompute=never zero=1 "
                       "virtual_stages=1"),
    # Issue 30: tensor-parallel stages (attention and MLP split over 2 ranks), alone, in 2
    # stages, with 2 replicas and ZeRO-1, recomputed.
    ("transformer", 2, "partition_num=1 pipeline_num=1 schedule=gpipe recompute=never "
                       "tensor_parallel=2"),
    ("transformer", 4, "partition_num=2 pipeline_num=4 schedule=gpipe recompute=never "
                       "tensor_parallel=2"),
    ("transformer", 4, "partition_num=1 pipeline_num=2 schedule=gpipe recompute=never "
                       "tensor_parallel=2 zero=1 decomposer=data_parallel"),
    ("transformer", 2, "partition_num=1 pipeline_num=2 schedule=1f1b recompute=always "
                       "tensor_parallel=2"),
    # Multi-query attention at tp=2 and 4: K and V whole on every rank, Q's heads split.
    ("transformer_gqa", 2, "partition_num=1 pipeline_num=1 schedule=gpipe recompute=never "
                           "tensor_parallel=2"),
    ("transformer_gqa", 4, "partition_num=1 pipeline_num=2 schedule=gpipe recompute=never "
                           "tensor_parallel=4"),
    # The same from one fused projection (Phi-3's layout): K's and V's rows whole on each rank.
    ("transformer_gqa_fused", 2, "partition_num=1 pipeline_num=1 schedule=gpipe "
                                 "recompute=never tensor_parallel=2"),
    ("transformer_gqa_fused", 4, "partition_num=1 pipeline_num=2 schedule=gpipe "
                                 "recompute=never tensor_parallel=4"),
    # The untied LM head and the loss split over a 16,384-token vocabulary (train_step: the
    # loss is in the model), the embedding's rows too; and the head tied to the embedding.
    ("transformer_vocab", 2, "partition_num=1 pipeline_num=2 schedule=1f1b recompute=never "
                             "tensor_parallel=2"),
    ("transformer_vocab_tied", 2, "partition_num=1 pipeline_num=2 schedule=1f1b recompute=never "
                                  "tensor_parallel=2"),
    # The tied table's ends on two stages, each splitting it (Note [Tied tables across stages]).
    ("transformer_vocab_tied", 4, "partition_num=2 pipeline_num=2 schedule=1f1b recompute=never "
                                  "tensor_parallel=2"),
]


def run(model, ranks, options):
    style = "train_step" if "schedule=1f1b" in options else "forward"
    if "virtual_stages" not in options:  # the forced plans stay one stage per rank
        options += " virtual_stages=1"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=BUILD_PYTHON,
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               AUTOSTAGE_MEASURE_COMM="false", AUTOSTAGE_PROFILE_PASS_SECONDS="0.3",
               AUTOSTAGE_LOG_LEVEL="warn")
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks)]
    for name in ("OMP_NUM_THREADS", "PYTHONPATH", "AUTOSTAGE_MEASURE_COMM",
                 "AUTOSTAGE_PROFILE_PASS_SECONDS", "AUTOSTAGE_LOG_LEVEL"):
        cmd += ["-x", name]
    with tempfile.TemporaryDirectory() as out:
        cmd += [sys.executable, os.path.join(HERE, "run_plan.py"), model, "--style", style,
                "--out", out]
        cmd += options.split()
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        records = []
        for name in sorted(os.listdir(out)):
            with open(os.path.join(out, name)) as f:
                records.append(json.load(f))
    if done.returncode != 0 or len(records) != ranks:
        tail = (done.stdout + done.stderr)[-2000:]
        raise RuntimeError(f"{model} on {ranks} ranks ({options}) failed:\n{tail}")
    return sorted(records, key=lambda r: r["rank"])


def mib(value):
    return f"{value / 2**20:8.2f}"


def plan_text(r):
    degrees = r.get("tensor_parallel", [1])
    return (f"{r['stages']}st x{'/'.join(map(str, r['replicas']))} m{r['micro_batches']} "
            f"{r['schedule']}{' rc' if any(r['recompute']) else ''}"
            f"{' z' if any(r['zero']) else ''}"
            f"{' tp' + '/'.join(map(str, degrees)) if max(degrees) > 1 else ''}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time", action="store_true", help="also print step times")
    parser.add_argument("--only", help="run one model's configurations")
    parser.add_argument("--match", help="run the configurations whose options contain this")
    parser.add_argument("--json", action="store_true", help="print the records as JSON too")
    args = parser.parse_args()
    print(f"{'model':<23}{'ranks':>5}  {'plan':<24}{'precision':<10}{'rank':>4}{'stage':>6}"
          f"{'pred MiB':>10}{'meas MiB':>10}{'error':>8}{'usable MiB':>12}"
          + (f"{'pred ms':>9}{'meas ms':>9}" if args.time else ""))
    errors, above, everything = [], [], []
    for model, ranks, options in CONFIGS:
        if (args.only and model != args.only) or (args.match and args.match not in options):
            continue
        precision = "bf16" if "precision=bf16" in options else "fp32"
        for r in run(model, ranks, options):
            everything.append(dict(r, model=model, options=options))
            m = r["memory"]
            if m is None or m["stage"] < 0:
                continue
            error = m["measured"] / m["predicted"] - 1
            errors.append((abs(error), error, model, options, r["rank"]))
            if m["measured"] > m["usable"]:
                above.append((model, options, r["rank"]))
            line = (f"{model:<23}{ranks:>5}  {plan_text(r):<24}{precision:<10}{r['rank']:>4}"
                    f"{m['stage']:>6}{mib(m['predicted']):>10}{mib(m['measured']):>10}"
                    f"{error * 100:>+7.1f}%{mib(min(m['usable'], 2**50)):>12}")
            if args.time:
                line += f"{r['predicted_seconds'] * 1e3:>9.1f}{r['measured_seconds'] * 1e3:>9.1f}"
            print(line, flush=True)
    if errors:
        within = sum(1 for e in errors if e[0] <= 0.15)
        worst = max(errors)
        print(f"\n{within} of {len(errors)} rank figures within +-15% of the prediction; worst "
              f"{worst[1] * 100:+.1f}% ({worst[2]}, {worst[3]}, rank {worst[4]}); "
              f"{len(above)} above the usable memory")
    if args.json:
        print(json.dumps(everything))


if __name__ == "__main__":
    main()
