"""Bad-input cases for autostage.Module, run by test_bad_input.py.

Under mpirun (4 ranks): runs every case in sequence on the same processes and prints, per case
and rank, `CASE <name> rank <r>: OK` or `CASE <name> rank <r>: <ExceptionClass>: <message>`;
test_bad_input.py checks that every rank got the same exception and what it says.
Without mpirun: `--save-one-rank PATH` saves a 1-rank deployment (for the world-size case).
"""
import argparse
import os
import sys
import tempfile
import types

import torch

import autostage
from device_under_test import host, allclose, equal

LOCAL_BATCH, STEPS_T = 8, 3


class SeqNet(torch.nn.Module):
    """x: (B, T, 8) with any T, scale: (B, 4) -> (B, 4)."""

    def __init__(self, hidden=16):
        super().__init__()
        self.a = torch.nn.Linear(8, hidden)
        self.b = torch.nn.Linear(hidden, hidden)
        self.c = torch.nn.Linear(hidden, 4)

    def forward(self, x, scale):
        h = torch.tanh(self.b(torch.tanh(self.a(x)))).mean(1)
        return self.c(h) * scale


class IntOutput(SeqNet):
    def forward(self, x, scale):
        return 3


class ObjectOutput(SeqNet):
    def forward(self, x, scale):
        return self.c(self.a(x).mean(1)), types.SimpleNamespace(y=x)


