"""Issue 17: models autostage's authors did not write, trained under several plan shapes and
compared with plain PyTorch in float64 (catalog.py lists them, driver.py trains them).

One mpirun per rank count runs every plan of that rank count (test_zoo_matches_plain_pytorch);
the results, every rank's JSON lines, are kept under build/zoo/ (or $ZOO_RESULTS_DIR), and
test_docs_table_is_current checks docs/models.md's table against them.
"""
import json
import os
import shutil
import sys

import pytest

from catalog import HAS_EXPORT_ZOO, RANK_COUNTS, ZOO
from doc_table import tables
from driver import RTOL
from mpi_launch import BUILD, mpi_env, mpirun

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
DOCS = os.path.join(ROOT, "docs", "models.md")
RESULTS = os.environ.get("ZOO_RESULTS_DIR", os.path.join(BUILD, "zoo"))
_results = {}  # rank count -> that run's result rows (every rank's)

needs_mpirun = pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed")


def test_catalog_covers_the_issue():
    families = {e.family for e in ZOO}
    assert {"torchvision classification", "torchvision segmentation", "torch.nn",
            "HF-style causal LM (in tests)", "torchaudio"} <= families
    plans = [p for e in ZOO for p in e.plans if p[3] != "PlanError"]
    assert {p[1] for p in plans} == {1, 2, 3, 4}, "stage counts 1-4"
    assert {p[2] for p in plans} == {1, 2}, "with and without micro-batches"
    assert any(p[3] == "PlanError" for e in ZOO for p in e.plans)
    for entry in ZOO:
        for ranks, partition, pipeline, call in entry.plans:
            if entry.has_batchnorm and call != "PlanError":
                assert partition == ranks, f"{entry.name}: BatchNorm needs 1 replica per stage"
    replicated = [e.name for e in ZOO for p in e.plans if p[0] > p[1] and p[3] != "PlanError"]
    assert replicated, "some models train with replicated stages"
    if HAS_EXPORT_ZOO:  # issue 26's transformers models, each under 1, 2, 4 stages + replicas
        exported = {e.name: e.plans for e in ZOO if e.options.get("front_end") == "export"}
        for model in ("GPT-2", "BERT", "RoBERTa", "Llama", "Qwen2", "T5", "ViT", "Mixtral"):
            name = next((n for n in exported if n.startswith(model)), None)
            assert name is not None, model
            trained = [p for p in exported[name] if p[3] != "PlanError"]
            assert {p[1] for p in trained} >= {1, 2, 4}, (name, "1, 2 and 4 stages")
            assert any(p[0] > p[1] for p in trained), (name, "replicated stages")
        # issue 30: tensor parallelism at 2 and 4, alone, with 2 stages and with replicas
        split = {(e.options["tensor_parallel"], p[0], p[1]) for e in ZOO
                 if e.options.get("tensor_parallel") for p in e.plans}
        assert {(2, 2, 1), (2, 4, 2), (2, 4, 1), (4, 4, 1)} <= split, split
        # and with fewer K/V heads than the degree (Note [Whole K/V heads])
        grouped = {e.options["tensor_parallel"] for e in ZOO if e.options.get("tensor_parallel")
                   and "K/V head" in e.name and " of " in e.name}
        assert grouped == {2, 4}, grouped


@needs_mpirun
@pytest.mark.parametrize("ranks", RANK_COUNTS)
def test_zoo_matches_plain_pytorch(ranks):
    out = os.path.join(RESULTS, f"ranks{ranks}")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    env = mpi_env(AUTOSTAGE_LOG_LEVEL="warn", PYTHONWARNINGS="ignore")
    run = mpirun([sys.executable, os.path.join(HERE, "driver.py"), out], env=env, ranks=ranks,
                 cwd=HERE, timeout=900)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-20000:]
    rows = []
    for rank in range(ranks):
        with open(os.path.join(out, f"rank{rank}.jsonl")) as f:
            rows += [json.loads(line) for line in f]
    _results[ranks] = rows
    expected = [(e.name, p[1], p[2]) for e in ZOO for p in e.plans if p[0] == ranks]
    for name, partition, pipeline in expected:
        got = [r for r in rows if (r["model"], r["partition_num"], r["pipeline_num"]) ==
               (name, partition, pipeline)]
        assert sorted(r["rank"] for r in got) == list(range(ranks)), (name, got)
        for r in got:
            assert r["ok"], f"{name} {partition}x{pipeline} rank {r['rank']}: {r['failures']}"
            if "refused" in r:
                assert "cuttable blocks" in r["refused"], r
            else:
                assert r["compared"] > 0 and len(r["replicas"]) == partition, r


def test_docs_table_is_current():
    if sorted(_results) != RANK_COUNTS:
        pytest.skip("needs the results of every zoo run in this session")
    rows = [r for ranks in RANK_COUNTS for r in _results[ranks]]
    with open(os.path.join(RESULTS, "results.json"), "w") as f:
        json.dump(rows, f, indent=1)
    with open(DOCS) as f:
        text = f.read()
    updated = tables(text, rows, RTOL)
    if os.environ.get("ZOO_UPDATE_DOCS"):
        with open(DOCS, "w") as f:
            f.write(updated)
        return
    assert updated == text, ("docs/models.md's table differs from this run's results; "
                             "rerun with ZOO_UPDATE_DOCS=1 to rewrite it:\n" + updated)
