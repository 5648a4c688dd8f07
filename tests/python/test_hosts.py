"""autostage across simulated hosts (netns_hosts.py: network namespaces, each with its own
hostname, mpirun starting its daemons in them), healthy and under real faults: a slowed link, a
cut link, a host that dies, a rank stopped with SIGSTOP and a rank killed by the kernel's OOM
killer. Each fault test prints what it injected and when every rank noticed; with HOSTS_RESULTS
set it appends its row to that file, from which `python3 tests/python/test_hosts.py FILE` writes
the table in docs/hosts.md. The jobs run tests/python/hosts_check.py.

Note [Ending mpirun when a host is lost]
Left alone, OpenMPI 4.1's mpirun does not end when a host is cut off (still running 90 s after
the cut when measured; docs/hosts.md): the survivors time out, name the lost ranks and call
MPI_Abort, and mpirun sends the kill order to every daemon, the lost one too. That order waits
unacknowledged in a TCP connection the kernel retransmits for about 15 minutes
(net.ipv4.tcp_retries2), and while data waits TCP sends no keepalive probe. Two MCA
parameters end it (KEEPALIVE, ABORT_DELAY below, and docs/hosts.md's launch line):
- oob_tcp_keepalive_time/_intvl/_probes: mpirun declares a silent daemon lost (and ends the job,
  non-zero, "ORTE has lost communication with a remote daemon") once its connection has been idle
  for keepalive_time and `probes` probes `intvl` apart went unanswered: here 13 + 1 x 2 = 15 s
  after the last packet, later than comm_timeout_s (10) + the liveness probe (2), so the ranks
  name the lost ranks first;
- mpi_abort_delay: a rank calling MPI_Abort waits 5 s before it tells mpirun, so no kill order
  (the data that would stop the keepalive) is sent before 10 + 2 + 5 = 17 s > 15 s.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from mpi_launch import CLI, HERE, ROOT, mpi_env, mpirun_command
from netns_hosts import Hosts, namespace_pids

COMM_TIMEOUT_S = 10
KEEPALIVE = {"oob_tcp_keepalive_time": 13, "oob_tcp_keepalive_intvl": 1,
             "oob_tcp_keepalive_probes": 2}
ABORT_DELAY_S = 5
# mpirun declares a silent daemon lost this long after its last packet (13 + 1 x 2 s)
LOST_DAEMON_S = KEEPALIVE["oob_tcp_keepalive_time"] + (KEEPALIVE["oob_tcp_keepalive_intvl"]
                                                        * KEEPALIVE["oob_tcp_keepalive_probes"])
# Beyond a bound, slack for a machine at ten times the load (a hang runs into JOB_LIMIT_S).
SLACK_S = 10
JOB_LIMIT_S = 300

REASON = Hosts.unavailable()
# What is tested is MPI's and the comm layer's handling of hosts and faults: the same on both legs
# (conftest.py), and at 173 s the 2.x leg's slowest file.
pytestmark = [pytest.mark.skipif(REASON is not None, reason=str(REASON)),
              pytest.mark.leg_independent]


def ending_options():
    """Note [Ending mpirun when a host is lost]: the MCA parameters of the documented launch."""
    options = []
    for name, value in KEEPALIVE.items():
        options += ["--mca", name, str(value)]
    return options + ["--mca", "mpi_abort_delay", str(ABORT_DELAY_S)]


@pytest.fixture
def hosts():
    with Hosts(2) as made:
        yield made


@pytest.fixture
def folder():
    path = tempfile.mkdtemp(prefix="autostage_hosts_test_")
    yield path
    shutil.rmtree(path, ignore_errors=True)


class Job:
    """One mpirun in its own session, its output in `folder`/mpirun.log; the ranks' own lines in
    `folder`/rank<r>.log and exit<r>.log (HOSTS_CHECK_DIR)."""

    running = []  # killed (the whole session) at the end of every test, whatever happened

    def __init__(self, command, env, folder):
        self.folder = folder
        self.log_path = os.path.join(folder, "mpirun.log")
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(command, env=env, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        Job.running.append(self)
        self.ended = None

    def output(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def rank_lines(self):
        text = ""
        for name in sorted(os.listdir(self.folder)):
            if re.fullmatch(r"(rank|exit)\d+\.log", name):
                with open(os.path.join(self.folder, name), errors="replace") as f:
                    text += f.read()
        return text

    def wait_for_step(self, step, ranks, limit=240):
        """Waits until every rank has finished `step` (the job has planned and trains)."""
        deadline = time.time() + limit
        while time.time() < deadline:
            done = set(map(int, re.findall(rf"^STEP {step} rank (\d+) ", self.rank_lines(),
                                           re.M)))
            if done >= set(range(ranks)):
                return
            assert self.process.poll() is None, f"the job ended early:\n{self.output()}"
            time.sleep(0.2)
        raise AssertionError(f"no step {step} on every rank in {limit} s:\n{self.output()}")

    def wait(self, limit=JOB_LIMIT_S):
        """mpirun's exit status and the time it ended; kills the job if it outlives `limit`."""
        try:
            status = self.process.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"mpirun still ran after {limit} s:\n{self.output()}")
        self.ended = time.time()
        return status

    def kill(self):
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=60)


