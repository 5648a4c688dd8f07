"""Bad input reaches every rank as the same Python exception; a failed rank never hangs the job.

One 4-rank mpirun runs all bad-input cases in sequence (bad_input_check.py); the rank-failure
cases need a job each (rank_failure_check.py). docs/errors.md lists the messages checked here.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from mpi_launch import HERE, build_has_cuda, mpi_env, mpirun

COMM_TIMEOUT_S = 10
pytestmark = pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed")

# case -> (exception class, substrings of the message every rank must get)
EXPECTED = {
    "kwarg_unknown": ("Error", [
        "checking the call failed on ranks 0,1,2,3: the call does not match forward(x, scale) "
        "of SeqNet: missing a required argument: 'scale'"]),
    "kwargs_rank1": ("Error", [
        "ranks called the module differently (ranks 0,2,3: forward, train mode; rank 1: "
        "forward, train mode, arguments (Tensor, scale=Tensor))"]),
    "non_tensor_rank2": ("UnsupportedError", [
        "checking the call failed on rank 2: input 1 (of type float) is not a tensor"]),
    "zero_dim_rank3": ("Error", ["checking the call failed on rank 3: input 1 is a 0-dim "
                                 "tensor"]),
    "dim0_not_batch_rank0": ("Error", [
        "checking the call failed on rank 0: input 1 has 3 rows in dim 0 but input 0 has 8"]),
    "batch_differs_rank1": ("Error", [
        "ranks passed different local batch sizes (rank 0: 8, rank 1: 6, rank 2: 8, "
        "rank 3: 8); every rank must pass the same number of samples"]),
    "shape_differs_rank3": ("Error", [
        "ranks passed inputs of different shapes or dtypes (rank 0: (Float[8, 3, 8], "
        "Float[8, 4]), rank 1: (Float[8, 3, 8], Float[8, 4]), rank 2: (Float[8, 3, 8], "
        "Float[8, 4]), rank 3: (Float[8, 5, 8], Float[8, 4]))"]),
    "dtype_differs_rank2": ("Error", ["rank 2: (Double[8, 3, 8], Float[8, 4])"]),
    "first_good_call": ("OK", []),
    "shape_changed_no_replan": ("Error", [
        "the inputs (Float[B, 5, 8], Float[B, 4]) differ from the traced inputs "
        "(Float[B, 3, 8], Float[B, 4])", "allow_replan=true"]),
    "kwargs_changed_no_replan": ("Error", [
        "the call's arguments (Tensor, scale=Tensor) differ from those of the traced call "
        "(Tensor, Tensor) (train mode)", "allow_replan=true"]),
    "dtype_changed_no_replan": ("Error", [
        "the inputs (Double[B, 3, 8], Float[B, 4]) differ from the traced inputs"]),
    "batch_too_small": ("Error", ["the batch is too small for the deployment",
                                  "replicas but the smallest micro-batch has only 1 samples"]),
    "non_tensor_after_deploy_rank3": ("UnsupportedError", [
        "failed on rank 3: input 1 (of type list) is not a tensor"]),
    "eval_on_rank1": ("Error", [
        "ranks called the module differently (ranks 0,2,3: forward, train mode; rank 1: "
        "forward, eval mode); call model.train() or model.eval(), and torch.no_grad(), alike on "
        "every rank, and the same method"]),
    "no_grad_on_rank2": ("Error", [
        "(ranks 0,1,3: forward, train mode; rank 2: forward, train mode, no_grad)"]),
    "state_dict_on_rank1": ("Error", [
        "ranks called the module differently (ranks 0,2,3: forward, train mode; rank 1: "
        "state_dict())"]),
    "optimizer_state_on_rank0": ("Error", [
        "ranks called the module differently (rank 0: optimizer.state_dict(from_global=True); "
        "ranks 1,2,3: forward, train mode)"]),
    "usable_after_errors": ("OK", []),
    "checkpoint_other_shapes": ("FormatError", [
        "loading the checkpoint failed on ranks 0,1,2,3: the checkpoint does not fit SeqNet: "
        "'a.weight' has shape [32, 8] in the checkpoint but [16, 8] in the model",
        "Nothing was loaded (the model is unchanged)"]),
    "checkpoint_damaged_on_rank1": ("FormatError", [
        "loading the checkpoint failed on rank 1: checkpoint file", ".pt.damaged' is corrupted: "
        "member", "fails its CRC-32 check"]),
    "checkpoint_refused_unchanged": ("OK", []),
    "deployment_corrupted": ("FormatError", [
        "deployment file is corrupted or truncated (payload hash"]),
    "deployment_other_graph": ("FormatError", [
        "validating the deployment failed on ranks 0,1,2,3: deployment field graph_hash is"]),
    "deployment_other_world_size": ("ConfigError", [
        "deployment field world_size is 1 but this job has 4 ranks"]),
    "deployment_missing_on_rank2": (None, ["loading the saved deployment failed on rank 2:"]),
    "optimizer_foreign_params": ("ConfigError", [
        "param_groups[0] holds 6 parameter(s) that are not in the wrapped model"]),
    "output_int": ("UnsupportedError", [
        "tracing and importing the model failed on ranks 0,1,2,3: forward of IntOutput "
        "returned no tensor (it returned int)"]),
    "output_object": ("UnsupportedError", [
        "unsupported output output[1] of type SimpleNamespace from forward of ObjectOutput"]),
    "unsupported_op": ("UnsupportedError", [
        # prim::PythonOp with TorchScript (1.13), torch.autograd.Function with torch.export.
        "tracing and importing the model failed on ranks 0,1,2,3: unsupported operation ",
        "(the custom autograd.Function TimesTwo", ") in PythonFunction"]),
    "complex_dtype": ("UnsupportedError", ["tracing and importing the model failed on ranks"]),
    "no_feasible_plan": ("PlanError", ["planning failed on rank 0:"]),
    "allow_replan_shape_changed": ("OK", []),
    # A CPU build (the 1.13 leg) and a CUDA build on this GPU-less machine (the 2.x leg) refuse
    # device=cuda for different reasons, each named.
    "device_cuda_without_cuda": ("ConfigError", [
        "choosing the device failed on ranks 0,1,2,3: device=cuda, but " + (
            "torch sees no GPU in this process (check CUDA_VISIBLE_DEVICES and the driver with "
            "nvidia-smi), or use device=cpu" if build_has_cuda() else
            "this build of autostage has no CUDA (it was configured without "
            "-DAUTOSTAGE_WITH_CUDA=ON)")]),
    "model_on_meta_rank1": ("ConfigError", [
        "placing the model on cpu failed on rank 1: the model's tensor 'stray' is on meta, but "
        "this rank's stages run on cpu: materialize it on the CPU first"]),
}


def keep_log(name, text):
    """With BAD_INPUT_LOG_DIR set, keeps a run's output (docs/errors.md quotes it)."""
    directory = os.environ.get("BAD_INPUT_LOG_DIR")
    if directory:
        with open(os.path.join(directory, name), "w") as f:
            f.write(text)


