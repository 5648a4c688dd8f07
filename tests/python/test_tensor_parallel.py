"""Tensor-parallel plans (issue 30): the planner chooses a degree per stage for synthetic specs and
graphs (`autostage plan`, `whatif`, `show`, the partition log), refuses what it cannot place, and
training jobs run them (Note [Tensor-parallel stages] in staging/tensor_parallel.h)."""
import json
import re
import shutil
import subprocess

import pytest
import torch

import autostage
from autostage import _autostage
from mpi_launch import CLI, phase_run, run_driver

needs_mpirun = pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed")
# The CLI's planning of synthetic specs: torch-free (conftest.py's leg_independent).
leg_independent = pytest.mark.leg_independent
# scaled_dot_product_attention's enable_gqa (PyTorch 2.5+).
NEEDS_GQA = pytest.mark.skipif(
    tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 5),
    reason="scaled_dot_product_attention(enable_gqa=...) needs PyTorch 2.5+")

# Megatron-LM's 1-trillion-parameter GPT (Narayanan et al., SC'21, Table 1): 3,072 A100s of
# 80 GB, 8 per node, batch 3,072. It needs micro-batches of a few samples: more than 32 of them,
# which the default max_pipeline=0 tries where nothing fits within 32 (Note [Micro-batch count
# limit] in decomposer/plan.h), and max_pipeline=512 allows.
TRILLION = ["--synthetic", "gpt:layers=128,hidden=25600,heads=160,seq=2048,vocab=51200",
            "--devices", "3072", "--devices-per-node", "8", "--device-memory", "80GiB",
            "--batch", "3072"]


def cli(*args):
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=300)


