"""autostage: automatic pipeline-stage partitioning and training of PyTorch models.

The C++ core lives in the extension module ``autostage._autostage``; this package re-exports it
under Python names. Errors raised by the core are instances of :class:`autostage.Error`.
"""

import torch  # noqa: F401  (loads LibTorch before the extension that links against it)

from ._autostage import (  # noqa: F401
    __version__,
    Error,
    ConfigError,
    FormatError,
    UnsupportedError,
    PlanError,
    CommError,
    InternalError,
    IR,
    ExportedSubgraph,
)
from .torchscript import trace_to_ir  # noqa: F401