@pytest.fixture(autouse=True)
def no_job_left():
    yield
    while Job.running:
        Job.running.pop().kill()


def driver(*args):
    """hosts_check.py under a shell that records each rank's exit status and time in the shared
    folder (a rank cut off from mpirun cannot print there) and ends as the rank did."""
    record = ('"$@"; s=$?; echo "EXIT rank $OMPI_COMM_WORLD_RANK status $s at $(date +%s.%N)" '
              '>> "$HOSTS_CHECK_DIR/exit$OMPI_COMM_WORLD_RANK.log"; '
              # killed by a signal: so is the shell, for mpirun to see it
              '[ $s -gt 128 ] && kill -$((s - 128)) $$; exit $s')
    return ["sh", "-c", record, "sh", sys.executable, os.path.join(HERE, "hosts_check.py"),
            *map(str, args)]


def launch(hosts, args, folder, ranks_per_host=2, recovery=False, **extra):
    """mpirun of `args` across `hosts` with the documented ending options (a Job)."""
    env = mpi_env(AUTOSTAGE_COMM_TIMEOUT_S=str(COMM_TIMEOUT_S), HOSTS_CHECK_DIR=folder, **extra)
    passed = ["-x", "HOSTS_CHECK_DIR"] + (["-x", "HOSTS_CHECK_CGROUP"]
                                          if "HOSTS_CHECK_CGROUP" in extra else [])
    command = mpirun_command(args, env, recovery, ranks_per_host * len(hosts.names),
                             [*hosts.mpirun_options(ranks_per_host), *ending_options(), *passed])
    return Job(hosts.wrap(command), env, folder)


def rank_hosts(text):
    return {int(rank): host for rank, host in re.findall(r"^STEP \d+ rank (\d+) on (\S+)",
                                                         text, re.M)}


def noticed(text, since):
    """rank -> (seconds after `since`, the ranks its liveness probe named, the message)."""
    found = {}
    for rank, when, message in re.findall(r"^NOTICED rank (\d+) at ([\d.]+): (.*)$", text, re.M):
        named = re.search(r"no answer within [\d.]+ s from ranks? ([\d,]+)", message)
        found[int(rank)] = (float(when) - since,
                            set(map(int, named.group(1).split(","))) if named else set(),
                            message)
    return found


def exits(text, since):
    return {int(rank): (int(status), float(when) - since) for rank, status, when in
            re.findall(r"^EXIT rank (\d+) status (\d+) at ([\d.]+)", text, re.M)}


def record(fault, ranks, launcher, exit_s, lost):
    """One row of docs/hosts.md's table (HOSTS_RESULTS) and the same on stdout."""
    row = {"fault": fault, "ranks": ranks, "launcher": launcher, "exit_s": exit_s, "lost": lost}
    print(json.dumps(row, indent=1))
    if os.environ.get("HOSTS_RESULTS"):
        with open(os.environ["HOSTS_RESULTS"], "a") as f:
            f.write(json.dumps(row) + "\n")


