"""The user's optimizer after deployment: global state dicts in PyTorch's own layout.

After deployment the optimizer's param_groups hold only this rank's parameters (autostage.Module
filters them), so PyTorch's ``state_dict()`` describes this rank's share. ``patch_optimizer``
adds ``from_global=True`` to ``state_dict`` / ``load_state_dict``:

- ``optimizer.state_dict(from_global=True)`` returns, on every rank, the dict the plain
  optimizer of the unwrapped model would return: ``param_groups`` with the global parameter
  indices (PyTorch's numbering over the full groups), ``state`` keyed by those indices, each
  entry gathered from the ranks that own the parameter (replicas hold identical state; the lowest
  rank's copy is taken). Collective: call it on every rank.
- ``optimizer.load_state_dict(sd, from_global=True)`` loads such a dict: each rank keeps the
  entries of its own parameters. Call it on every rank with the same dict; no communication.
  Before deployment it loads into the full optimizer.

Without the flag both keep PyTorch's local behaviour.
"""

import torch

from . import _autostage

# How a non-tensor state value travels through the tensor gather, by a one-letter tag.
_SCALAR_TAGS = {bool: "b", int: "i", float: "f"}
_SCALAR_TYPES = {"b": (bool, torch.bool), "i": (int, torch.int64), "f": (float, torch.float64)}


def _packed_indices(groups):
    """PyTorch's numbering (Optimizer.state_dict): per group, one index per parameter, counting
    on across groups; a parameter listed twice keeps its first index. Returns
    ([indices per group], {id(param): index})."""
    mapping, packed, start = {}, [], 0
    for params in groups:
        for i, p in enumerate(params, start):
            mapping.setdefault(id(p), i)
        packed.append([mapping[id(p)] for p in params])
        start += len(params)
    return packed, mapping


def _encode(index, order, key, value):
    """(name, tensor) for one state entry; the name keeps index, key order, type and key."""
    if isinstance(value, torch.Tensor):
        tag, tensor = "t", value
    elif value is None:
        tag, tensor = "n", torch.zeros(0)
    elif type(value) in _SCALAR_TAGS:
        tag = _SCALAR_TAGS[type(value)]
        tensor = torch.tensor(value, dtype=_SCALAR_TYPES[tag][1])
    else:
        raise _autostage.UnsupportedError(
            f"optimizer state '{key}' of parameter {index} is a {type(value).__name__}; "
            "state_dict(from_global=True) gathers tensors, numbers, bools and None")
    return f"{index}/{order}/{tag}/{key}", tensor


def _decode(name, tensor):
    index, order, tag, key = name.split("/", 3)
    if tag == "t":
        value = tensor
    elif tag == "n":
        value = None
    else:
        value = _SCALAR_TYPES[tag][0](tensor.item())
    return int(index), int(order), key, value


def global_state_dict(local, current_groups, all_groups):
    """The global state dict from PyTorch's `local` one (collective)."""
    _, local_index = _packed_indices(current_groups)
    global_packed, global_index = _packed_indices(all_groups)
    by_local = {local_index[id(p)]: p for params in current_groups for p in params}
    owned = []
    for index, entry in local["state"].items():
        g = global_index[id(by_local[index])]
        owned += [_encode(g, order, key, value) for order, (key, value) in enumerate(entry.items())]
    entries = sorted(_decode(name, t) for name, t in _autostage._gather_from_owners(owned))
    state = {}
    for index, _, key, value in entries:
        state.setdefault(index, {})[key] = value
    groups = []
    for group, indices in zip(local["param_groups"], global_packed):
        groups.append(dict(group, params=indices))
    return {"state": state, "param_groups": groups}


def local_state_dict(state_dict, current_groups, all_groups):
    """This rank's share of a global state dict, in PyTorch's layout for `current_groups`, after
    checking that the dict was saved for the same groups (raises ConfigError naming the
    difference)."""
    saved_groups = state_dict["param_groups"]
    if len(saved_groups) != len(all_groups):
        raise _autostage.ConfigError(
            f"the optimizer state dict has {len(saved_groups)} parameter group(s) but the "
            f"optimizer has {len(all_groups)}; load a state dict saved from an optimizer with the "
            "same param_groups")
    saved_index = {}
    for g, (saved, params) in enumerate(zip(saved_groups, all_groups)):
        if len(saved["params"]) != len(params):
            raise _autostage.ConfigError(
                f"param_groups[{g}] of the optimizer state dict has {len(saved['params'])} "
                f"parameter(s) but the optimizer's has {len(params)}; load a state dict saved "
                "from an optimizer over the same model's parameters")
        for index, p in zip(saved["params"], params):
            saved_index.setdefault(id(p), index)
    local_packed, local_index = _packed_indices(current_groups)
    state = {}
    for params in current_groups:
        for p in params:
            saved = saved_index[id(p)]
            if saved in state_dict["state"]:
                state[local_index[id(p)]] = state_dict["state"][saved]
    groups = [dict(saved, params=indices) for saved, indices in zip(saved_groups, local_packed)]
    return {"state": state, "param_groups": groups}


def patch_optimizer(optimizer, all_groups, deployed):
    """Adds the from_global flag to the instance's state_dict/load_state_dict. `all_groups`: the
    full parameter list of each group (before filtering); `deployed()`: whether the groups are
    filtered to this rank's parameters now."""
    if getattr(optimizer, "_autostage_patched", False):
        return
    plain_state_dict = optimizer.state_dict
    plain_load_state_dict = optimizer.load_state_dict

    def current_groups():
        return [list(group["params"]) for group in optimizer.param_groups]

    def state_dict(from_global=False):
        local = plain_state_dict()
        if not from_global or not deployed():
            return local
        return global_state_dict(local, current_groups(), all_groups)

    def load_state_dict(state_dict, from_global=False):
        if not from_global:
            return plain_load_state_dict(state_dict)
        return plain_load_state_dict(local_state_dict(state_dict, current_groups(), all_groups))

    optimizer.state_dict = state_dict
    optimizer.load_state_dict = load_state_dict
    optimizer._autostage_patched = True