def parse_cases(log):
    cases = {}
    for match in re.finditer(r"^CASE (\S+) rank (\d): (.*)$", log, re.M):
        cases.setdefault(match.group(1), {})[int(match.group(2))] = match.group(3)
    return cases


def test_bad_inputs_raise_the_same_error_on_every_rank():
    # Negligible configured comm costs: the 2-stage plan then always replicates a stage (idle
    # ranks never win), so batch_too_small meets a replicated stage whatever the profiled times.
    env = mpi_env(AUTOSTAGE_COMM_TIMEOUT_S="120", AUTOSTAGE_COMM_LATENCY="1e-12",
                  AUTOSTAGE_COMM_BANDWIDTH="1e15", AUTOSTAGE_ALLREDUCE_BANDWIDTH="1e15")
    results = tempfile.mkdtemp()
    one_rank = os.path.join(results, "one_rank.deployment")
    save = subprocess.run([sys.executable, os.path.join(HERE, "bad_input_check.py"),
                           "--save-one-rank", one_rank], env=env, capture_output=True,
                          text=True, timeout=300)
    assert save.returncode == 0, save.stdout + save.stderr
    run = mpirun([sys.executable, os.path.join(HERE, "bad_input_check.py"),
                  "--one-rank-deployment", one_rank, "--results-dir", results], env)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log
    # Ranks write their own result files: mpirun may interleave long lines of several ranks.
    lines = ""
    for rank in range(4):
        with open(os.path.join(results, f"rank{rank}.txt")) as f:
            lines += f.read()
    shutil.rmtree(results)
    keep_log("bad_input_cases.txt", lines)
    cases = parse_cases(lines)
    assert sorted(cases) == sorted(EXPECTED), log
    for name, (error_class, parts) in EXPECTED.items():
        results = cases[name]
        assert sorted(results) == [0, 1, 2, 3], (name, results)
        assert len(set(results.values())) == 1, (name, results)  # the same on every rank
        got = results[0]
        if error_class == "OK":
            assert got == "OK", (name, got)
            continue
        if error_class is not None:
            assert got.startswith(error_class + ": "), (name, got)
        for part in parts:
            assert part in got, (name, part, got)
    for rank in range(4):
        assert f"rank {rank}: done" in lines, log
    assert "Inputs changed from (Float[B, 3, 8], Float[B, 4]) to (Float[B, 5, 8], " \
           "Float[B, 4]): retracing and replanning" in log, log
    assert "aborting the job" not in log, log


