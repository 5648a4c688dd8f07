"""Options as the Python layer reads and sets them (the config table lives in C++:
core/config.cpp), show_config, and the front end that captures models here."""

import torch

from . import _autostage
from .export import available as _export_available


def option_text(value):
    """An option's value as the config's text (booleans as true/false)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def option_value(key):
    """A config option's effective value as text (strings unquoted)."""
    return _autostage._get_option(key)


# The last capture of this process, for show_config: model class, front end and why it was not
# the setting's (Note [Front ends] in export.py).
last_capture = {}


def show_config():
    """Effective option values and where each came from, then the front end this process
    resolves front_end to and the one the last model captured here used."""
    text = _autostage.show_config()
    try:
        resolved = {"export": "torch.export", "torchscript": "TorchScript"}[front_end()]
        text += (f"front end: front_end={option_value('front_end') or 'auto'} captures with "
                 f"{resolved} here (PyTorch {torch.__version__})")
    except _autostage.ConfigError as e:
        text += f"front end: {e}"
    if last_capture:
        why = f", because {last_capture['why']}" if last_capture["why"] else ""
        text += (f"; the last model captured, {last_capture['model']}, used "
                 f"{last_capture['front_end']}{why}")
    return text + "\n"


def front_end():
    """The front end that captures models in this process, "export" or "torchscript" (option
    front_end; Note [Front ends] in export.py)."""
    setting = option_value("front_end") or "auto"
    if setting not in ("auto", "export", "torchscript"):
        raise _autostage.ConfigError(
            f"front_end={setting!r} is not a front end: use auto, export or torchscript")
    if setting == "export" and not _export_available():
        raise _autostage.ConfigError(
            f"front_end=export needs torch.export with the training IR (PyTorch 2.5 or later); "
            f"this is PyTorch {torch.__version__}: use front_end=torchscript or auto")
    if setting == "auto":
        return "export" if _export_available() else "torchscript"
    return setting


def option_enabled(key):
    """A boolean config option's effective value."""
    return option_value(key) == "true"
