"""The planning service under real faults (issue 31): store files damaged or truncated, a full
disk, a service killed with SIGKILL while it writes, and 50 clients at once sending valid and
malformed calls. Through the CLI (`autostage serve`, `autostage plan --server`) as jobs and
schedulers reach it. Every answer is compared with the plan `autostage plan` makes in its own
process for the same call; the store is checked by reopening it (Note [Planner store])."""
import json
import os
import random
import signal
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from mpi_launch import CLI

# Torch-free: the CLI and the service (conftest.py's leg_independent).
pytestmark = [pytest.mark.skipif(not os.path.exists(CLI), reason="the autostage CLI missing"),
              pytest.mark.leg_independent]

# A small synthetic model: each plan takes milliseconds, so many calls fit in a test.
MODEL = ["--synthetic", "mlp:layers=8", "--devices", "4", "--devices-per-node", "4"]
# What a plan answer is compared on (the timing and the store flag differ by design).
PLAN_FIELDS = ("stages", "micro_batches", "schedule", "usage",
               "predicted_iteration_ms", "peak_memory_bytes")


_started = []  # every Service of the running test: killed at its end, whatever happened


def kill_services():
    while _started:
        service = _started.pop()
        if service.process.poll() is None:
            service.process.kill()
            service.process.wait(timeout=120)


@pytest.fixture(autouse=True)
def no_service_left():
    yield
    kill_services()


class Service:
    """`autostage serve` on a unix socket in `directory`, its log in directory/service-N.log."""

    def __init__(self, directory, store, extra=(), starts=[0]):
        starts[0] += 1
        self.address = f"unix:{directory}/planner.sock"
        self.log_path = os.path.join(directory, f"service-{starts[0]}.log")
        self._log = open(self.log_path, "w")
        self.process = subprocess.Popen([CLI, "serve", "--listen", self.address, "--store",
                                         str(store), *extra],
                                        stdout=self._log, stderr=subprocess.STDOUT)
        _started.append(self)
        for _ in range(600):  # bounded wait for it to answer (not a speed check)
            assert self.process.poll() is None, self.log()
            if subprocess.run([CLI, "status", "--server", self.address, "--timeout-s", "2"],
                              capture_output=True).returncode == 0:
                return
            time.sleep(0.1)
        raise AssertionError("the planning service did not start: " + self.log())

    def log(self):
        self._log.flush()
        with open(self.log_path) as f:
            return f.read()

    def stop(self, sig=signal.SIGTERM):
        if self.process.poll() is None:
            self.process.send_signal(sig)
        code = self.process.wait(timeout=120)
        self._log.close()
        return code


def plan(batch, address=None, memory="16GiB"):
    """The JSON answer of `autostage plan` for this model, global batch and device memory
    (asking the service at `address` when given), or the CompletedProcess when it failed."""
    args = [CLI, "plan", *MODEL, "--device-memory", memory, "--batch", str(batch), "--json"]
    if address:
        args += ["--server", address, "--timeout-s", "120"]
    done = subprocess.run(args, capture_output=True, text=True)
    return json.loads(done.stdout) if done.returncode == 0 else done


def same_plan(answer, local):
    assert isinstance(answer, dict), answer.stderr
    for field in PLAN_FIELDS:
        assert answer[field] == local[field], (field, answer, local)


def store_files(store, suffix):
    return sorted(p for p in (store / "plans").iterdir() if p.name.endswith(suffix))


