"""`autostage report` renders in headless Chromium: a plan of a synthetic model becomes an HTML page
whose SVG pictures exist in the browser's DOM and whose screenshot is a real picture.

Needs the `autostage` CLI of this build (build/bindings/cli/autostage, or $AUTOSTAGE_CLI) and the
Debian `chromium` package (scripts/common.sh installs it); skips only when chromium is missing."""
import json
import re
import os
import shutil
import subprocess
from html.parser import HTMLParser

import pytest

from mpi_launch import CLI
CHROMIUM = shutil.which("chromium")
WIDTH, HEIGHT = 1200, 1700
STAGE0_LIGHT = (0x7F, 0xB3, 0xE0)  # stageColor(0) in bindings/cli/svg.cpp


def run(*args):
    done = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{args} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


class Elements(HTMLParser):
    """Collects (tag, attributes) of every start tag of the dumped DOM."""

    def __init__(self):
        super().__init__()
        self.items = []

    def handle_starttag(self, tag, attrs):
        self.items.append((tag, dict(attrs)))

    def handle_startendtag(self, tag, attrs):
        self.items.append((tag, dict(attrs)))

    def having(self, tag, cls):
        return [a for t, a in self.items if t == tag and cls in a.get("class", "").split()]


def chromium(*args):
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", *args],
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    assert os.path.exists(CLI), f"autostage CLI not built at {CLI}"
    d = tmp_path_factory.mktemp("report")
    pb = str(d / "plan.pb")
    run(CLI, "plan", "--synthetic", "gpt:layers=8,hidden=1024,heads=16,seq=512", "--devices", "8",
        "--devices-per-node", "4", "--device-memory", "16GiB", "--batch", "64", "--out", pb)
    return d, pb, json.loads(run(CLI, "plan", "--synthetic", "gpt:layers=8,hidden=1024,heads=16,seq=512",
                                 "--devices", "8", "--devices-per-node", "4", "--device-memory",
                                 "16GiB", "--batch", "64", "--json"))


def write_trace(path, stages, micro_batches):
    """A two-step Chrome trace, one rank per stage, as the runtime writes it."""
    events = []
    for step in (0, 1):
        for s in range(stages):
            for m in range(micro_batches):
                base = step * 1e6 + (s + m) * 1000
                for name, offset in (("forward", 0), ("backward", 20000)):
                    events.append({"name": name, "ph": "X", "ts": base + offset, "dur": 800, "pid": s,
                                   "tid": 0, "args": {"stage": s, "micro_batch": m, "step": step}})
    with open(path, "w") as f:
        json.dump({"traceEvents": events}, f)


@pytest.mark.leg_independent  # the CLI's HTML of a synthetic plan (conftest.py)
def test_report_renders_in_headless_chromium(plan):
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (apt-get install chromium; scripts/common.sh lists it)")
    d, pb, summary = plan
    stages, micro_batches = summary["stages"], summary["micro_batches"]
    assert stages >= 2
    html = str(d / "report.html")
    trace = str(d / "trace.json")
    write_trace(trace, stages, micro_batches)
    assert run(CLI, "report", pb, "-o", html, "--trace", trace).strip() == html
    text = open(html).read()
    for external in ("<script", "src=", "href=", "<link", "url("):
        assert external not in text

    png = str(d / "report.png")
    shot = chromium(f"--screenshot={png}", f"--window-size={WIDTH},{HEIGHT}", "file://" + html)
    assert os.path.exists(png), shot.stderr
    assert os.path.getsize(png) > 20000
    import torch
    import torchvision.io
    image = torchvision.io.decode_png(torchvision.io.read_file(png))
    assert tuple(image.shape) == (3, HEIGHT, WIDTH)
    colours = torch.unique(image.reshape(3, -1).T, dim=0)
    assert len(colours) > 100, "the screenshot is nearly blank"
    # SVG shapes were painted: stage 0's colour fills many pixels (rank boxes and forward boxes).
    stage0 = (image.reshape(3, -1).T == torch.tensor(STAGE0_LIGHT, dtype=torch.uint8)).all(dim=1)
    assert int(stage0.sum()) > 2000

    dom = chromium("--dump-dom", "file://" + html)
    assert dom.returncode == 0, dom.stderr
    elements = Elements()
    elements.feed(dom.stdout)
    svgs = {a.get("id") for t, a in elements.items if t == "svg"}
    assert svgs == {"rank-assignment", "memory", "gantt-predicted", "gantt-measured"}
    assert len(elements.having("rect", "rank")) == 8
    assert len(elements.having("rect", "node")) == 2
    forwards = elements.having("rect", "forward")
    predicted = [a for a in forwards if "op" in a["class"].split()]
    measured = [a for a in forwards if "measured" in a["class"].split()]
    assert len(predicted) == stages * micro_batches
    assert len(measured) == stages * micro_batches  # the last step only
    assert {a["data-stage"] for a in predicted} == {str(s) for s in range(stages)}
    assert len(elements.having("line", "limit")) == 1
    assert len(elements.having("rect", "params")) == stages