class TimesTwo(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


class PythonFunction(SeqNet):
    def forward(self, x, scale):
        return TimesTwo.apply(self.c(self.a(x).mean(1))) * scale


class Doubler(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(8))

    def forward(self, x):
        return x * 2


def make(cls=SeqNet, **kwargs):
    torch.manual_seed(1234)
    return cls(**kwargs)


def batch(rank, world, t=STEPS_T, local=LOCAL_BATCH, dtype=torch.float32, seed=5):
    """(this rank's x, scale), (global x, scale)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(world * local, t, 8, generator=g).to(dtype)
    scale = torch.randn(world * local, 4, generator=g)
    rows = slice(rank * local, (rank + 1) * local)
    return (x[rows], scale[rows]), (x, scale)


RESULTS = []  # this rank's CASE lines, written to --results-dir/rank<r>.txt at the end


def run_case(name, body):
    rank = autostage.get_rank()
    try:
        body()
        line = f"CASE {name} rank {rank}: OK"
    except Exception as e:  # the test checks the class and message of what every rank got
        message = str(e).replace("\n", " ")
        line = f"CASE {name} rank {rank}: {type(e).__name__}: {message}"
    RESULTS.append(line)
    print(line, flush=True)


def expect_close(got, want, what):
    if not allclose(got, want, rtol=1e-5, atol=1e-6):
        raise AssertionError(f"{what}: output differs by {(got - want).abs().max()}")


def flip_byte(source, target, at):
    data = bytearray(open(source, "rb").read())
    data[at] ^= 0x20
    with open(target, "wb") as f:
        f.write(bytes(data))


def checkpoint_cases(m, path, rank):
    """Checkpoints of the deployed module: one of another model's shapes, and one damaged on
    rank 1 only, are refused on every rank without changing any stage's parameters."""
    saved = path + ".pt"
    state = m.state_dict()
    autostage.save_checkpoint(state, saved)  # rank 0 writes
    autostage.save_checkpoint(make(hidden=32), saved + ".wide")
    if rank == 0:
        weight = host(state["a.weight"]).numpy().tobytes()
        flip_byte(saved, saved + ".damaged", at=open(saved, "rb").read().find(weight) + 1)
    autostage.barrier()
    run_case("checkpoint_other_shapes", lambda: autostage.load_checkpoint(saved + ".wide", m))
    run_case("checkpoint_damaged_on_rank1", lambda: autostage.load_checkpoint(
        saved + ".damaged" if rank == 1 else saved, m))

    def unchanged():
        now = m.state_dict()
        changed = [k for k in state if not equal(state[k], now[k])]
        if changed:
            raise AssertionError(f"refused checkpoints changed {changed}")
        autostage.load_checkpoint(saved, m)  # the intact one loads
    run_case("checkpoint_refused_unchanged", unchanged)


def main_cases(one_rank_deployment, results_dir):
    rank, world = autostage.get_rank(), autostage.get_world_size()
    model = make()
    reference = make()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    m = autostage.Module(model, optimizer, partition_num=2, pipeline_num=4)
    (x, s), (gx, gs) = batch(rank, world)
    only = lambda r, bad, good=(x, s): (lambda: m(*bad) if rank == r else m(*good))  # noqa: E731

    # Before deployment: the first call is the one that traces and plans.
    run_case("kwarg_unknown", lambda: m(x, scales=s))
    run_case("kwargs_rank1", lambda: m(x, scale=s) if rank == 1 else m(x, s))
    run_case("non_tensor_rank2", only(2, (x, 2.0)))
    run_case("zero_dim_rank3", only(3, (x, torch.tensor(1.0))))
    run_case("dim0_not_batch_rank0", only(0, (x, s[:3])))
    run_case("batch_differs_rank1", only(1, (x[:6], s[:6])))
    run_case("dtype_differs_rank2", only(2, (x.double(), s)))
    run_case("shape_differs_rank3", only(3, (torch.randn(LOCAL_BATCH, 5, 8), s)))
    rows = slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)
    run_case("first_good_call", lambda: expect_close(m(x, s).detach(),
                                                     reference(gx, gs)[rows].detach(), "deploy"))
    # After deployment.
    (x5, s5), _ = batch(rank, world, t=5)
    run_case("shape_changed_no_replan", lambda: m(x5, s5))
    run_case("kwargs_changed_no_replan", lambda: m(x, scale=s))
    run_case("dtype_changed_no_replan", lambda: m(x.double(), s))
    run_case("batch_too_small", lambda: m(x[:1], s[:1]))
    run_case("non_tensor_after_deploy_rank3", only(3, (x, [1, 2])))

    def eval_on_rank1():
        if rank == 1:
            m.eval()
        try:
            m(x, s)
        finally:
            m.train()
    run_case("eval_on_rank1", eval_on_rank1)

    def no_grad_on_rank2():
        with torch.set_grad_enabled(rank != 2):
            m(x, s)
    run_case("no_grad_on_rank2", no_grad_on_rank2)
    run_case("state_dict_on_rank1", lambda: m.state_dict() if rank == 1 else m(x, s))
    run_case("optimizer_state_on_rank0",
             lambda: optimizer.state_dict(from_global=True) if rank == 0 else m(x, s))

    def train_step():
        optimizer.zero_grad()
        out = m(x, s)
        expect_close(out.detach(), reference(gx, gs)[rows].detach(), "after errors")
        out.pow(2).mean().backward()
        optimizer.step()
    run_case("usable_after_errors", train_step)

    path = os.path.join(tempfile.gettempdir(), "autostage_bad_input_4ranks.deployment")
    if rank == 0:
        m.save_deployment(path)
    autostage.barrier()
    checkpoint_cases(m, path, rank)
    corrupted = path + ".corrupted"
    if rank == 0:
        flip_byte(path, corrupted, at=os.path.getsize(path) // 2)  # inside the payload
    autostage.barrier()
    run_case("deployment_corrupted",
             lambda: autostage.Module(make(), load_deployment=corrupted)(x, s))
    run_case("deployment_other_graph",
             lambda: autostage.Module(make(hidden=32), load_deployment=path)(x, s))
    run_case("deployment_other_world_size",
             lambda: autostage.Module(make(), load_deployment=one_rank_deployment)(x, s))
    run_case("deployment_missing_on_rank2",
             lambda: autostage.Module(make(), load_deployment=path if rank != 2 else
                                      path + ".missing")(x, s))
    foreign = torch.optim.SGD(list(make().parameters()), lr=0.1)
    run_case("optimizer_foreign_params", lambda: autostage.Module(make(), foreign)(x, s))
    run_case("output_int", lambda: autostage.Module(make(IntOutput))(x, s))
    run_case("output_object", lambda: autostage.Module(make(ObjectOutput))(x, s))
    run_case("unsupported_op", lambda: autostage.Module(make(PythonFunction))(x, s))
    run_case("complex_dtype", lambda: autostage.Module(Doubler())(torch.randn(8, 8).to(
        torch.complex64)))
    run_case("no_feasible_plan", lambda: autostage.Module(make(), mem_limit_gb=1e-7)(x, s))
    autostage._autostage._set_option("mem_limit_gb", "0")

    # allow_replan=True (last: options are process-wide): a new T retraces and replans.
    model2, reference2 = make(), make()
    optimizer2 = torch.optim.Adam(model2.parameters(), lr=0.01)
    ref_optimizer2 = torch.optim.Adam(reference2.parameters(), lr=0.01)
    m2 = autostage.Module(model2, optimizer2, allow_replan=True, partition_num=2, pipeline_num=1)
    _, (gx5, gs5) = batch(rank, world, t=5)

    def train_step(inputs, global_inputs):
        for net, opt, args in ((m2, optimizer2, inputs), (reference2, ref_optimizer2,
                                                          global_inputs)):
            opt.zero_grad()
            out = net(*args)
            (out * out).mean().backward()
            opt.step()

    def replan():
        # Trained before and after the replan: the new deployment starts from the trained
        # parameters and Adam state, wherever they were held.
        train_step((x, s), (gx, gs))
        expect_close(m2(x5, s5).detach(), reference2(gx5, gs5)[rows].detach(), "replanned")
        train_step((x5, s5), (gx5, gs5))
        expect_close(m2(x5, s5).detach(), reference2(gx5, gs5)[rows].detach(),
                     "trained after the replan")
        if m2._impl.deployment_count != 2:
            raise AssertionError(f"deployed {m2._impl.deployment_count} times, expected 2")
        local = {p.data_ptr() for p in m2.local_parameters()}
        held = [p.data_ptr() for g in optimizer2.param_groups for p in g["params"]]
        if sorted(held) != sorted(local):
            raise AssertionError("optimizer does not hold exactly the replanned local parameters")
    run_case("allow_replan_shape_changed", replan)

    def cuda_without_cuda():  # this build and machine have no CUDA (the options are global)
        try:
            autostage.Module(make(), device="cuda")(x, s)
        finally:
            autostage.Module(make(), device="auto")
    run_case("device_cuda_without_cuda", cuda_without_cuda)

    def model_on_meta_rank1():  # Note [Placing the model]; no GPU here: meta is "another device"
        model = make()
        if rank == 1:
            model.register_buffer("stray", torch.empty(2, device="meta"))
        autostage.Module(model)(x, s)
    run_case("model_on_meta_rank1", model_on_meta_rank1)
    autostage.barrier()
    if rank == 0:
        for name in (path, corrupted, path + ".pt", path + ".pt.wide", path + ".pt.damaged"):
            os.remove(name)
    with open(os.path.join(results_dir, f"rank{rank}.txt"), "w") as f:
        f.write("\n".join(RESULTS + [f"rank {rank}: done"]) + "\n")
    print(f"rank {rank}: done", flush=True)


def save_one_rank(path):
    (x, s), _ = batch(0, 1)
    m = autostage.Module(make(), partition_num=1)
    m(x, s)
    m.save_deployment(path)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--save-one-rank")
    parser.add_argument("--one-rank-deployment")
    parser.add_argument("--results-dir", default=".")
    args = parser.parse_args()
    if args.save_one_rank:
        save_one_rank(args.save_one_rank)
    else:
        main_cases(args.one_rank_deployment, args.results_dir)
    sys.exit(0)