def check_survivors(job, injected, lost_ranks, survivors, must_exit=False):
    """Every survivor noticed within comm_timeout_s + 10 s naming every lost rank (and, with
    `must_exit`, exited non-zero by then, give or take SLACK_S); returns what each did."""
    text = job.rank_lines()
    seen, ended = noticed(text, injected), exits(text, injected)
    for rank in survivors:
        assert rank in seen, (rank, job.output(), text)
        after, named, message = seen[rank]
        print(f"rank {rank} noticed {after:.1f} s after the fault: {message[:160]}...")
        assert COMM_TIMEOUT_S - 1 <= after <= COMM_TIMEOUT_S + 10, (rank, after, message)
        assert set(lost_ranks) <= named, (rank, lost_ranks, message)
        assert rank in ended or not must_exit, (rank, text)
        if rank in ended:  # else mpirun killed it (while it waited out mpi_abort_delay)
            assert ended[rank][0] != 0, (rank, ended[rank])
            assert ended[rank][1] <= COMM_TIMEOUT_S + 10 + SLACK_S, (rank, ended[rank])
    return {rank: (seen[rank][0], ended.get(rank)) for rank in survivors}


def describe(reactions, job, injected):
    parts = []
    for rank, (after, ended) in sorted(reactions.items()):
        end = (f"exited {ended[1]:.1f} s (status {ended[0]})" if ended
               else f"killed by mpirun by {job.ended - injected:.1f} s")
        parts.append(f"rank {rank}: named the lost ranks at {after:.1f} s, {end}")
    return "; ".join(parts)


def test_two_hosts_train_like_one_host(hosts, folder):
    """2 hosts x 2 ranks, 2 stages: the ranks see two hostnames, the saved plan names them (show,
    report), and the losses equal, to the last bit, those of a one-host run of the same plan
    (saved, then loaded)."""
    plan = os.path.join(folder, "plan.pb")
    two = launch(hosts, driver("train", 3), folder, AUTOSTAGE_PARTITION_NUM="2",
                 AUTOSTAGE_SAVE_DEPLOYMENT="true", AUTOSTAGE_DEPLOYMENT_FILE=plan,
                 AUTOSTAGE_MEM_LIMIT_GB="1")  # one memory for both runs: the plan fits both
    assert two.wait() == 0, two.output()
    log = two.output() + two.rank_lines()
    placed = dict((int(r), h) for r, h in re.findall(r"^DONE rank (\d+) on (\S+)", log, re.M))
    assert placed == {0: hosts.names[0], 1: hosts.names[0], 2: hosts.names[1],
                      3: hosts.names[1]}, log
    assert "4 rank(s), 2 per node" in log, log
    # Note [Hosts in the log]: the partition log names the hosts of the ranks and of the stages.
    h0, h1 = hosts.names
    assert f"Hosts: {h0} (ranks 0,1), {h1} (ranks 2,3)" in log, log
    stages = re.search(r"Stages on hosts: (.*)", log)
    assert stages, log
    named = re.findall(r"(\S+) \(ranks ([\d,]+)\)", stages.group(1))
    assert sorted(int(r) for _, ranks in named for r in ranks.split(",")) == [0, 1, 2, 3], log
    for host, ranks in named:  # each stage's ranks under the host they ran on
        assert all(placed[int(r)] == host for r in ranks.split(",")), (host, ranks, log)
    check_saved_hosts(plan, stages.group(1), hosts.names)
    alone = os.path.join(folder, "one")
    os.mkdir(alone)
    env = mpi_env(AUTOSTAGE_LOAD_DEPLOYMENT="true", AUTOSTAGE_DEPLOYMENT_FILE=plan,
                  AUTOSTAGE_MEM_LIMIT_GB="1", HOSTS_CHECK_DIR=alone)
    one = Job(mpirun_command(driver("train", 3), env, ranks=4), env, alone)
    assert one.wait() == 0, one.output()
    losses = {}
    for name, text in (("two hosts", two.rank_lines()), ("one host", one.rank_lines())):
        losses[name] = sorted(re.findall(r"^LOSS \d+ rank \d+: \S+$", text, re.M))
        assert len(losses[name]) == 12, text
    print("losses, two hosts:", losses["two hosts"])
    assert losses["two hosts"] == losses["one host"]


