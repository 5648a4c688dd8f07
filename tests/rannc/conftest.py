"""Fixtures of the RaNNC test suite port, run by every rank under mpirun (tests/rannc/run_suite.py
launches it): a gloo process group for the DistributedDataParallel reference, the seed, the batch
size and iteration count, and a directory every rank shares. Each rank writes what it ran to
``<workdir>/results.<rank>.json`` for run_suite's summary."""
import datetime
import json
import os
import random

import pytest
import torch
import torch.distributed as dist

from autostage import rannc as pyrannc


def pytest_addoption(parser):
    parser.addoption("--batch-size", type=int, default=64, help="rows per rank and step")
    parser.addoption("--iteration", type=int, default=2, help="steps per test")
    parser.addoption("--seed", type=int, default=0)
    parser.addoption("--workdir", default=None,
                     help="a directory every rank sees (checkpoints, results)")


def _workdir(config):
    path = config.getoption("--workdir") or os.path.join(os.getcwd(), "rannc-suite")
    os.makedirs(path, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def init_dist():
    """The reference's process group: gloo over TCP at MASTER_ADDR:MASTER_PORT (run_suite sets
    them), ranks and size from MPI."""
    if not dist.is_initialized():
        dist.init_process_group(
            "gloo", init_method="tcp://{}:{}".format(os.environ.get("MASTER_ADDR", "127.0.0.1"),
                                                     os.environ["MASTER_PORT"]),
            rank=pyrannc.get_rank(), world_size=pyrannc.get_world_size(),
            # A rank that failed alone must not leave the others waiting for half an hour.
            timeout=datetime.timedelta(seconds=180))
    yield
    # Destroyed before the interpreter exits: gloo's worker threads may still hold finished work
    # (tensors with Python references) and dropping it during interpreter finalization aborts the
    # process ("terminate called without an active exception", seen once on 4 ranks). The barrier
    # first, so no rank destroys the group while another is still in a test's last collective.
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(autouse=True)
def init_seed(request):
    seed = request.config.getoption("--seed")
    random.seed(seed)
    torch.manual_seed(seed)


@pytest.fixture
def batch_size(request):
    return request.config.getoption("--batch-size")


@pytest.fixture
def iteration(request):
    return request.config.getoption("--iteration")


@pytest.fixture
def workdir(request):
    """A directory for this test that every rank sees."""
    path = os.path.join(_workdir(request.config), request.node.name.replace("/", "_"))
    os.makedirs(path, exist_ok=True)
    return path


# What this rank ran, by outcome (written by pytest_unconfigure for run_suite.py's summary).
_RESULTS = {"passed": [], "failed": [], "skipped": []}


def pytest_runtest_logreport(report):
    if report.when == "call" or (report.when == "setup" and not report.passed):
        outcome = "passed" if report.passed else "skipped" if report.skipped else "failed"
        reason = ""
        if report.skipped and isinstance(report.longrepr, tuple):
            reason = report.longrepr[2]
        _RESULTS[outcome].append({"test": report.nodeid, "reason": reason})


def pytest_unconfigure(config):
    path = os.path.join(_workdir(config), f"results.{pyrannc.get_rank()}.json")
    with open(path, "w") as f:
        json.dump(_RESULTS, f)
