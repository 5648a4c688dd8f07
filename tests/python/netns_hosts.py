"""Simulated hosts for the multi-host tests (test_hosts*.py): each host is a network namespace
with its own hostname, joined to the others through a bridge in a "switch" namespace by one veth
link per host, and mpirun starts its remote daemons through an rsh agent that enters the host's
namespace (Note [Hosts from namespaces]). Needs root and `ip netns`; `Hosts.unavailable()` says
why not, for a skip.

Note [Hosts from namespaces]
Ranks on one host must share memory, ranks on two hosts must not: OpenMPI decides this by the
node name its daemon reports, and autostage groups ranks into hosts by gethostname() (its comm
profile and the planner's ranks per node). So every host runs in its own UTS namespace
(`unshare --uts`, hostname set) as well as its own network namespace, and mpirun itself starts in
host 0's. The rsh agent mpirun runs as `agent HOST orted ARGS...` (as it would run ssh) maps the
name to the namespace; no name resolution is needed, since the daemons call back to mpirun by
the addresses in its URI. The TCP transports are kept to the hosts' subnet: the namespaces have no
other interface but loopback. A link is one veth pair: host side `eth0`, switch side `p<i>`; `tc`
on both ends shapes it (netem, or tbf where the kernel lacks netem); taken down at the switch, it
is cut.

Note [Agent outlives a dead host]
The agent is mpirun's child, as ssh would be, and the daemon is the agent's child (in the host's
namespaces). When a daemon dies, mpirun would learn it at once from its child's exit; with a
real host that loses power, ssh learns nothing (no FIN, no reset) and keeps running. So a host
made to die leaves a marker that keeps its agent waiting (until mpirun or close() ends it), and
mpirun must find the loss through the network, as it would.

Every name carries the creating process's pid (`ash<pid>x<n>`): a later run deletes namespaces
whose creator has died (a test killed with SIGKILL runs no finalizer), and concurrent runs never
meet. Nothing is created outside the namespaces except the agent script in a temporary folder.
"""
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time

SUBNET = "10.77.0"  # inside the namespaces only: nothing outside them sees these addresses
_PREFIX = "ash"
_counter = [0]


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


def _alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def namespace_pids(namespace):
    run = _ip("netns", "pids", namespace, check=False)
    return [int(p) for p in run.stdout.split()]


def kill_namespace(namespace, sig=signal.SIGKILL):
    """Sends `sig` to every process in `namespace` (its daemon, its ranks); returns their pids."""
    pids = namespace_pids(namespace)
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    return pids


def _delete_namespace(namespace):
    # Processes first: a namespace with live processes outlives `ip netns del` (only its name goes).
    for _ in range(50):
        if not kill_namespace(namespace):
            break
        time.sleep(0.1)
    _ip("netns", "del", namespace, check=False)


def remove_stale():
    """Deletes the namespaces of earlier runs whose creating process is gone."""
    listing = _ip("netns", "list", check=False).stdout
    for name in re.findall(rf"^({_PREFIX}(\d+)x\d+\S*)", listing, re.M):
        if not _alive(int(name[1])):
            _delete_namespace(name[0])