@pytest.mark.leg_independent  # the comm layer's timeout and liveness probe (conftest.py)
def test_killed_rank_makes_the_others_exit_within_the_timeout():
    env = mpi_env(AUTOSTAGE_COMM_TIMEOUT_S=str(COMM_TIMEOUT_S))
    # Each rank's own exit status and time (mpirun under --enable-recovery always exits 0).
    wrapper = ['sh', '-c', '"$@"; echo "EXIT rank $OMPI_COMM_WORLD_RANK status $? at '
               '$(date +%s.%N)"', 'sh']
    run = mpirun(wrapper + [sys.executable, os.path.join(HERE, "rank_failure_check.py"),
                            "--mode", "kill"], env, recovery=True)
    log = run.stdout + run.stderr
    keep_log("rank_killed.txt", log)
    kill = re.search(r"KILL rank 3 at ([\d.]+)", log)
    assert kill, log
    exits = {int(m.group(1)): (int(m.group(2)), float(m.group(3)))
             for m in re.finditer(r"EXIT rank (\d) status (\d+) at ([\d.]+)", log)}
    # A survivor's own EXIT line can be lost: when another survivor's MPI_Abort makes mpirun
    # kill the job, the wrapper shell may die before it echoes. Its abort line (below, required
    # for every survivor) says it gave up after the timeout; at least one exit must be seen.
    assert any(rank in exits for rank in range(3)), log
    for rank in range(3):
        if rank in exits:
            status, when = exits[rank]
            assert status != 0, log
            elapsed = when - float(kill.group(1))
            # The failing wait began around the kill; + the liveness probe (<= 2 s) and slack
            # for a machine at ten times the load (a hang would wait for mpirun's own limit).
            assert COMM_TIMEOUT_S - 1 <= elapsed <= COMM_TIMEOUT_S + 60, (rank, elapsed, log)
        abort = re.search(rf"aborting the job: uncaught \w+ on rank {rank}: (.*)", log)
        assert abort, log
        reason = abort.group(1)
        assert f"rank {rank} waited {COMM_TIMEOUT_S} s for " in reason, reason
        # Note [Liveness probe]: the dead rank never answers; a survivor that already aborted
        # (under --enable-recovery the others keep running) may be listed with it.
        assert re.search(r"a liveness probe of group \{[\d,]+\} got no answer within [\d.]+ s "
                         r"from ranks? (\d,)*3: \w+ \w+ probably died", reason), reason
    assert "UNEXPECTED normal end" not in log, log


def test_exception_in_a_stage_aborts_the_job_with_rank_and_stage():
    env = mpi_env(AUTOSTAGE_COMM_TIMEOUT_S="120")
    start = time.monotonic()
    run = mpirun([sys.executable, os.path.join(HERE, "rank_failure_check.py"),
                  "--mode", "raise"], env)
    elapsed = time.monotonic() - start
    log = run.stdout + run.stderr
    keep_log("stage_exception.txt", log)
    assert run.returncode != 0, log
    # TorchScript front end (1.13) / torch.export front end (2.x), which names the node; on a
    # GPU (scripts/test-gpu) the bad index is a device-side assert, reported by a later call.
    assert re.search(r"aborting the job: uncaught \w+ on rank \d: rank \d, stage 0 \(\w+\): "
                     r"(RuntimeError: index out of range in self \(in the TorchScript "
                     r"interpreter\)|node \d+ \(aten::embedding\.default\) in module '\w+' "
                     r"failed: index out of range in self|CUDA error: device-side assert "
                     r"triggered)", log), log
    # mpirun's own "MPI_ABORT was invoked" notice is not always printed when ranks die together.
    assert elapsed < 120, log  # aborted, not timed out
    assert "UNEXPECTED normal end" not in log, log


def test_uncaught_agreed_error_ends_every_rank_normally():
    env = mpi_env(AUTOSTAGE_COMM_TIMEOUT_S="120")
    # Each rank's output also goes to its own file: on the console the two ranks' tracebacks,
    # printed at the same moment, can interleave within a line.
    outputs = tempfile.mkdtemp()
    run = mpirun(["--output-filename", outputs, sys.executable,
                  os.path.join(HERE, "rank_failure_check.py"), "--mode", "agreed"], env, ranks=2)
    log = run.stdout + run.stderr
    assert run.returncode != 0, log
    expected = ("Error: ranks called the module differently (rank 0: forward, train mode; "
                "rank 1: forward, train mode, arguments (tokens=Tensor))")
    for rank in range(2):  # both ranks' tracebacks
        with open(os.path.join(outputs, "1", f"rank.{rank}", "stderr")) as f:
            assert expected in f.read(), log
    shutil.rmtree(outputs)
    assert "aborting the job" not in log, log
    assert "step 0 done" not in log, log


def test_a_second_backward_through_the_same_outputs_is_refused():
    """The pipeline backward runs once per forward; a second one through the same outputs
    (retain_graph=True, or a loss computed from them afterwards) is an error that says what to
    do (it crashed the rank before), and the module keeps working. torch's autograd engine
    re-raises an error of a backward as RuntimeError."""
    import torch
    import autostage
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 2))
    wrapped = autostage.Module(model, partition_num=1)
    out = wrapped(torch.randn(4, 3))
    out.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="rank 0.*ran already.*sum the losses"):
        out.pow(2).sum().backward()
    model.zero_grad()
    again = wrapped(torch.randn(4, 3))
    again.sum().backward()
    assert all(p.grad is not None for p in model.parameters())
