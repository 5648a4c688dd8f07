"""C++ users (issue 18): `cmake --install` gives a prefix that a project outside this tree builds
against with find_package(autostage) (tests/consumer), the planner component without LibTorch
or MPI; the installed examples run, and train.cpp under mpirun on 2 and 4 ranks equals plain
LibTorch training of the same model in one process (every step's loss with SGD with momentum,
the eval-mode loss of a held-out batch and the final parameters, rtol 1e-5); the installed Python package imports."""
import os
import shutil
import subprocess
import sys

import pytest

from mpi_launch import BUILD, ROOT, mpi_env, mpirun

STEPS = 4


def run(cmd, **kwargs):
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, **kwargs)
    assert done.returncode == 0, f"{cmd} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def read_params(path):
    params = {}
    with open(path) as f:
        for line in f:
            name, *values = line.split()
            params[name] = [float(v) for v in values]
    return params


def losses(log):
    """Every `step N loss X`, then the `eval loss X` line (module.eval() under NoGradGuard)."""
    lines = log.splitlines()
    return ([float(line.split()[3]) for line in lines if line.startswith("step ")] +
            [float(line.split()[2]) for line in lines if line.startswith("eval loss ")])


def close(a, b, rtol=1e-5, atol=1e-6):
    return len(a) == len(b) and all(abs(x - y) <= atol + rtol * abs(y) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def consumer(tmp_path_factory):
    prefix = tmp_path_factory.mktemp("prefix")
    out = tmp_path_factory.mktemp("consumer")
    run(["cmake", "--install", BUILD, "--prefix", str(prefix)])
    run(["cmake", "-S", os.path.join(ROOT, "tests", "consumer"), "-B", str(out), "-G", "Ninja",
         "-DCMAKE_BUILD_TYPE=Release", f"-DCMAKE_PREFIX_PATH={prefix}"])
    run(["cmake", "--build", str(out), "-j", str(os.cpu_count() or 2)])
    return prefix, out


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake not installed")
def test_installed_planner_example_plans(consumer):
    _, out = consumer
    log = run([str(out / "plan"), "8", "16"])
    assert "Estimated profiles of subgraphs" in log and "Assigned subgraph" in log, log
    assert "predicted iteration" in log, log


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed")
@pytest.mark.parametrize("ranks", [2, 4])
def test_installed_train_example_equals_plain_libtorch(consumer, ranks, tmp_path):
    _, out = consumer
    params = tmp_path / "autostage.txt"
    env = mpi_env(AUTOSTAGE_PARTITION_NUM="2")
    done = mpirun([str(out / "train"), "--steps", str(STEPS), "--save-params", str(params)],
                  env=env, ranks=ranks)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log
    assert "Assigned subgraph" in log, log
    reference_params = tmp_path / "reference.txt"
    reference = run([str(out / "reference"), str(ranks), str(STEPS), str(reference_params)])
    got, want = losses(done.stdout), losses(reference)
    assert len(want) == STEPS + 1 and close(got, want), f"losses {got} vs plain {want}\n{log}"
    assert "Switching from train to eval mode" in log, log
    got, want = read_params(params), read_params(reference_params)
    assert sorted(got) == sorted(want), (sorted(got), sorted(want))
    for name in want:
        assert close(got[name], want[name]), f"parameter {name} differs from plain LibTorch"


def test_installed_python_package_imports(consumer):
    prefix, _ = consumer
    site = prefix / "lib" / "python3" / "dist-packages"
    env = dict(os.environ, PYTHONPATH=str(site))
    log = run([sys.executable, "-c", "import autostage; print(autostage.__file__)"], env=env)
    assert log.strip().startswith(str(site)), log