@leg_independent
def test_a_trillion_parameter_gpt_plans_tensor_parallel(tmp_path):
    limited = cli("plan", *TRILLION, "--max-pipeline", "32", "--json")
    assert limited.returncode != 0 and "no plan fits" in limited.stderr, limited.stderr
    default = cli("plan", *TRILLION, "--json")  # the command, as it is written
    assert default.returncode == 0, default.stderr
    assert "No plan fits with at most 32 micro-batches: searching counts up to 3072" in \
        default.stderr, default.stderr
    assert json.loads(default.stdout)["micro_batches"] > 32
    one = cli("plan", *TRILLION, "--max-pipeline", "512", "--tensor-parallel", "1", "--json")
    assert one.returncode == 0, one.stderr
    pb = str(tmp_path / "gpt.pb")
    done = cli("plan", *TRILLION, "--max-pipeline", "512", "--tensor-parallel", "auto", "--json",
               "--out", pb)
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    # auto searches degree 1 too: never slower than the plan without tensor parallelism.
    assert plan["predicted_iteration_ms"] <= json.loads(one.stdout)["predicted_iteration_ms"]
    stages = plan["stage_list"]
    degrees = [s["tensor_parallel"] for s in stages]
    assert plan["tensor_parallel"] == ",".join(map(str, degrees))
    assert set(degrees) <= {1, 2, 4, 8} and max(degrees) > 1, degrees
    # Every stage fits, and the stages' ranks (replicas x degree, contiguous) fit the devices.
    usable = 80 * 2**30 * 0.9
    assert all(s["memory_bytes"] <= usable for s in stages), stages
    # With v virtual stages, stage k runs on the ranks of position k mod (stages / v).
    v = plan["virtual_stages"]
    positions = stages[:len(stages) // v]
    ranks = [s["replicas"] * s["tensor_parallel"] for s in positions]
    assert sum(ranks) <= 3072
    for s, width, following in zip(positions, ranks, positions[1:]):
        assert following["first_rank"] == s["first_rank"] + width
    for k, s in enumerate(stages):
        assert s["first_rank"] % s["tensor_parallel"] == 0  # each group on one node of 8
        home = positions[k % len(positions)]
        assert (s["first_rank"], s["replicas"], s["tensor_parallel"]) == \
            (home["first_rank"], home["replicas"], home["tensor_parallel"])
    # The partition log says each stage's degree, and the ranks of each replica's group.
    log = done.stderr
    lines = [line for line in log.splitlines() if "[DPStaging] [info] graph=STAGE_" in line]
    assert len(lines) == len(stages)
    assert all(f" tp={t} " in line for line, t in zip(lines, degrees)), lines[:3]
    if degrees[0] > 1 and stages[0]["first_rank"] == 0:  # the first replica's group: 0..t-1
        group = ",".join(str(r) for r in range(degrees[0]))
        assert f"to rank[[{group}],[" in log, log[-2000:]
    # `autostage show` of the saved deployment has the degree per stage.
    shown = cli("show", pb)
    assert shown.returncode == 0, shown.stderr
    header = next(line for line in shown.stdout.splitlines() if "replicas" in line and "tp" in line)
    assert header.split()[:5] == ["name", "nodes", "ranks", "replicas", "tp"], header
    rows = [line.split() for line in shown.stdout.splitlines() if line.strip().startswith("STAGE_")]
    assert [int(r[4]) for r in rows[:len(stages)]] == degrees


@leg_independent
def test_a_forced_degree_must_fit_a_node():
    done = cli("plan", "--synthetic", "gpt:layers=4,hidden=1024,heads=16,seq=512", "--devices", "8",
               "--devices-per-node", "2", "--device-memory", "16GiB", "--batch", "16",
               "--tensor-parallel", "4")
    assert done.returncode != 0
    assert "tensor_parallel=4 needs 4 ranks of one node" in done.stderr, done.stderr
    assert "node has 2 devices" in done.stderr, done.stderr


@leg_independent
def test_forced_stages_at_a_forced_degree_must_have_their_devices():
    gpt = ["plan", "--synthetic", "gpt:layers=4,hidden=1024,heads=16,seq=512",
           "--device-memory", "16GiB", "--batch", "16", "--tensor-parallel", "2"]
    # 3 stages of 2 ranks: 6 devices, or interleaved positions that 3 stages do not make.
    done = cli(*gpt, "--devices", "4", "--devices-per-node", "4", "--partition-num", "3")
    assert done.returncode != 0
    assert ("partition_num=3 stages at tensor_parallel=2 do not fit on 4 devices: each stage's "
            "replicas are groups of 2 ranks, so 3 stages need 6 devices") in done.stderr, \
        done.stderr
    assert "Use partition_num <= 2, tensor_parallel=auto" in done.stderr, done.stderr
    # 2 stages on one group of 2 ranks: no second pipeline position to interleave with.
    two = cli(*gpt, "--devices", "2", "--devices-per-node", "2", "--partition-num", "2")
    assert two.returncode != 0
    assert "partition_num=2 stages at tensor_parallel=2 do not fit on 2 devices" in two.stderr
    # 4 stages on 4 devices: interleaved, 2 positions of 2 ranks, each holding 2 stages.
    fits = cli(*gpt, "--devices", "4", "--devices-per-node", "4", "--partition-num", "4",
               "--json")
    assert fits.returncode == 0, fits.stderr
    plan = json.loads(fits.stdout)
    assert [s["tensor_parallel"] for s in plan["stage_list"]] == [2] * 4, plan
    assert plan["virtual_stages"] == 2, plan


@leg_independent
def test_a_grouped_query_gpt_plans_its_k_and_v_whole():
    # kv_heads=2 of 16 at tensor_parallel=4: K and V computed whole on each rank (Note [Whole K/V
    # heads]); their projections are smaller than the full K and V of kv_heads=0 (16 K/V heads).
    args = ["plan", "--devices", "8", "--devices-per-node", "8", "--device-memory", "16GiB",
            "--batch", "16", "--tensor-parallel", "4", "--json"]
    memory = {}
    for kv in (0, 2):
        done = cli(*args, "--synthetic",
                   f"gpt:layers=8,hidden=1024,heads=16,kv_heads={kv},seq=512,vocab=32000")
        assert done.returncode == 0, done.stderr
        plan = json.loads(done.stdout)
        assert set(plan["tensor_parallel"].split(",")) == {"4"}, plan
        memory[kv] = max(s["memory_bytes"] for s in plan["stage_list"])
        whole = "8 attention pattern(s) compute K and V whole on each of 4 ranks"
        assert (whole in done.stderr) == (kv == 2), done.stderr
    assert memory[2] < memory[0], memory
    bad = cli(*args, "--synthetic", "gpt:layers=2,hidden=64,heads=4,kv_heads=3")
    assert bad.returncode != 0
    assert "kv_heads=3 with heads=4: K/V heads must divide the heads" in bad.stderr, bad.stderr


def test_a_model_without_shardable_operations():
    args = ["plan", "--synthetic", "resnet:blocks=4", "--devices", "4", "--devices-per-node", "4",
            "--device-memory", "16GiB", "--batch", "16"]
    forced = cli(*args, "--tensor-parallel", "2")
    assert forced.returncode != 0
    assert "tensor_parallel=2 cannot be planned" in forced.stderr, forced.stderr
    assert "no operations tensor parallelism shards" in forced.stderr, forced.stderr
    auto = cli(*args, "--tensor-parallel", "auto", "--json")
    assert auto.returncode == 0, auto.stderr
    assert "tensor_parallel=auto: graph" in auto.stderr and "planning without it" in auto.stderr
    assert set(json.loads(auto.stdout)["tensor_parallel"].split(",")) == {"1"}


@leg_independent
def test_whatif_reports_the_degrees():
    done = cli("whatif", "--synthetic", "gpt:layers=8,hidden=4096,heads=32,seq=1024",
               "--devices", "8,16", "--devices-per-node", "8", "--device-memory", "16GiB",
               "--batch", "32", "--tensor-parallel", "auto", "--json")
    assert done.returncode == 0, done.stderr
    points = json.loads(done.stdout)
    assert len(points) == 2
    for p in points:
        if p["feasible"]:
            assert len(p["tensor_parallel"].split(",")) == p["stages"], p
    csv = cli("whatif", "--synthetic", "gpt:layers=8,hidden=4096,heads=32,seq=1024",
              "--devices", "8", "--devices-per-node", "8", "--device-memory", "16GiB",
              "--batch", "32", "--tensor-parallel", "auto", "--csv")
    header, row = csv.stdout.splitlines()[:2]
    assert header.endswith("schedule,replicas,tensor_parallel,error"), header
    assert len(row.split(",")) >= len(header.split(",")), row


def test_optimizer_state_of_a_table_tied_across_stages_is_joined_from_one_holding():
    """Note [Tied tables across stages]: the ranks send the table's optimizer state whole (a
    stage not splitting it), in halves and in quarters (two stages at degrees 2 and 4); the
    global state is one holding's, the whole one first, else the smallest degree's slices."""
    from autostage import optimizer
    whole = torch.arange(32.0).view(8, 4)
    one = ((8, False),)  # one part, cut
    halves = [((m, 2, 0, one, -1), whole[4 * m:4 * m + 4]) for m in range(2)]
    quarters = [((m, 4, 0, one, -1), whole[2 * m:2 * m + 2] + 100) for m in range(4)]  # told apart
    assert torch.equal(optimizer._assemble(halves + quarters, (8, 4)), whole)
    assert torch.equal(optimizer._assemble(quarters, (8, 4)), whole + 100)
    assert torch.equal(optimizer._assemble([(-1, whole)] + quarters + halves, (8, 4)), whole)
    with pytest.raises(_autostage.InternalError, match=r"slices \[0\] of 2"):
        optimizer._assemble(halves[:1] + quarters, (8, 4))


def test_optimizer_state_of_fused_parts_is_joined_and_cut():
    """Note [Fused parts]: a member holds its slice of each cut part and every whole part; the
    global state joins the slices part by part and takes a whole part from the first member;
    loading cuts a member's rows out again."""
    from autostage import optimizer
    whole = torch.arange(36.0).view(12, 3)  # Q's 8 rows cut, K's and V's 2 rows each whole
    parts = ((8, False), (2, True), (2, True))
    members = [torch.cat([whole[4 * m:4 * m + 4], whole[8:12]]) for m in range(2)]
    for m in range(2):
        assert torch.equal(optimizer._cut_slice(whole, 0, parts, 2, m), members[m])
    pieces = [((m, 2, 0, parts, -1), members[m]) for m in range(2)]
    assert torch.equal(optimizer._assemble(pieces, (12, 3)), whole)
    assert optimizer._parts_of(optimizer._parts_text(parts)) == parts
    # Equal parts cut (a fused projection of Q, K and V of one width): slice m of each third.
    thirds = ((4, False),) * 3
    cut = optimizer._cut_slice(whole, 0, thirds, 2, 1)
    assert torch.equal(cut, whole[[2, 3, 6, 7, 10, 11]])
    assert torch.equal(optimizer._join_slices([optimizer._cut_slice(whole, 0, thirds, 2, m)
                                               for m in range(2)], 0, thirds), whole)


@needs_mpirun
@pytest.mark.parametrize("phase,ranks",
                         [("mlp", 2), ("block", 2), ("block", 4), ("block4", 4), ("zero", 4),
                          ("grouped", 2), ("grouped", 4), ("grouped_zero", 4),
                          pytest.param("grouped_sdpa", 2, marks=NEEDS_GQA),
                          pytest.param("grouped_sdpa", 4, marks=NEEDS_GQA),
                          ("fused", 2), ("fused", 4), ("fused_zero", 4),
                          ("modes", 2), ("modes", 4), ("recompute", 2), ("recompute", 4),
                          ("accumulate", 2), ("bf16", 2),
                          pytest.param("fp16", 2, marks=pytest.mark.skipif(
                              not _autostage._cpu_fp16_autocast(),
                              reason="no fp16 CPU autocast in this build's LibTorch (before "
                                     "2.5: Note [fp16 on the CPU])")),
                          ("noise", 2), ("parallel", 2),
                          ("vocabulary", 2), ("head", 2),
                          ("tied", 2), ("tied_stages", 4), ("auto", 2)])
def test_a_tensor_parallel_job_trains_as_plain_pytorch(request, tmp_path_factory, phase, ranks):
    # One launch per rank count runs every selected phase in turn (mpi_phases.py).
    status, log = phase_run(request, "tensor_parallel_job.py", ranks, "phase", tmp_path_factory)
    assert status == 0, log
    for rank in range(ranks):
        assert f"rank {rank}: tensor_parallel {phase} checked; 0 failures" in log, log
    degree = 4 if phase == "block4" or (phase, ranks) in (("grouped", 4), ("grouped_sdpa", 4),
                                                          ("fused", 4)) else 2
    if phase != "auto":
        assert f" tp={degree} " in log, log  # the partition log
    # Note [Tensor-parallel profile]: the patterns measured on a member's slices at the degree.
    measured = re.search(r"tensor-parallel degree %d: (\d+) node groups measured;" % degree, log)
    assert measured and int(measured.group(1)) > 0, log
    if phase in ("zero", "grouped_zero", "fused_zero") or (phase, ranks) == ("modes", 4):
        assert " repl=2 tp=2 zero=1 " in log, log
    if phase == "modes":  # the eval deployment and the inference usage's, both tensor-parallel
        assert log.count("Switching from") >= 4, log
        # Note [Keeping slices across a switch]: each deployment holds the block's 9 sliced
        # tensors alike (one stage, the same ranks), so switching back to a known one keeps them.
        kept = re.findall(r"(\d+) tensor-parallel slices kept", log)
        assert len(kept) >= 4 and set(kept) == {"9"}, log
    if phase in ("vocabulary", "head", "tied", "tied_stages"):
        assert "stays replicated" not in log, log  # the embedding (the head) split, the block too
    if phase.startswith(("parallel", "grouped", "fused")):  # both layers' attention and MLP split
        assert f"tensor_parallel={degree}: 4 pattern(s) to shard" in log, log
        assert "stays replicated" not in log, log
    if phase.startswith(("grouped", "fused")):  # 1 K/V head does not divide by 2; 1, 2 not by 4
        assert (f"tensor_parallel: {degree // 2} attention pattern(s) compute K and V whole on "
                f"each of {degree} ranks") in log, log
    if phase == "tied_stages":  # Note [Tied tables across stages]: each end in its own stage
        stages = set(re.findall(r"\[DPStaging\] \[info\] graph=(STAGE_\S+) .* tp=2 ", log))
        assert len(stages) == 2, log
    if phase == "noise":
        assert "1 random operator(s) besides dropout draw from generators seeded alike" in log, log


@needs_mpirun
def test_a_tensor_parallel_checkpoint_resumes_on_one_rank_without_it(tmp_path):
    checkpoint = tmp_path / "block.pt"
    run_driver("tensor_parallel_job.py", "block", checkpoint, ranks=2)
    assert checkpoint.exists()
    log = run_driver("tensor_parallel_job.py", "resume", checkpoint, ranks=1)
    assert "rank 0: tensor_parallel resume checked; 0 failures" in log, log


_HF_CASES = [("gpt2", 2), ("llama", 2), ("gpt2-dropout", 2), ("gpt_neox", 2), ("gptj", 2),
             ("phi", 2), ("qwen3", 2), ("falcon", 2), ("gemma", 2), ("llama_gqa", 4), ("phi3", 2),
             ("phi3", 4), ("gpt_bigcode", 2), ("falcon_new", 2), ("gemma3", 2), ("mpt", 2),
             ("bart", 2), ("modernbert", 2), ("persimmon", 2), ("nemotron", 2), ("codegen", 2),
             ("xglm", 2)]


@needs_mpirun
@pytest.mark.parametrize("name,ranks", _HF_CASES)
def test_a_transformers_model_trains_tensor_parallel(request, tmp_path_factory, name, ranks):
    pytest.importorskip("transformers")
    from autostage.export import available
    if not available():
        pytest.skip("torch.export training IR needs PyTorch 2.5+")
    # One launch per rank count checks every selected model in turn (mpi_phases.py).
    status, log = phase_run(request, "tensor_parallel_hf_job.py", ranks, "name", tmp_path_factory)
    assert status == 0, log
    for rank in range(ranks):
        assert f"rank {rank}: tensor_parallel {name} checked; 0 failures" in log, log
    if name == "falcon":  # its multi-query attention is found, and says why it stays whole
        assert "attention ending at" in log and "stays replicated" in log, log
    else:
        assert "stays replicated" not in log, log  # every attention and MLP is split
    assert "own random generator" not in log, log  # every dropout draws the group's masks


class _Block(torch.nn.Module):
    """A Llama-shaped layer written in torch: attention with separate Q, K, V projections and
    rotary-style position factors, and a gated MLP (silu(gate(x)) * up(x) -> down)."""

    def __init__(self, hidden=32, heads=4):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (torch.nn.Linear(hidden, hidden) for _ in range(4))
        self.gate, self.up = torch.nn.Linear(hidden, 64), torch.nn.Linear(hidden, 64)
        self.down = torch.nn.Linear(64, hidden)
        self.register_buffer("cos", torch.cos(torch.arange(8.0)).reshape(1, 1, 8, 1))

    def split(self, x):
        b, s, h = x.shape
        return x.reshape(b, s, self.heads, h // self.heads).transpose(1, 2)

    def forward(self, x):
        q, k = self.split(self.q(x)) * self.cos, self.split(self.k(x)) * self.cos
        v = self.split(self.v(x))
        att = torch.softmax(q @ k.transpose(-1, -2) / 8.0, dim=-1) @ v
        x = x + self.o(att.transpose(1, 2).reshape(x.shape))
        return x + self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


def test_patterns_of_a_llama_shaped_layer_are_found():
    # Note [Tensor-parallel patterns], on this leg's capture (TorchScript on 1.13, torch.export on
    # 2.x, whose operator names carry overloads such as aten::linear.default).
    model = torch.nn.Sequential(_Block(), _Block())
    from autostage.export import available
    if available():
        ir = autostage.export_to_ir(model, (torch.randn(2, 8, 32),))
    else:
        ir = autostage.trace_to_ir(model, (torch.randn(2, 8, 32),))
    patterns = autostage.shard_patterns(ir)
    assert [p["kind"] for p in patterns] == ["attention", "mlp", "attention", "mlp"], patterns
    assert [p["scope"] for p in patterns] == ["0.q", "0.gate", "1.q", "1.gate"], patterns
    # The gated MLP holds both column-parallel linears and the row-parallel one.
    assert len(patterns[1]["nodes"]) >= 5, patterns[1]


class _FusedQkv(torch.nn.Module):
    """GPT-2's attention shape: one projection for Q, K and V, split."""

    def __init__(self, hidden=32, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv, self.o = torch.nn.Linear(hidden, 3 * hidden), torch.nn.Linear(hidden, hidden)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = (t.reshape(b, s, self.heads, h // self.heads).transpose(1, 2)
                   for t in self.qkv(x).split(h, dim=-1))
        att = torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v
        return x + self.o(att.transpose(1, 2).reshape(b, s, h))


def test_a_fused_qkv_projection_is_split_by_heads():
    from autostage.export import available
    model = _FusedQkv()
    example = (torch.randn(2, 8, 32),)
    ir = (autostage.export_to_ir if available() else autostage.trace_to_ir)(model, example)
    patterns = autostage.shard_patterns(ir)
    assert [(p["kind"], p["scope"]) for p in patterns] == [("attention", "qkv")], patterns


class _Layouts(torch.nn.Module):
    """A fused QKV projection viewed before it is cut into Q, K and V: `per_head` as GPT-NeoX and
    Megatron lay it out (viewed into heads, each head's Q, K and V side by side, chunked);
    `parts_chunked` and `parts_unbound`, GPT-2's layout (all of Q, then K, then V) viewed as
    [3, heads, features] and chunked there, or unbound as ModernBERT does; `heads_last`, the same
    weights viewed as [3, features, heads] (each head's features interleaved with the others');
    then an MLP reading its weights as `y @ w.T` (Falcon's linear layers)."""

    def __init__(self, layout, hidden=32, heads=4):
        super().__init__()
        self.layout, self.heads = layout, heads
        self.qkv, self.o = torch.nn.Linear(hidden, 3 * hidden), torch.nn.Linear(hidden, hidden)
        self.w_up = torch.nn.Parameter(torch.randn(64, hidden))
        self.w_down = torch.nn.Parameter(torch.randn(hidden, 64))

    def forward(self, x):
        b, s, h = x.shape
        d = h // self.heads
        qkv = self.qkv(x)
        if self.layout == "per_head":
            q, k, v = qkv.view(b, s, self.heads, 3 * d).transpose(1, 2).chunk(3, dim=-1)
        elif self.layout == "parts_chunked":
            q, k, v = (t.squeeze(2).transpose(1, 2) for t in
                       qkv.view(b, s, 3, self.heads, d).chunk(3, dim=2))
        elif self.layout == "parts_unbound":
            q, k, v = (t.transpose(1, 2) for t in qkv.view(b, s, 3, -1, d).unbind(dim=-3))
        else:
            q, k, v = (t.permute(0, 3, 1, 2) for t in qkv.view(b, s, 3, d, self.heads).unbind(2))
        att = torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v
        x = x + self.o(att.transpose(1, 2).reshape(b, s, h))
        return x + torch.relu(x @ self.w_up.T) @ self.w_down.T


@pytest.mark.parametrize("layout,attention", [("per_head", [2, 4]), ("parts_chunked", [2, 4]),
                                              ("parts_unbound", [2, 4]), ("heads_last", [])])
def test_fused_projections_viewed_before_the_cut_split_where_heads_are_whole(layout, attention):
    # Per head, each member takes whole heads (contiguous rows of the weight). Viewed as
    # [3, heads, features], the view cuts the rows into Q, K and V (Note [Fused parts]) and each
    # member takes its heads' rows of each: 4 heads split 2 and 4 ways. Viewed as [3, features,
    # heads], a member would hold some features of every head, which the attention's product
    # sums over: found (a fused projection) but split at no degree, never guessed.
    from autostage.export import available
    example = (torch.randn(2, 8, 32),)
    ir = (autostage.export_to_ir if available() else autostage.trace_to_ir)(
        _Layouts(layout), example)
    found = [(p["kind"], p["degrees"]) for p in autostage.shard_patterns(ir)]
    assert found == [("attention", attention), ("mlp", [2, 4, 8])], found


class _NormedQ(torch.nn.Module):
    """Attention whose Q is normalised by a LayerNorm of each head's features (`per_head`:
    Persimmon's q_layernorm), or of all of Q's features before the view into heads (OLMo2's
    q_norm, as a LayerNorm), then a squared-ReLU MLP (Persimmon's, Nemotron's)."""

    def __init__(self, per_head, hidden=32, heads=4):
        super().__init__()
        self.per_head, self.heads = per_head, heads
        self.q, self.k, self.v, self.o = (torch.nn.Linear(hidden, hidden) for _ in range(4))
        self.q_norm = torch.nn.LayerNorm(hidden // heads if per_head else hidden)
        self.up, self.down = torch.nn.Linear(hidden, 64), torch.nn.Linear(64, hidden)

    def split(self, x):
        b, s, h = x.shape
        return x.reshape(b, s, self.heads, h // self.heads).transpose(1, 2)

    def forward(self, x):
        if self.per_head:
            q = self.q_norm(self.split(self.q(x)))
        else:
            q = self.split(self.q_norm(self.q(x)))
        k, v = self.split(self.k(x)), self.split(self.v(x))
        att = torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v
        x = x + self.o(att.transpose(1, 2).reshape(x.shape))
        return x + self.down(torch.square(torch.relu(self.up(x))))


@pytest.mark.parametrize("per_head,attention", [(True, [2, 4]), (False, [])])
def test_a_layer_norm_of_each_heads_features_splits_and_one_of_all_of_q_does_not(per_head,
                                                                                attention):
    # Per head, the norm's weight and bias are read by every head: each member's gradient of
    # them is its heads' share, summed over the group (the `parallel` phase trains such a
    # norm). Over all of Q's features, the norm needs the whole row: found, split at no degree.
    from autostage.export import available
    ir = (autostage.export_to_ir if available() else autostage.trace_to_ir)(
        _NormedQ(per_head), (torch.randn(2, 8, 32),))
    found = [(p["kind"], p["degrees"]) for p in autostage.shard_patterns(ir)]
    assert found == [("attention", attention), ("mlp", [2, 4, 8])], found


class _Merged(torch.nn.Module):
    """Attention with batch and heads merged in one dimension, as fairseq's and XGLM's: batch
    first (`view(bsz * heads, -1, head_dim)`, XGLM's) or time first (the batch-first input
    transposed to [time, batch, features], as fairseq's models do, then `view(time, bsz * heads,
    head_dim)`), the scores floored by `max`."""

    def __init__(self, seq_first, hidden=32, heads=4):
        super().__init__()
        self.seq_first, self.heads = seq_first, heads
        self.q, self.k, self.v, self.o = (torch.nn.Linear(hidden, hidden) for _ in range(4))

    def forward(self, x):
        if self.seq_first:
            b, t, h = x.shape
            d = h // self.heads
            q, k, v = (f(x).transpose(0, 1).reshape(t, b * self.heads, d).transpose(0, 1)
                       for f in (self.q, self.k, self.v))
        else:
            b, t, h = x.shape
            d = h // self.heads
            q, k, v = (f(x).view(b, t, self.heads, d).transpose(1, 2).reshape(b * self.heads, t, d)
                       for f in (self.q, self.k, self.v))
        w = torch.max(torch.bmm(q, k.transpose(1, 2)), torch.full((), -1e4))
        att = torch.bmm(torch.softmax(w, dim=-1), v)
        if self.seq_first:
            return x + self.o(att.transpose(0, 1).reshape(t, b, h).transpose(0, 1))
        return x + self.o(att.view(b, self.heads, t, d).transpose(1, 2).reshape(b, t, h))


@pytest.mark.parametrize("seq_first,attention", [(False, [2, 4]), (True, [])])
def test_batch_and_heads_merged_in_one_dimension(seq_first, attention):
    # Note [Heads merged with the batch]: batch first, the merged dimension's size becomes -1 on a
    # member (the `parallel` phase and XGLM train so). Time first, the merged dimension is not
    # the first: its size would be the captured batch's, so the attention stays replicated. The
    # TorchScript front end cannot tell (it marks no value not_batch_major): there the split
    # keeps the captured batch in that size and the first (the time) computed, which fails at
    # another batch size rather than running wrong.
    from autostage.export import available
    example = (torch.randn(2, 6, 32),)
    ir = (autostage.export_to_ir if available() else autostage.trace_to_ir)(
        _Merged(seq_first), example)
    found = [(p["kind"], p["degrees"]) for p in autostage.shard_patterns(ir)]
    if not available():
        attention = [2, 4]
    assert found == [("attention", attention)], found


class _Scaled(torch.nn.Module):
    """Attention whose Q is multiplied by a learnable scale of each head's features: the
    parameter itself (`direct`), computed from one (`computed`: its exp), or computed from one
    the block reads outside the attention too (`shared`)."""

    def __init__(self, mode, hidden=32, heads=4):
        super().__init__()
        self.mode, self.heads = mode, heads
        self.q, self.k, self.v, self.o = (torch.nn.Linear(hidden, hidden) for _ in range(4))
        self.scale = torch.nn.Parameter(torch.zeros(hidden // heads))

    def split(self, x):
        b, s, h = x.shape
        return x.reshape(b, s, self.heads, h // self.heads).transpose(1, 2)

    def forward(self, x):
        q = self.split(self.q(x)) * (self.scale if self.mode == "direct" else self.scale.exp())
        k, v = self.split(self.k(x)), self.split(self.v(x))
        att = torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v
        out = x + self.o(att.transpose(1, 2).reshape(x.shape))
        return out + self.scale.sum() if self.mode == "shared" else out


def test_a_scale_read_across_the_heads_is_summed_or_left_replicated():
    # The parameter read by the pattern alone, or computed from one by nodes outside it (Note
    # [Parameters computed into an operand]): split, its gradient summed over the group (the
    # `parallel` phase trains one against plain PyTorch, transformers' Gemma-3 the other). Read
    # outside the pattern too, where a sum over the group would count that read's gradient t
    # times: left replicated.
    from autostage.export import available
    example = (torch.randn(2, 8, 32),)
    for mode, degrees in (("direct", [2, 4]), ("computed", [2, 4]), ("shared", [])):
        ir = (autostage.export_to_ir if available() else autostage.trace_to_ir)(
            _Scaled(mode), example)
        found = [(p["kind"], p["degrees"]) for p in autostage.shard_patterns(ir)]
        assert found == [("attention", degrees)], (mode, found)


@NEEDS_GQA
@pytest.mark.parametrize("heads,kv_heads,degrees", [(4, 2, [2, 4]), (4, 1, [2, 4]),
                                                    (8, 2, [2, 4, 8]), (6, 3, [])])
def test_grouped_sdpa_splits_where_each_member_reads_whole_k_v_heads(heads, kv_heads, degrees):
    """Note [Grouped sdpa]: 8 heads over 2 K/V heads split K and V at 2 and read one whole head
    per member at 4 and 8; 6 over 3 at 2 would give member 0 Q heads 0-2, which read K/V heads
    0, 0 and 1, and member 1 heads 1, 2, 2: no member's heads are whole groups, so the attention
    stays replicated."""
    from autostage.export import available, export_call
    if not available():
        pytest.skip("torch.export training IR needs PyTorch 2.5+")

    class Attention(torch.nn.Module):
        def __init__(self, dim=4):
            super().__init__()
            hidden = heads * dim
            self.q, self.o = torch.nn.Linear(hidden, hidden), torch.nn.Linear(hidden, hidden)
            self.k, self.v = (torch.nn.Linear(hidden, kv_heads * dim) for _ in range(2))

        def forward(self, x):
            b, s, h = x.shape
            q, k, v = (f(x).view(b, s, -1, 4).transpose(1, 2) for f in (self.q, self.k, self.v))
            att = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                   enable_gqa=True)
            return self.o(att.transpose(1, 2).reshape(b, s, h)).pow(2).mean()

    torch.manual_seed(0)
    ir, _ = export_call(Attention().train(), (torch.randn(2, 8, heads * 4),), {}, "attention")
    patterns = autostage.shard_patterns(ir)
    assert [p["degrees"] for p in patterns if p["kind"] == "attention"] == [degrees], patterns


def test_an_encoder_decoders_cross_attention_splits():
    """BART's decoder layers attend to the encoder's output (Q from the decoder's state, K and V
    from the encoder's): each layer's self-attention, cross-attention and MLP split, as the
    encoder's attention and MLP do."""
    transformers = pytest.importorskip("transformers")
    from autostage.export import available, export_call
    if not available():
        pytest.skip("torch.export training IR needs PyTorch 2.5+")
    torch.manual_seed(0)
    model = transformers.BartForConditionalGeneration(transformers.BartConfig(
        vocab_size=512, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
        max_position_embeddings=32))
    ids = torch.randint(0, 512, (2, 16))
    ir, _ = export_call(model.train(), (), dict(input_ids=ids, labels=ids, use_cache=False),
                        "bart")
    found = {(p["kind"], p["scope"].rsplit(".", 1)[0]): p["degrees"]
             for p in autostage.shard_patterns(ir)}
    want = {}
    for layer in range(2):
        want[("attention", f"model.encoder.layers.{layer}.self_attn")] = [2, 4]
        want[("mlp", f"model.encoder.layers.{layer}")] = [2, 4, 8]
        want[("attention", f"model.decoder.layers.{layer}.self_attn")] = [2, 4]
        want[("attention", f"model.decoder.layers.{layer}.encoder_attn")] = [2, 4]
        want[("mlp", f"model.decoder.layers.{layer}")] = [2, 4, 8]
    assert found == want, found


def test_transformers_models_expose_their_patterns():
    transformers = pytest.importorskip("transformers")
    from autostage.export import available, export_call
    if not available():
        pytest.skip("torch.export training IR needs PyTorch 2.5+")
    torch.manual_seed(0)
    vocab, config = 32000, dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                                num_attention_heads=4)
    cases = {
        "llama": transformers.LlamaForCausalLM(transformers.LlamaConfig(
            num_key_value_heads=2, vocab_size=vocab, **config)),
        # Llama through sdpa with enable_gqa (transformers' choice where no mask is needed on
        # CUDA; forced here): K and V not repeated (Note [Grouped sdpa]).
        "llama_gqa": transformers.LlamaForCausalLM(transformers.LlamaConfig(
            num_key_value_heads=2, vocab_size=vocab, **config)),
        "bert": transformers.BertForMaskedLM(transformers.BertConfig(vocab_size=vocab, **config)),
        # GPT-2's attention projects Q, K and V with one Conv1D (addmm), then splits.
        "gpt2": transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_layer=2, n_embd=64, n_head=4, vocab_size=vocab, n_positions=64)),
        # Q, K and V from one projection laid out per head (viewed into heads, then chunked).
        "gpt_neox": transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(
            vocab_size=vocab, **config)),
        # Attention and MLP side by side, reading one norm.
        "gptj": transformers.GPTJForCausalLM(transformers.GPTJConfig(
            n_layer=2, n_embd=64, n_head=4, rotary_dim=8, vocab_size=vocab)),
        "phi": transformers.PhiForCausalLM(transformers.PhiConfig(vocab_size=vocab, **config)),
        # Linear layers reading `w.T`; multi-query attention (one K/V head taken off by index
        # after a view into heads) is found, split at no degree.
        "falcon": transformers.FalconForCausalLM(transformers.FalconConfig(
            vocab_size=vocab, num_hidden_layers=2, hidden_size=64, num_attention_heads=4)),
        # One projection of Q, K and V cut apart by slices (4 heads over 2 K/V heads), and a
        # fused gated MLP: each part cut, K and V kept whole at 4 (Note [Fused parts]).
        "phi3": transformers.Phi3ForCausalLM(transformers.Phi3Config(
            vocab_size=vocab, num_key_value_heads=2, pad_token_id=0, **config)),
        # Multi-query attention from one projection of unequal parts: the K/V head kept whole.
        "gpt_bigcode": transformers.GPTBigCodeForCausalLM(transformers.GPTBigCodeConfig(
            n_layer=2, n_embd=64, n_head=4, vocab_size=vocab, n_positions=64)),
        # Falcon-40B's layout: one projection viewed into 2 K/V groups (2 Q heads, K and V
        # each), K and V taken off by index: split by groups, at 2 only.
        "falcon_new": transformers.FalconForCausalLM(transformers.FalconConfig(
            vocab_size=vocab, num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
            new_decoder_architecture=True, num_kv_heads=2)),
        # An RMSNorm of each head's Q and K features: split, its weight read across the heads.
        "qwen3": transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
            vocab_size=vocab, num_key_value_heads=2, head_dim=16, **config)),
        # Multi-query attention: 4 heads over one K/V head, kept whole (Note [Whole K/V heads]).
        "gemma": transformers.GemmaForCausalLM(transformers.GemmaConfig(
            vocab_size=vocab, num_key_value_heads=1, head_dim=16, **config)),
        # The scores' soft cap (tanh) inside the attention.
        "gemma2": transformers.Gemma2ForCausalLM(transformers.Gemma2Config(
            vocab_size=vocab, num_key_value_heads=2, head_dim=16, **config)),
        # Q's and K's norms of each head's features scaled by 1 + w, computed outside the
        # attention (Note [Parameters computed into an operand]).
        "gemma3": transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(
            vocab_size=vocab, num_key_value_heads=2, head_dim=16, **config)),
        # ALiBi: a constant bias of one slope per head added to the scores, sliced to each
        # member's heads.
        "mpt": transformers.MptForCausalLM(transformers.MptConfig(
            vocab_size=vocab, d_model=64, n_layers=2, n_heads=4, max_seq_len=64)),
        # An RMSNorm of all of Q's and K's features, before the heads: found, split at no degree.
        "olmo2": transformers.Olmo2ForCausalLM(transformers.Olmo2Config(
            vocab_size=vocab, **config)),
    }
    ids = torch.randint(0, vocab, (2, 16))
    for name, model in cases.items():
        kwargs = dict(input_ids=ids, labels=ids)
        if name != "bert":
            kwargs["use_cache"] = False
        with pytest.MonkeyPatch.context() as env:
            if name == "llama_gqa":  # transformers' sdpa attention then passes enable_gqa=True
                env.setenv("TRANSFORMERS_SDPA_FORCE_GQA", "1")
            ir, _ = export_call(model.train(), (), kwargs, name)
        if name == "llama_gqa":  # sdpa reads K of 2 heads, not repeated to Q's 4
            key = re.search(r"aten::scaled_dot_product_attention\S*\(%\S+, (%[^,]+),", str(ir))
            assert key and re.search(rf"{re.escape(key.group(1))} : Float\(2, 2, 16, 16\)",
                                     str(ir)), str(ir)
        patterns = autostage.shard_patterns(ir)
        kinds = [p["kind"] for p in patterns]
        attention = [p["degrees"] for p in patterns if p["kind"] == "attention"]
        # 4 heads split 2 and 4 ways; fewer K/V heads (Llama's and Qwen3's 2, Gemma's 1) than the
        # degree are kept whole; Falcon-40B's layout splits by its 2 K/V groups.
        want = [] if name in ("olmo2", "falcon") else [2] if name == "falcon_new" else [2, 4]
        assert all(d == want for d in attention), (name, attention)
        # The word embedding is split over the vocabulary; the LM head stays whole, as the
        # model returns its logits.
        assert kinds.count("embedding") == 1, (name, kinds)
        assert kinds.count("mlp") == 2, (name, kinds)
        assert kinds.count("attention") == 2, (name, kinds)
        assert "lm_head" not in kinds, (name, kinds)