def check_saved_hosts(plan, logged, names):
    """Note [Hosts of a deployment]: `autostage show` and `autostage report` of the saved plan
    name both hosts with their ranks, and each host's stages as the log's `Stages on hosts:`
    line (`logged`) placed them."""
    h0, h1 = names
    shown = subprocess.run([CLI, "show", plan], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert f"hosts: {h0} (ranks 0,1), {h1} (ranks 2,3)\n" in shown.stdout, shown.stdout
    assert f"stages on hosts: {logged}\n" in shown.stdout, (logged, shown.stdout)
    stages_on = {host: set() for host in names}
    for part in logged.split("; "):
        stage, where = part.split(" on ", 1)
        for host in re.findall(r"(\S+) \(ranks", where):
            stages_on[host].add(stage)
    html = plan + ".html"
    report = subprocess.run([CLI, "report", plan, "-o", html], capture_output=True, text=True,
                            timeout=60)
    assert report.returncode == 0, report.stdout + report.stderr
    with open(html) as f:
        page = f.read()
    table = re.search(r'<table id="hosts">(.*?)</table>', page, re.S)
    assert table, page
    rows = re.findall(r'<tr><td class="left">([^<]+)</td><td>([\d,-]+)</td>'
                      r'<td class="left">(.*?)</td></tr>', table.group(1))
    assert [(host, ranks) for host, ranks, _ in rows] == [(h0, "0-1"), (h1, "2-3")], rows
    for host, _, cell in rows:
        assert set(re.findall(r"S\d+ (\S+?)</span>", cell)) == stages_on[host], (host, cell)
    print(f"autostage show and report name {h0} and {h1}: {logged}")


@pytest.mark.parametrize("fault", ["link cut", "host dies"])
def test_lost_host_ends_every_rank_and_mpirun(hosts, folder, fault):
    """After step 1 host 1's link is cut (its ranks live on), or host 1 dies (link cut, then
    every process there SIGKILLed: no FIN or reset reaches host 0). Every surviving rank names
    the ranks of the other side within comm_timeout_s + 10 s, mpirun ends non-zero within
    LOST_DAEMON_S (+ slack) and (host dies) the checkpoint of step 1 resumes on host 0 alone."""
    checkpoint = os.path.join(folder, "step1.pt")
    job = launch(hosts, driver("run", "--checkpoint", checkpoint), folder)
    job.wait_for_step(1, 4)
    injected = time.time()
    killed = hosts.kill_host(1) if fault == "host dies" else hosts.cut(1)
    print(f"injected: {fault} of host 1 ({hosts.names[1]}: ranks 2, 3)"
          + (f", SIGKILL to its {len(killed)} processes" if killed else ""))
    status = job.wait()
    took = job.ended - injected
    output = job.output()
    print(f"mpirun ended with status {status} {took:.1f} s after the fault")
    assert status != 0, output
    assert took <= LOST_DAEMON_S + SLACK_S, (took, output)
    assert "ORTE has lost communication with a remote daemon" in output, output
    hosts_of = rank_hosts(job.rank_lines())
    assert hosts_of == {0: hosts.names[0], 1: hosts.names[0], 2: hosts.names[1],
                        3: hosts.names[1]}, hosts_of
    reactions = check_survivors(job, injected, [2, 3], [0, 1])
    left = []
    if fault == "link cut":  # the other side names ranks 0 and 1 in the shared folder
        deadline = injected + COMM_TIMEOUT_S + 10 + SLACK_S
        while time.time() < deadline and not {2, 3} <= set(exits(job.rank_lines(), 0)):
            time.sleep(0.5)
        reactions.update(check_survivors(job, injected, [0, 1], [2, 3], must_exit=True))
        left = running_on(hosts, 1)
        print(f"still running on the cut-off host {time.time() - injected:.1f} s after the "
              f"cut: {left or 'nothing'}")
    lost = "the steps after the step-1 checkpoint"
    if fault == "host dies":  # resuming after a cut link is the same (one case is enough)
        lost += "; " + resume_on_host0(hosts, checkpoint, folder)
    record(fault + " (host 1 of 2, after step 1)", describe(reactions, job, injected),
           f"mpirun exited with status {status} at {took:.1f} s: ORTE has lost communication "
           f"with a remote daemon" + (f"; left on host 1: {', '.join(left)}" if left else ""),
           round(took, 1), lost)


def running_on(hosts, index):
    """The names of the programs running on host `index`."""
    names = set()
    for pid in namespace_pids(hosts.names[index]):
        try:
            with open(f"/proc/{pid}/comm") as f:
                names.add(f.read().strip())
        except OSError:
            pass  # it ended meanwhile
    return sorted(names)


def resume_on_host0(hosts, checkpoint, folder):
    """The job on fewer hosts: 2 ranks on host 0 load the checkpoint and train a step."""
    assert os.path.exists(checkpoint)
    sub = os.path.join(folder, "resume")
    os.mkdir(sub)
    env = mpi_env(HOSTS_CHECK_DIR=sub)
    options = ["--host", f"{hosts.names[0]}:2", "--mca", "btl", "self,vader"]
    run = subprocess.run(hosts.wrap(mpirun_command(
        driver("train", 1, "--resume", checkpoint), env, ranks=2, options=options)),
        env=env, capture_output=True, text=True, timeout=JOB_LIMIT_S)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log
    resumed = "".join(open(os.path.join(sub, f"rank{rank}.log")).read() for rank in (0, 1))
    assert sorted(re.findall(r"^RESUMED rank (\d)", resumed, re.M)) == ["0", "1"], log
    return "resumed from it on 2 ranks of host 0"


class MemoryCgroup:
    """A memory cgroup (v2, else v1) limited to LIMIT: a process that enters it and allocates
    more is killed by the kernel's OOM killer. `procs` is None where none can be made."""

    LIMIT = 64 << 20

    def __init__(self):
        self.path, self.procs = None, None
        self.name = name = f"autostage_hosts_oom_{os.getpid()}"
        root_v2, root_v1 = "/sys/fs/cgroup", "/sys/fs/cgroup/memory"
        try:
            if os.path.exists(f"{root_v2}/cgroup.controllers"):
                with open(f"{root_v2}/cgroup.subtree_control") as f:
                    if "memory" not in f.read().split():
                        return
                self.path, limits = f"{root_v2}/{name}", ("memory.max", "memory.swap.max")
                self.events = ("memory.events", "oom_kill")
            elif os.path.isdir(root_v1):
                self.path = f"{root_v1}/{name}"
                limits = ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes")
                self.events = ("memory.oom_control", "oom_kill")
            else:
                return
            os.mkdir(self.path)
            for limit in limits:
                if os.path.exists(f"{self.path}/{limit}"):
                    with open(f"{self.path}/{limit}", "w") as f:
                        f.write("0" if limit == "memory.swap.max" else str(self.LIMIT))
            self.procs = f"{self.path}/cgroup.procs"
        except OSError as error:
            print(f"no memory cgroup ({error}): the OOM kill is simulated")
            self.close()

    def enter(self, job, limit=240):
        """Moves the rank that waits for it (hosts_check.py's oom fault) into this cgroup."""
        deadline = time.time() + limit
        while time.time() < deadline:
            waiting = re.search(r"^OOM rank \d+ pid (\d+) waits", job.rank_lines(), re.M)
            if waiting:
                with open(self.procs, "w") as f:
                    f.write(waiting.group(1))
                return
            assert job.process.poll() is None, job.output()
            time.sleep(0.2)
        raise AssertionError(f"no rank waited for the cgroup:\n{job.output()}")

    def kind(self):
        return "cgroup v2" if self.path and "/memory/" not in self.path else "cgroup v1"

    def oom_kills(self):
        with open(f"{self.path}/{self.events[0]}") as f:
            found = re.search(rf"^{self.events[1]} (\d+)", f.read(), re.M)
        return int(found.group(1)) if found else None

    def close(self):
        for _ in range(100):  # its one process is gone once the job was killed
            try:
                if self.path and os.path.isdir(self.path):
                    os.rmdir(self.path)
                break
            except OSError:
                time.sleep(0.1)
        self.path, self.procs = None, None


@pytest.fixture
def memory_cgroup():
    made = MemoryCgroup()
    yield made
    made.close()


def run_rank_fault(hosts, folder, kind, recovery=False, cgroup=None, **extra):
    """Rank 3 (host 1) makes fault `kind` after step 1 and mpirun must end in time (non-zero
    unless under --enable-recovery, where it exits 0 whatever the ranks did). Returns (job,
    seconds from the fault to mpirun's end)."""
    job = launch(hosts, driver("run", "--fault", kind), folder, recovery=recovery, **extra)
    if cgroup:
        cgroup.enter(job)
    status = job.wait()
    text = job.rank_lines()
    fault = re.search(r"^FAULT \w+ rank 3 at ([\d.]+)", text, re.M)
    assert fault, (job.output(), text)
    injected = float(fault.group(1))
    took = job.ended - injected
    print(f"injected: {kind} of rank 3 (host 1) after step 1"
          f"{' under --enable-recovery' if recovery else ''}; mpirun ended with status "
          f"{status} {took:.1f} s later")
    assert (status == 0) == recovery, job.output()
    # The survivors abort (after mpi_abort_delay) and mpirun reaches every daemon.
    assert took <= COMM_TIMEOUT_S + 10 + ABORT_DELAY_S + SLACK_S, (took, job.output())
    return job, injected


def test_stopped_rank_is_named(hosts, folder):
    """Rank 3 stops itself with SIGSTOP: alive to the kernel and to mpirun, silent to MPI. Ranks
    0-2 name it within comm_timeout_s + 10 s."""
    job, injected = run_rank_fault(hosts, folder, "stop")
    reactions = check_survivors(job, injected, [3], [0, 1, 2])
    took = job.ended - injected
    record("rank 3 stopped (SIGSTOP) on host 1", describe(reactions, job, injected),
           f"mpirun killed the job (the stopped rank too) and exited with status "
           f"{job.process.returncode} at {took:.1f} s", round(took, 1),
           "the steps after the last checkpoint")


@pytest.mark.parametrize("recovery", [False, True], ids=["default", "enable-recovery"])
def test_oom_killed_rank_is_named(hosts, folder, memory_cgroup, recovery):
    """Rank 3 enters a memory cgroup of 64 MiB and allocates: the kernel's OOM killer kills it.
    Launched as documented, mpirun sees its daemon's child die, names it and ends the job at once;
    under --enable-recovery (as test_bad_input.py's SIGKILL) ranks 0-2 name it within
    comm_timeout_s + 10 s."""
    extra, cgroup = {}, None
    if memory_cgroup.procs:
        extra, cgroup = {"HOSTS_CHECK_CGROUP": memory_cgroup.name}, memory_cgroup
    job, injected = run_rank_fault(hosts, folder, "oom", recovery, cgroup, **extra)
    text, output = job.rank_lines(), job.output()
    died = exits(text, injected).get(3)
    assert died and died[0] == 128 + signal.SIGKILL, (died, text)
    how = "simulated (SIGKILL)"
    if memory_cgroup.procs:
        kills = memory_cgroup.oom_kills()
        assert kills is None or kills >= 1, kills
        how = f"the OOM killer ({memory_cgroup.LIMIT >> 20} MiB memory {memory_cgroup.kind()})"
    print(f"rank 3 killed by {how} {died[1]:.1f} s after it began allocating")
    took = job.ended - injected
    if recovery:
        reactions = describe(check_survivors(job, injected, [3], [0, 1, 2]), job, injected)
        launcher = (f"mpirun exited with status 0 (--enable-recovery) at {took:.1f} s, after "
                    f"the survivors' MPI_Abort")
    else:
        named = re.search(r"mpirun noticed that process rank 3 with PID \d+ on node (\S+) "
                          r"exited on signal 9", output)
        assert named and named.group(1) == hosts.names[1], output
        print(f"mpirun said: {named.group(0)}")
        assert "NOTICED" not in text, text  # no rank waited: mpirun ended the job first
        reactions = f"ranks 0-2: killed by mpirun by {took:.1f} s"
        launcher = (f"mpirun named rank 3 (\"exited on signal 9 (Killed)\") and exited with "
                    f"status {job.process.returncode} at {took:.1f} s")
    record(f"rank 3 killed by {how} on host 1"
           f"{', mpirun --enable-recovery' if recovery else ''}", reactions, launcher,
           round(took, 1), "the steps after the last checkpoint")


def test_slow_link_is_measured_and_replicas_stay_inside_a_host(hosts, folder):
    """Host 1's link slowed to 1 Gbit/s (netem with 2 ms delay where the kernel has it, else
    tbf): the comm profile measures the inter-host link at most that fast and slower than the
    one inside a host, and no stage's replicas (whose gradient allreduce moves every parameter)
    span the two hosts. A model of 4 x 512 x 512: 2 MiB of parameters per stage."""
    applied = hosts.shape(1, "1gbit", "2ms")
    print(f"injected: host 1's link slowed: {applied}")
    job = launch(hosts, driver("train", 2, "--width", 512), folder,
                 AUTOSTAGE_MEASURE_COMM="true")
    assert job.wait() == 0, job.output()
    log, text = job.output(), job.rank_lines()
    profile = re.search(r"comm profile over 4 ranks on 2 hosts: p2p intra [\d.]+ us \+ ([\d.]+) "
                        r"GB/s, inter [\d.]+ us \+ ([\d.]+) GB/s", log)
    assert profile, log
    intra, inter = map(float, profile.groups())
    print(f"measured p2p: {intra} GB/s inside a host, {inter} GB/s between hosts")
    assert inter <= 1.1 * 1e9 / 8 / 1e9, profile.group(0)  # 1 Gbit/s = 0.125 GB/s
    assert inter < intra, profile.group(0)
    placed = {int(r): h for r, h in re.findall(r"^DONE rank (\d+) on (\S+)", text, re.M)}
    assert sorted(placed) == [0, 1, 2, 3], text
    stages = re.findall(r"Assigned subgraph (\S+) to rank\[([\d,]+)\]", log)
    assert stages, log
    where = []
    for stage, ranks in stages:
        on = {placed[int(rank)] for rank in ranks.split(",")}
        where.append(f"{stage} on ranks {ranks} (host {hosts.names.index(on.pop())})")
        assert not on, (stage, ranks, placed)  # one host only
    print("; ".join(where))
    record("host 1's link slowed to 1 Gbit/s (" + applied.split(" root ")[1] + ")",
           f"measured {inter} GB/s between hosts, {intra} GB/s inside one; planned "
           + "; ".join(where) + "; trained", "mpirun exited with status 0", None, "none")


@pytest.mark.skipif(not os.path.exists(CLI), reason="the autostage CLI missing")
def test_job_plans_locally_when_its_service_on_another_host_dies(hosts, folder):
    """A job on 2 hosts asks the planning service running on host 1, which is frozen (SIGSTOP)
    and then killed (SIGKILL) while the job waits for its plan: the job plans here, says so, and
    its output equals plain PyTorch on every rank (planner_service_check.py)."""
    address = f"tcp:{hosts.address(1)}:7071"
    with open(os.path.join(folder, "service.log"), "w") as log:
        service = subprocess.Popen(
            hosts.wrap([CLI, "serve", "--listen", address, "--store",
                        os.path.join(folder, "store")], host=1),
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        for _ in range(600):  # bounded wait for it to answer from host 0 (not a speed check)
            assert service.poll() is None, open(os.path.join(folder, "service.log")).read()
            if subprocess.run(hosts.wrap([CLI, "status", "--server", address, "--timeout-s",
                                          "2"]), capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        else:
            raise AssertionError("the planning service on host 1 did not answer")
        service.send_signal(signal.SIGSTOP)
        job = launch(hosts, [sys.executable, os.path.join(HERE, "planner_service_check.py"),
                             address], folder)
        deadline = time.time() + 240
        while "Asking the planning service" not in job.output() and time.time() < deadline:
            assert job.process.poll() is None, job.output()
            time.sleep(0.1)
        asked = time.time()
        service.send_signal(signal.SIGKILL)
        assert job.wait() == 0, job.output()
        took = job.ended - asked
    finally:
        if service.poll() is None:
            service.kill()
        service.wait(timeout=60)
    output = job.output()
    assert "Asking the planning service" in output, output
    assert "planning locally" in output, output
    for rank in range(4):
        assert f"rank {rank}: planner service run ok" in output, output
    print(f"the service on host 1 killed while the job waited: the job planned locally and "
          f"ended {took:.1f} s later")
    record("the planning service (on host 1) frozen, then killed while a job waits for its plan",
           "planned locally (the log says why) and trained, equal to plain PyTorch",
           "mpirun exited with status 0", None, "none")


TABLE_BEGIN = "<!-- hosts results: generated by `python3 tests/python/test_hosts.py FILE` -->"
TABLE_END = "<!-- end of hosts results -->"


def write_table(results, doc=os.path.join(ROOT, "docs", "hosts.md")):
    """Replaces docs/hosts.md's results table with the rows of `results` (HOSTS_RESULTS)."""
    with open(results) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    lines = [TABLE_BEGIN, "", "| fault | what the ranks did (seconds after the fault) | what "
             "mpirun did | mpirun ended after | data lost |", "|---|---|---|---|---|"]
    for row in rows:
        ended = "" if row["exit_s"] is None else f"{row['exit_s']} s"
        lines.append(f"| {row['fault']} | {row['ranks']} | {row['launcher']} | {ended} | "
                     f"{row['lost']} |")
    with open(doc) as f:
        text = f.read()
    begin, end = text.index(TABLE_BEGIN), text.index(TABLE_END)
    with open(doc, "w") as f:
        f.write(text[:begin] + "\n".join(lines) + "\n\n" + text[end:])


if __name__ == "__main__":
    write_table(sys.argv[1])
