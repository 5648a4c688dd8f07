"""Run under mpirun on 2 ranks (see test_plan_usage.py): the plan is what runs (Note [Plan usage]
in core/plan_usage.h). One model, trained through forward()/backward(), train_step and evaluated
under no_grad, switching between them, against plain single-process PyTorch; the schedule each
deployment records is the one the runtime's trace shows; each rank's memory is measured."""
import copy
import json
import os
import sys

import torch

import autostage
from mpi_launch import finish

LOCAL, MICRO, LR = 8, 4, 0.01


class LossNet(torch.nn.Module):
    """An MLP returning its MSE loss, so both forward()/backward() and train_step can run it."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        layers = []
        for _ in range(4):
            layers += [torch.nn.Linear(32, 32), torch.nn.Tanh()]
        self.net = torch.nn.Sequential(*layers)

    def forward(self, x, y):
        return torch.nn.functional.mse_loss(self.net(x), y)


def batch(step, rows):
    g = torch.Generator().manual_seed(900 + step)
    return torch.randn(rows, 32, generator=g), torch.randn(rows, 32, generator=g)


def last_step_events(trace_dir, rank, stage):
    """(name, micro_batch) of `stage`'s forward and backward events in the trace's last step."""
    with open(os.path.join(trace_dir, f"trace_rank{rank}.json")) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    last = max(e["args"]["step"] for e in events)
    ops = [e for e in events if e["args"]["step"] == last and e["args"]["stage"] == stage
           and e["name"] in ("forward", "backward")]
    return [(e["name"], e["args"]["micro_batch"]) for e in sorted(ops, key=lambda e: e["ts"])]


def check_order(trace_dir, rank, stage, schedule, what, failures):
    order = [name for name, _ in last_step_events(trace_dir, rank, stage)]
    if len(order) != 2 * MICRO:
        failures.append(f"{what}: {len(order)} forward/backward events on stage {stage}: {order}")
        return
    gpipe = order == ["forward"] * MICRO + ["backward"] * MICRO
    if (schedule == "gpipe") != gpipe:
        failures.append(f"{what}: the trace of stage {stage} shows {order} for a {schedule} plan")


def main():
    rank, world = autostage.get_rank(), autostage.get_world_size()
    rows = slice(rank * LOCAL, (rank + 1) * LOCAL)
    trace_dir = sys.argv[1]
    failures = []
    model = LossNet()
    reference = copy.deepcopy(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    ref_optimizer = torch.optim.Adam(reference.parameters(), lr=LR)
    wrapped = autostage.Module(model, optimizer, partition_num=2, pipeline_num=MICRO,
                               recompute="never", trace_events=True, trace_events_dir=trace_dir)
    selection = None
    state_at_start = None  # optimizer state bytes when the last step started

    def optimizer_state_bytes():
        return sum(v.numel() * v.element_size() for p in optimizer.param_groups[0]["params"]
                   for v in optimizer.state.get(p, {}).values() if torch.is_tensor(v))

    def step(number, style):
        nonlocal selection, state_at_start
        x, y = batch(number, world * LOCAL)
        optimizer.zero_grad()
        state_at_start = optimizer_state_bytes()
        if style == "train_step":
            loss = wrapped.train_step(x[rows], y[rows])
        else:
            loss = wrapped(x[rows], y[rows])
            loss.backward()
        optimizer.step()
        ref_optimizer.zero_grad()
        ref_loss = reference(x, y)
        ref_loss.backward()
        ref_optimizer.step()
        if not torch.allclose(loss.detach(), ref_loss.detach(), rtol=1e-5, atol=1e-7):
            failures.append(f"step {number} ({style}): loss {loss.item()} vs {ref_loss.item()}")
        info = wrapped._impl.deployment_info()
        expected = {"forward": ("forward_backward", "gpipe"), "train_step": ("train_step", "1f1b")}
        usage, schedule = expected[style]
        if (wrapped._impl.usage, info["options"].get("usage"), info["schedule"]) != \
                (usage, usage, schedule):
            failures.append(f"step {number} ({style}): ran usage {wrapped._impl.usage}, deployment "
                            f"for {info['options'].get('usage')} with schedule {info['schedule']}")
        for stage in range(2):
            if rank == stage:
                check_order(trace_dir, rank, stage, schedule, f"step {number} ({style})", failures)
        selection = [p.data_ptr() for p in optimizer.param_groups[0]["params"]]

    for number, style in enumerate(["forward", "forward", "train_step", "train_step", "forward"]):
        step(number, style)

    # Evaluation under no_grad: an inference plan (no gradients, no optimizer state), same loss,
    # the optimizer keeps the training parameters.
    x, y = batch(50, world * LOCAL)
    with torch.no_grad():
        loss = wrapped(x[rows], y[rows])
        ref_loss = reference(x, y)
    info = wrapped._impl.deployment_info()
    if info["options"].get("usage") != "inference" or wrapped._impl.usage != "inference":
        failures.append(f"no_grad forward ran a deployment for {info['options'].get('usage')}")
    for s in info["stages"]:
        if s["optimizer_bytes"] != 0 or s["gradient_bytes"] != 0 or s["recompute"]:
            failures.append(f"inference stage {s}: gradients, optimizer state or recompute planned")
    if not torch.allclose(loss, ref_loss, rtol=1e-5, atol=1e-7):
        failures.append(f"no_grad loss {loss.item()} vs {ref_loss.item()}")
    if [p.data_ptr() for p in optimizer.param_groups[0]["params"]] != selection:
        failures.append("the inference deployment changed the optimizer's parameters")

    for number, style in enumerate(["forward", "train_step"], start=5):
        step(number, style)
    for name, value in reference.state_dict().items():
        got = wrapped.state_dict()[name]
        if not torch.allclose(got, value, rtol=1e-5, atol=1e-6):
            failures.append(f"parameter {name} differs by {(got - value).abs().max()}")
    if wrapped._impl.deployment_count != 3:
        failures.append(f"{wrapped._impl.deployment_count} deployments, expected 3 (one per usage)")

    memory = wrapped._impl.last_step_memory()
    if memory is None:
        failures.append("no measured memory after the last step")
    else:
        print(f"rank {rank}: memory {memory}", flush=True)
        parts = (memory["parameters"] + memory["gradients"] + memory["optimizer"] +
                 memory["transient"])
        # Note [Measured memory]: the optimizer state as the optimizer held it when the step
        # started. The last step is the first train_step after forward()s: when the two plans
        # cut differently, the state moves to the new stages' parameters only after it.
        if memory["measured"] != parts or memory["parameters"] <= 0 or memory["gradients"] <= 0 \
                or memory["optimizer"] != state_at_start:
            failures.append(f"measured memory does not add up: {memory} (the optimizer held "
                            f"{state_at_start} bytes of state when the step started)")
        # A generous bound (bench/memory_accuracy holds the real target).
        if not 0.5 * memory["predicted"] <= memory["measured"] <= 2 * memory["predicted"]:
            failures.append(f"measured peak {memory['measured']} far from the predicted "
                            f"{memory['predicted']}")

    # A forced 1f1b plan cannot run through forward(): refused on every rank, naming train_step.
    other = autostage.Module(LossNet(), None, partition_num=2, pipeline_num=2, schedule="1f1b")
    try:
        other(x[rows], y[rows]).backward()
        failures.append("schedule=1f1b through forward() did not raise")
    except autostage.ConfigError as e:
        if "train_step" not in str(e):
            failures.append(f"schedule=1f1b through forward() raised without naming train_step: {e}")
    print(f"rank {rank}: usage checked; {len(failures)} failures", flush=True)
    finish(rank, failures)


if __name__ == "__main__":
    main()
