"""The hook that ends the whole job when an exception reaches the top level on one rank only."""

import sys

from . import _autostage

_hook_installed = False


def install_abort_hook():
    """Note [Uncaught errors]: an exception that reaches the top level on one rank only (an error
    inside a stage, a lost peer) would leave the other ranks waiting, so the hook prints it and
    ends the whole job with MPI_Abort. Errors every rank raised alike (agreed bad-input errors,
    comm/agreement.h) let each rank exit normally instead."""
    global _hook_installed
    if _hook_installed:
        return
    _hook_installed = True
    previous = sys.excepthook

    def hook(etype, value, tb):
        previous(etype, value, tb)
        if issubclass(etype, KeyboardInterrupt) or str(value) == _autostage._last_agreed_error():
            return
        if _autostage.get_world_size() > 1:
            sys.stderr.flush()
            _autostage._abort_job(f"uncaught {etype.__name__} on rank {_autostage.get_rank()}: "
                                  f"{value}")

    sys.excepthook = hook
