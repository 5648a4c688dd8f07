"""autostage: automatic pipeline-stage partitioning and training of PyTorch models.

The C++ core lives in the extension module ``autostage._autostage``; this package re-exports it
under Python names. Errors raised by the core are instances of :class:`autostage.Error`.
"""

import torch  # noqa: F401  (loads LibTorch before the extension that links against it)

from . import _autostage
from ._autostage import (  # noqa: F401
    __version__,
    Error,
    ConfigError,
    FormatError,
    UnsupportedError,
    PlanError,
    CommError,
    InternalError,
    DryRunFinished,
    Graph,
    IR,
    ExportedSubgraph,
)
from ._autostage import barrier, delay_grad_allreduce, get_rank, get_world_size  # noqa: F401
from .checkpoint import load_checkpoint, save_checkpoint  # noqa: F401
from .grad_scaler import GradScaler  # noqa: F401
from .module import Module  # noqa: F401
from .options import show_config  # noqa: F401
from .export import export_to_ir  # noqa: F401
from .torchscript import trace_to_ir  # noqa: F401


def save_graph(ir_or_graph, path):
    """Write the IR graph of ``trace_to_ir``'s result (or an autostage.Graph) to ``path``.

    The file is a versioned, hashed autostage graph file, written atomically.
    """
    graph = ir_or_graph.graph if isinstance(ir_or_graph, IR) else ir_or_graph
    _autostage._save_graph(graph, str(path))


def shard_patterns(ir_or_graph):
    """What Megatron-style tensor parallelism would split in the IR (Note [Tensor-parallel
    patterns]): one dict per pattern, in node order, with ``kind`` (attention, mlp, embedding or
    lm_head), ``scope`` (the module of its first node), ``nodes`` (their outputs' names) and
    ``degrees`` (those of 2, 4 and 8 it splits at in a stage holding it whole: where heads,
    features or vocabulary rows divide and the layout is one the split follows; an empty list
    where it stays replicated at every degree). Everything else stays replicated within a
    tensor-parallel group."""
    graph = ir_or_graph.graph if isinstance(ir_or_graph, IR) else ir_or_graph
    return [{"kind": kind, "scope": scope, "nodes": list(nodes), "degrees": list(degrees)}
            for kind, scope, nodes, degrees in _autostage._shard_patterns(graph)]


def load_graph(path):
    """Read a graph file written by :func:`save_graph`; raises autostage.FormatError when the
    file is truncated, corrupted, of another kind or of an unsupported version."""
    return _autostage._load_graph(str(path))