class Hosts:
    """`count` hosts named `<base>h0`.. with addresses SUBNET.1.. . Use as a context manager (or
    call close()): it deletes the namespaces and kills what runs in them, whatever happened."""

    def __init__(self, count):
        remove_stale()
        _counter[0] += 1
        self.base = f"{_PREFIX}{os.getpid()}x{_counter[0]}"
        self.names = [f"{self.base}h{i}" for i in range(count)]  # hostname == namespace name
        self.switch = f"{self.base}sw"
        self.folder = tempfile.mkdtemp(prefix="autostage_hosts_")
        self.agent = os.path.join(self.folder, "rsh_agent.sh")
        self._created = []
        try:
            self._create()
        except BaseException:
            self.close()
            raise

    def _create(self):
        for namespace in [self.switch] + self.names:
            _ip("netns", "add", namespace)
            self._created.append(namespace)
            _ip("-n", namespace, "link", "set", "lo", "up")
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for i, host in enumerate(self.names):
            port = f"p{i}"
            _ip("-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", "eth0",
                "netns", host)
            _ip("-n", self.switch, "link", "set", port, "master", "br0", "up")
            _ip("-n", host, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
            _ip("-n", host, "link", "set", "eth0", "up")
        cases = "".join(f"  {host}) ;;\n" for host in self.names)
        with open(self.agent, "w") as f:
            # mpirun passes the daemon's command as words a remote shell would join and parse.
            # Note [Agent outlives a dead host]: the agent waits for the daemon as ssh would.
            f.write("#!/bin/sh\nhost=$1; shift\ncase $host in\n" + cases +
                    '  *) echo "rsh agent: no simulated host $host" >&2; exit 1 ;;\nesac\n'
                    'ip netns exec "$host" unshare --uts sh -c '
                    '\'hostname "$0" && exec sh -c "$1"\' "$host" "$*"\nstatus=$?\n'
                    f'while [ -e "{self.folder}/$host.dead" ]; do sleep 1; done\n'
                    'exit $status\n')
        os.chmod(self.agent, 0o755)

    def address(self, index):
        return f"{SUBNET}.{index + 1}"

    def mpirun_options(self, ranks_per_host):
        """mpirun options placing `ranks_per_host` ranks on each host, daemons started through
        the agent, TCP kept to the hosts' subnet."""
        hosts = ",".join(f"{host}:{ranks_per_host}" for host in self.names)
        subnet = f"{SUBNET}.0/24"
        return ["--host", hosts, "--mca", "plm_rsh_agent", self.agent,
                "--mca", "btl", "self,vader,tcp", "--mca", "btl_tcp_if_include", subnet,
                "--mca", "oob_tcp_if_include", subnet]

    def wrap(self, command, host=0):
        """`command` run in host `host`'s namespaces (where mpirun starts)."""
        name = self.names[host]
        return ["ip", "netns", "exec", name, "unshare", "--uts", "sh", "-c",
                'hostname "$0" && exec "$@"', name, *command]

    def cut(self, index):
        """Takes host `index`'s link down at the switch: nothing reaches it or leaves it, and
        no connection is closed (as when a cable is pulled)."""
        _ip("-n", self.switch, "link", "set", f"p{index}", "down")

    def shape(self, index, rate, delay):
        """Slows both directions of host `index`'s link to `rate` (tc units: "1gbit") with
        `delay` ("2ms") added: `netem` where the kernel has it, else `tbf` (rate only; this
        returns which was applied, as a tc command line)."""
        applied = None
        for qdisc in (["netem", "delay", delay, "rate", rate, "limit", "100000"],
                      ["tbf", "rate", rate, "burst", "256kb", "latency", "100ms"]):
            runs = [subprocess.run(["ip", "netns", "exec", namespace, "tc", "qdisc", "replace",
                                    "dev", device, "root", *qdisc],
                                   capture_output=True, text=True, timeout=30)
                    for namespace, device in ((self.switch, f"p{index}"),
                                              (self.names[index], "eth0"))]
            if all(run.returncode == 0 for run in runs):
                applied = "tc qdisc replace dev <link> root " + " ".join(qdisc)
                break
        assert applied, f"neither netem nor tbf could shape the link: {runs[-1].stderr}"
        return applied

    def kill_host(self, index):
        """Host `index` dies: its link is cut first (so no connection is closed by a FIN or a
        reset, as when a machine loses power), then all its processes are SIGKILLed; its agent
        stays (Note [Agent outlives a dead host])."""
        open(os.path.join(self.folder, f"{self.names[index]}.dead"), "w").close()
        self.cut(index)
        return kill_namespace(self.names[index])

    def close(self):
        for namespace in reversed(self._created):
            _delete_namespace(namespace)
        self._created = []
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @staticmethod
    def unavailable():
        """Why hosts cannot be made here (a skip reason), or None."""
        if os.geteuid() != 0:
            return "simulated hosts need root (network namespaces); CI runs as root"
        for tool in ("ip", "tc", "unshare", "mpirun"):
            if shutil.which(tool) is None:
                return f"simulated hosts need {tool}, not installed"
        probe = f"{_PREFIX}{os.getpid()}xprobe"
        made = _ip("netns", "add", probe, check=False)
        if made.returncode != 0:
            return f"cannot create a network namespace: {made.stderr.strip()}"
        _ip("netns", "del", probe, check=False)
        return None