def dead_pid():
    """The pid of a process that has exited and been reaped."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_damaged_store_files_are_refused_by_name_and_planned_again(tmp_path):
    store = tmp_path / "store"
    batches = (16, 32, 64)
    local = {b: plan(b) for b in batches}
    service = Service(tmp_path, store)
    first = {b: plan(b, service.address) for b in batches}
    for b in batches:
        same_plan(first[b], local[b])
        assert first[b]["from_store"] is False
    assert service.stop() == 0

    path = {b: store / "plans" / f"{first[b]['plan_key']}.answer" for b in batches}
    data = path[16].read_bytes()
    path[16].write_bytes(data[:len(data) // 2])  # truncated
    data = bytearray(path[32].read_bytes())
    data[len(data) // 2] ^= 0x40  # one bit flipped in the payload
    path[32].write_bytes(bytes(data))
    # A temporary file of a write whose service died (Note [Atomic writes]).
    stale = store / "plans" / f"{first[64]['plan_key']}.answer.tmp-{dead_pid()}-0"
    stale.write_bytes(b"half an answer")

    service = Service(tmp_path, store)
    again = {b: plan(b, service.address) for b in batches}
    for b in batches:
        same_plan(again[b], local[b])
    assert again[64]["from_store"] is True
    assert again[16]["from_store"] is False and again[32]["from_store"] is False
    assert plan(16, service.address)["from_store"] is True  # stored again, whole
    log = service.log()
    assert service.stop() == 0
    for b in (16, 32):  # named once each, with what was wrong
        lines = [line for line in log.splitlines() if first[b]["plan_key"] in line and
                 "removed from the store, planning again" in line]
        assert len(lines) == 1, log
    assert "truncated or corrupted" in log, log
    assert "removed 1 temporary file(s) of unfinished writes" in log, log
    assert not stale.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_a_full_disk_answers_calls_logs_the_failure_and_corrupts_nothing(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    # 16 KiB: room for a profile, not for the graph and the answers.
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(store)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        service = Service(tmp_path, store)
        batches = (8, 16, 32, 64)
        for b in batches:
            answer = plan(b, service.address)
            same_plan(answer, plan(b))
        assert service.process.poll() is None  # still serving
        log = service.log()
        assert service.stop() == 0
        assert "not written" in log and "No space left on device" in log, log
        # Nothing half-written: no temporary file left, and a reopened store reads every
        # entry it has without a complaint.
        leftovers = [p for p in store.rglob("*") if ".tmp-" in p.name]
        assert leftovers == []
        service = Service(tmp_path, store)
        for b in batches:
            same_plan(plan(b, service.address), plan(b))
        log = service.log()
        assert service.stop() == 0
        assert "corrupted" not in log and "truncated" not in log, log
    finally:
        kill_services()  # a service still holding the tmpfs would keep it mounted
        subprocess.run(["umount", str(store)])


def test_a_service_killed_while_it_writes_leaves_a_store_that_answers_every_plan(tmp_path):
    store = tmp_path / "store"
    batches = list(range(8, 8 * 13, 8))  # 12 different plans
    local = {b: plan(b) for b in batches}
    rng = random.Random(31)
    for _ in range(4):  # SIGKILL at a random moment of a burst of calls, 4 times
        service = Service(tmp_path, store)
        with ThreadPoolExecutor(len(batches)) as pool:
            calls = {b: pool.submit(plan, b, service.address) for b in batches}
            time.sleep(rng.uniform(0.0, 0.3))
            service.stop(signal.SIGKILL)
            for b, call in calls.items():
                answer = call.result()  # answered before the kill, or failed: never wrong
                if isinstance(answer, dict):
                    same_plan(answer, local[b])
    stored = {p.name.split(".")[0] for p in store_files(store, ".answer")}
    service = Service(tmp_path, store)
    for b in batches:
        answer = plan(b, service.address)
        same_plan(answer, local[b])
        assert answer["from_store"] is (answer["plan_key"] in stored), answer
    log = service.log()
    assert service.stop() == 0
    assert "corrupted" not in log and "truncated" not in log, log
    assert [p for p in (store / "plans").iterdir() if ".tmp-" in p.name] == []


def test_fifty_clients_with_valid_and_malformed_calls_at_once(tmp_path):
    # One worker: the five new plans wait for it in turn (Note [Call deadlines]), none refused.
    service = Service(tmp_path, tmp_path / "store", ["--workers", "1"])
    sock_path = service.address[len("unix:"):]
    valid = [8, 16, 24, 32, 40] * 5  # 25 valid calls, 5 distinct plans
    local = {b: plan(b) for b in set(valid)}
    refused = {  # well-formed calls the service refuses, naming the problem: (batch, memory)
        "batch": ((0, "16GiB"), "batch_size must be at least 1"),
        "memory": ((8, "1KiB"), "no plan fits"),
    }
    garbage = [b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00",
               bytes(random.Random(5).randrange(256) for _ in range(4096)), b""]

    def valid_call(b):
        answer = plan(b, service.address)
        same_plan(answer, local[b])
        return "ok"

    def refused_call(name):
        (batch, memory), message = refused[name]
        done = plan(batch, service.address, memory)
        assert isinstance(done, subprocess.CompletedProcess), done
        assert message in done.stderr, done.stderr
        return "refused"

    def garbage_call(data):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(30)
            s.connect(sock_path)
            s.sendall(data)
            try:
                s.shutdown(socket.SHUT_WR)
                s.recv(65536)  # whatever the server says, or a closed connection
            except OSError:
                pass
        return "garbage"

    jobs = ([(valid_call, b) for b in valid] + [(refused_call, "batch")] * 7 +
            [(refused_call, "memory")] * 6 + [(garbage_call, g) for g in garbage * 3])
    assert len(jobs) == 50
    random.Random(7).shuffle(jobs)
    with ThreadPoolExecutor(50) as pool:
        results = list(pool.map(lambda job: job[0](job[1]), jobs))
    assert results.count("ok") == 25 and results.count("refused") == 13
    # Still serving, nothing left waiting, and what it stored is right.
    assert service.process.poll() is None
    status = subprocess.run([CLI, "status", "--server", service.address, "--json"],
                            capture_output=True, text=True, check=True)
    assert json.loads(status.stdout)["waiting_for_worker"] == 0
    for b in set(valid):
        answer = plan(b, service.address)
        same_plan(answer, local[b])
        assert answer["from_store"] is True
    assert service.stop() == 0