def test_report_of_a_damaged_file_is_a_format_error(tmp_path):
    assert os.path.exists(CLI), f"autostage CLI not built at {CLI}"
    bad = tmp_path / "bad.pb"
    bad.write_bytes(b"autostage\x00garbage")
    for command in (["show", str(bad)], ["report", str(bad), "-o", str(tmp_path / "r.html")]):
        done = subprocess.run([CLI, *command], capture_output=True, text=True, timeout=60)
        assert done.returncode == 1
        assert "autostage: error:" in done.stderr and "bad.pb" in done.stderr
        assert not (tmp_path / "r.html").exists()


def test_tutorial_trace_events_and_report(tmp_path):
    """2 ranks, 2 stages: trace_events writes one valid Chrome trace per rank covering every
    stage's forward and backward of every micro-batch; the saved plan and the traces make a report
    with the measured timeline."""
    assert os.path.exists(CLI), f"autostage CLI not built at {CLI}"
    import shutil as _shutil
    if _shutil.which("mpirun") is None:
        pytest.skip("mpirun not installed")
    from test_examples import run_example
    pb, traces = tmp_path / "plan.pb", tmp_path / "trace"
    log = run_example("tutorial.py", ["4", "16", "3", "--steps", "3", "--partition-num", "2",
                                      "--save-deployment", str(pb), "--trace-events", str(traces)],
                      ranks=2)
    assert f"deployment saved to {pb}" in log
    shown = run(CLI, "show", str(pb))
    assert "world size 2" in shown and "routes (" in shown
    summary = re.search(r"micro-batches (\d+), schedule (\w+)", shown)
    micro_batches = int(summary.group(1))
    stage_ranks = {}  # stage -> ranks, from the trace
    for rank in (0, 1):
        with open(traces / f"trace_rank{rank}.json") as f:
            trace = json.load(f)  # valid JSON
        events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
        assert all(e["pid"] == rank and e["dur"] >= 0 for e in events)
        steps = {e["args"]["step"] for e in events}
        assert steps == {0, 1, 2}  # 3 steps, fewer than trace_events_steps
        for step in steps:
            for name in ("forward", "backward"):
                got = sorted(e["args"]["micro_batch"] for e in events
                             if e["name"] == name and e["args"]["step"] == step)
                assert got == list(range(micro_batches)), (rank, name, step, got)
        stage_ranks.setdefault(events[0]["args"]["stage"], []).append(rank)
    assert sorted(stage_ranks) == [0, 1]  # two stages, one per rank
    html = tmp_path / "report.html"
    run(CLI, "report", str(pb), "-o", str(html), "--trace", str(traces))
    text = html.read_text()
    assert text.count('class="measured forward"') == 2 * micro_batches  # the last step
    assert text.count('class="op forward"') == 2 * micro_batches
