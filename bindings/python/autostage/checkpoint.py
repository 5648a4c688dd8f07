"""Checkpoints that are never lost and never half-loaded.

``save_checkpoint(obj, path)`` writes with ``torch.save`` to a temporary file in the same directory,
fsyncs it and renames it over ``path``: a crash, a full disk or an exception during the write
leaves the previous file untouched and no temporary file behind. The file stays a plain
``torch.save`` archive (``torch.load`` reads it).

``load_checkpoint(path, model)`` refuses, with ``autostage.FormatError`` and before changing
anything, a file that is missing, not a ``torch.save`` archive, or corrupted (every member's
CRC-32 is checked: ``torch.load`` itself does not notice flipped bytes in tensor data), and a
state dict that does not fit the model (a key missing or unexpected, or a shape that differs):
the message names every such key and both shapes, and the model keeps all its values.
``autostage.Module.load_state_dict`` validates the same way.
"""

import os
import tempfile
import zipfile

import torch

from . import _autostage

_MAX_LISTED = 8  # problems listed in one message


def save_checkpoint(obj, path, rank=0):
    """Saves ``obj`` (a state dict or anything ``torch.save`` takes; a module saves its
    ``state_dict()``) to ``path`` atomically.

    For an ``autostage.Module`` the state dict is gathered from the stages, which is collective:
    call it on every rank. In a job of several ranks only ``rank`` writes (``rank=None``: every
    calling rank writes, e.g. to per-rank paths). Returns True on the rank that wrote.
    """
    if isinstance(obj, torch.nn.Module):
        obj = obj.state_dict()
    if rank is not None and _this_rank() != rank:
        return False
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path) + ".",
                               suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            torch.save(obj, out)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, _file_mode(path))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    _fsync_directory(directory)
    return True


def load_checkpoint(path, model=None, strict=True, map_location="cpu"):
    """Reads a checkpoint written by ``save_checkpoint`` (or ``torch.save``) and returns it; with
    ``model``, first checks that the state dict fits it and then loads it (``strict`` as in
    ``load_state_dict``). Nothing is loaded when any check fails.

    With an ``autostage.Module`` this is collective (call it on every rank): the ranks agree, so
    a file missing or damaged on one rank raises the same error on all of them.
    """
    from .module import Module  # here: module.py imports this file

    state, problem = None, ("", "")
    try:
        state = _read(os.fspath(path), map_location)
        if model is not None:
            problem = state_dict_problem(model.model if isinstance(model, Module) else model,
                                         state, strict)
    except _autostage.Error as e:
        problem = (type(e).__name__, str(e))
    if isinstance(model, Module):
        _autostage._agree("loading the checkpoint", *problem)
    elif problem[0]:
        raise getattr(_autostage, problem[0])(problem[1])
    if model is not None:  # checked above: load without checking again
        (model.model if isinstance(model, Module) else model).load_state_dict(state, strict=strict)
    return state


def load_state_dict_checked(model, state_dict, strict=True):
    """``model.load_state_dict(state_dict, strict)``, but raises FormatError without copying
    anything when the state dict does not fit the model (torch would copy every fitting tensor
    before raising, leaving a half-loaded model)."""
    error_class, message = state_dict_problem(model, state_dict, strict)
    if error_class:
        raise getattr(_autostage, error_class)(message)
    return model.load_state_dict(state_dict, strict=strict)


def state_dict_problem(model, state_dict, strict=True):
    """("FormatError", message) naming every key of ``state_dict`` that does not fit ``model``
    (missing or unexpected when ``strict``; a different shape always), or ("", "")."""
    if not isinstance(state_dict, dict):
        return ("FormatError", f"the checkpoint holds a {type(state_dict).__name__}, not a state "
                               "dict; save model.state_dict() (or the module) with "
                               "autostage.save_checkpoint")
    own = model.state_dict()
    problems, key_problems = [], 0
    for key, value in own.items():
        if key not in state_dict:
            if strict:
                problems.append(f"'{key}' is missing from the checkpoint")
                key_problems += 1
            continue
        given = state_dict[key]
        if not isinstance(value, torch.Tensor):
            continue  # extra state (get_extra_state): the module checks it itself
        if not isinstance(given, torch.Tensor):
            problems.append(f"'{key}' is a {type(given).__name__} in the checkpoint, not a tensor")
        elif not _shapes_fit(given.shape, value.shape):
            problems.append(f"'{key}' has shape {list(given.shape)} in the checkpoint but "
                            f"{list(value.shape)} in the model")
    if strict:
        unexpected = [key for key in state_dict if key not in own]
        problems += [f"'{key}' is in the checkpoint but not in the model" for key in unexpected]
        key_problems += len(unexpected)
    if not problems:
        return ("", "")
    listed = "; ".join(problems[:_MAX_LISTED])
    more = f"; and {len(problems) - _MAX_LISTED} more" if len(problems) > _MAX_LISTED else ""
    return ("FormatError",
            f"the checkpoint does not fit {type(model).__name__}: {listed}{more}. Nothing was "
            "loaded (the model is unchanged); load a checkpoint saved from this model with the "
            "same sizes" + (", or pass strict=False to skip missing and unexpected keys"
                            if key_problems else ""))


def _shapes_fit(given, own):
    # torch.nn.Module.load_state_dict accepts a 1-element vector for a 0-dim tensor.
    return list(given) == list(own) or (len(own) == 0 and list(given) == [1])


def _read(path, map_location):
    if not os.path.isfile(path):
        raise _autostage.FormatError(f"cannot open checkpoint file '{path}': no such file")
    if not zipfile.is_zipfile(path):
        raise _autostage.FormatError(
            f"checkpoint file '{path}' is not a torch.save archive (or is truncated): write "
            "checkpoints with autostage.save_checkpoint or torch.save")
    try:
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()
        damaged = None if damaged is None else f"member '{damaged}' fails its CRC-32 check"
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        damaged = f"the archive does not read ({e})"
    if damaged is not None:
        raise _autostage.FormatError(
            f"checkpoint file '{path}' is corrupted: {damaged}; load an intact copy "
            "(save_checkpoint never leaves a partial file)")
    try:
        return torch.load(path, map_location=map_location)
    except Exception as e:  # torch's own checks: version, pickled classes, storage records
        raise _autostage.FormatError(f"cannot load checkpoint file '{path}': "
                                     f"{type(e).__name__}: {e}") from e


def _this_rank():
    # Only ask MPI when launched by mpirun: a plain script should not start an MPI singleton.
    if "OMPI_COMM_WORLD_SIZE" not in os.environ and "PMI_SIZE" not in os.environ:
        return 0
    return _autostage.get_rank()


def _file_mode(path):
    try:
        return os.stat(path).st_mode & 0o7777  # keep the old file's permissions
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _fsync_directory(directory):
    # Makes the rename itself durable (the new directory entry reaches the disk).
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
