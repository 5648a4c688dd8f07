"""autostage.rannc: a script written for RaNNC (only the import changed) trains on 4 ranks like
plain PyTorch; gather_inputs=False and enable_dropout; options autostage does not implement
raise NotImplementedError naming the option; RANNC_* variables set the shared options."""
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

from mpi_launch import mpi_env, run_driver

needs_mpirun = pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed")


@needs_mpirun
def test_rannc_script_runs_unchanged_and_matches_plain_pytorch(tmp_path):
    path = str(tmp_path / "rannc.deployment")
    # RaNNC's own variables choose the plan: 2 stages (replicated), 1 micro-batch.
    log = run_driver("rannc_script_check.py", path, RANNC_PARTITION_NUM="2",
                     RANNC_PIPELINE_NUM="1")
    for rank in range(4):
        assert f"rank {rank}: rannc script checked; 0 failures" in log, log
    assert "RANNC_PARTITION_NUM=2 sets partition_num = 2 (RaNNC compatibility)" in log, log
    assert "Deployment: 2 stage(s), 1 micro-batch(es)" in log, log
    assert re.search(r"replicas=[2-9]", log), log
    assert os.path.getsize(path) > 0
    # show_deployment printed the saved plan on rank 0.
    assert f"Deployment {path}: world_size=4 planned batch_size=32" in log, log
    assert len(re.findall(r"STAGE_\S+: ranks=\[[\d, ]+\] replicas=\d .* micro_batch_size=\d+",
                          log)) == 2, log


@needs_mpirun
def test_gather_inputs_false_and_enable_dropout(tmp_path):
    log = run_driver("rannc_extras_check.py", AUTOSTAGE_PARTITION_NUM="2")
    for rank in range(4):
        assert f"rank {rank}: rannc extras checked; 0 failures" in log, log


def test_unimplemented_options_raise_naming_the_option():
    from autostage import rannc as pyrannc
    with pytest.raises(NotImplementedError, match=r"RaNNCModule\(offload_params=True\)"):
        pyrannc.RaNNCModule(torch.nn.Linear(2, 2), offload_params=True)


def test_apex_amp_without_apex_trains_in_the_parameters_dtype(capfd):
    """RaNNC's scripts pass enable_apex_amp=True (and allreduce_amp_master_params=True) also for
    optimizers Apex never prepared: accepted, said once in the log; an optimizer Apex prepared
    (amp.initialize attaches _amp_stash) is refused by name."""
    from autostage import UnsupportedError
    from autostage import rannc as pyrannc
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    wrapped = pyrannc.RaNNCModule(model, opt, enable_apex_amp=True,
                                  allreduce_amp_master_params=True)
    assert wrapped.enable_apex_amp and wrapped.allreduce_amp_master_param
    assert "Apex is not used; training in the parameters' dtype" in capfd.readouterr().err
    opt._amp_stash = object()  # what apex.amp.initialize leaves on the optimizer
    with pytest.raises(UnsupportedError, match=r"enable_apex_amp=True.*prepared by Apex"):
        pyrannc.RaNNCModule(model, opt, enable_apex_amp=True)
    with pytest.raises(UnsupportedError, match="prepared by Apex"):
        pyrannc.amp.named_master_params(model, opt)


def test_enable_zero_maps_to_zero_1():
    import autostage
    from autostage import _autostage
    from autostage import rannc as pyrannc
    model = torch.nn.Linear(2, 2)
    try:
        pyrannc.RaNNCModule(model, torch.optim.Adam(model.parameters()), enable_zero=True)
        assert 'zero = "1"' in autostage.show_config()
        with pytest.raises(autostage.UnsupportedError, match="LBFGS.*zero=0"):
            pyrannc.RaNNCModule(model, torch.optim.LBFGS(model.parameters()), enable_zero=True)
    finally:
        _autostage._set_option("zero", "auto")


def test_keep_graph_true_is_refused():
    from autostage import rannc as pyrannc
    pyrannc.keep_graph(False)
    with pytest.raises(NotImplementedError, match="keep_graph"):
        pyrannc.keep_graph(True)


def test_rannc_signatures_match_pyrannc():
    import inspect
    from autostage import rannc as pyrannc
    params = list(inspect.signature(pyrannc.RaNNCModule.__init__).parameters.items())[1:]
    assert [(n, p.default if p.default is not inspect.Parameter.empty else None)
            for n, p in params] == [
        ("model", None), ("optimizer", None), ("gather_inputs", True), ("load_deployment", None),
        ("enable_apex_amp", False), ("allreduce_amp_master_params", False),
        ("enable_zero", False), ("check_unused_values", True), ("offload_params", False)]
    for name in ["get_rank", "get_world_size", "barrier", "clear", "delay_grad_allreduce",
                 "keep_graph", "show_deployment"]:
        assert callable(getattr(pyrannc, name)), name
    for name in ["state_dict", "load_state_dict", "zero_grad", "clip_grad_norm", "get_param",
                 "get_param_grad", "save_deployment", "allreduce_grads", "enable_dropout"]:
        assert callable(getattr(pyrannc.RaNNCModule, name)), name


def test_rannc_variables_set_shared_options_and_autostage_variables_win():
    env = mpi_env(RANNC_PARTITION_NUM="3", RANNC_PIPELINE_NUM="4", AUTOSTAGE_PIPELINE_NUM="2",
                  RANNC_MEM_MARGIN="0.25", RANNC_CHECKPOINTING="true")
    code = "import autostage; print(autostage.show_config())"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert "partition_num = 3  (env RANNC_PARTITION_NUM)" in out, out
    assert "pipeline_num = 2  (env AUTOSTAGE_PIPELINE_NUM)" in out, out
    assert "mem_margin = 0.25  (env RANNC_MEM_MARGIN)" in out, out
    assert 'recompute = "always"  (env RANNC_CHECKPOINTING)' in out, out
    assert "RANNC_PIPELINE_NUM=4 is overridden by AUTOSTAGE_PIPELINE_NUM" in out, out
