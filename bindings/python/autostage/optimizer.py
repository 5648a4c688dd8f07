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

Note [ZeRO-1 optimizer]
In a stage planned with ZeRO-1 (staging/gradient_sync.h, Note [ZeRO-1]) each replica owns pieces
of the stage's flattened parameters, and after backward only those pieces hold the summed
gradient. The optimizer then holds, instead of such a parameter, one *shard* per owned piece: a
tensor that is a view of the parameter's elements [offset, offset + length) (``shards`` maps
id(shard) to (shard, parameter, offset, length)). So the optimizer's state is per piece,
1/replicas of the stage's, and PyTorch's own step updates the parameter in place.
``patch_zero_step`` wraps ``step`` (before: each shard's .grad becomes the view of its
parameter's .grad; after: the pieces are all-gathered into every replica, collective) and
``zero_grad`` (the whole parameter's gradient, not just the shard's view), so the user's loop
stays ``loss.backward(); optimizer.step(); optimizer.zero_grad()``. This needs state that is per
parameter element (``zero_problem``; autostage.Module checks before planning). The global state dict puts the pieces of each state tensor back
together (and cuts them out again when loading), so it has PyTorch's layout whatever the
deployment, the rank count or ZeRO.
"""

import math
import types

import torch

from . import _autostage

# Optimizers whose state is a tensor per parameter element (or a scalar per parameter, such as
# Adam's step), updated elementwise: a piece of a parameter can be stepped alone (Note [ZeRO-1
# optimizer]). Exact types: a subclass may compute across elements (LAMB's trust ratio).
ZERO_OPTIMIZERS = (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD, torch.optim.Adagrad,
                   torch.optim.RMSprop, torch.optim.Adamax, torch.optim.NAdam, torch.optim.RAdam,
                   torch.optim.Adadelta)


def zero_problem(optimizer):
    """Why `optimizer` cannot run under ZeRO-1, or "" when it can."""
    kind = type(optimizer)
    if kind in ZERO_OPTIMIZERS:
        return ""
    names = ", ".join(k.__name__ for k in ZERO_OPTIMIZERS)
    return (f"ZeRO-1 (zero=1) shards the optimizer state over a stage's replicas per parameter "
            f"element, but {kind.__module__}.{kind.__qualname__} is not known to keep per-element "
            f"state (supported: torch.optim {names}); use one of those, or set zero=0 to keep each "
            "replica's full optimizer state")


def make_shards(pieces):
    """{id(shard): (shard, parameter, offset, length)} and the shard tensors per parameter
    data_ptr, for the (parameter, offset, length) pieces this rank owns (Note [ZeRO-1
    optimizer]; pieces of length 0 mark sharded parameters it owns nothing of)."""
    shards, by_param = {}, {}
    for param, offset, length in pieces:
        if length == 0:
            continue  # sharded, but none of it is this rank's
        shard = torch.nn.Parameter(param.detach().view(-1).narrow(0, offset, length))
        shards[id(shard)] = (shard, param, offset, length)
        by_param.setdefault(param.data_ptr(), []).append(shard)
    return shards, by_param


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


def _encode(index, order, key, value, piece=""):
    """(name, tensor) for one state entry; the name keeps index, key order, type, the piece of
    the parameter (``offset+length`` under ZeRO-1, else empty) and key."""
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
    return f"{index}/{order}/{tag}/{piece}/{key}", tensor


def _decode(name, tensor):
    index, order, tag, piece, key = name.split("/", 4)
    if tag == "t":
        value = tensor
    elif tag == "n":
        value = None
    else:
        value = _SCALAR_TYPES[tag][0](tensor.item())
    if piece.startswith("tp"):  # a tensor-parallel slice: (member, degree, dim, parts, ZeRO)
        tp, _, zero = piece[2:].partition("|")
        member, degree, dim, parts = tp.split(":")
        offset = (int(member), int(degree), int(dim), _parts_of(parts),
                  int(zero.split("+")[0]) if zero else -1)
    else:
        offset = int(piece.split("+")[0]) if piece else -1
    return int(index), int(order), key, offset, value


# Note [Tensor-parallel optimizer state]
# A parameter held in tensor-parallel slices (Note [Tensor-parallel parameters] in
# staging/executor.cpp) has its elementwise state in the same slices on each member of its group.
# The global state dict gathers every member's slice (the piece names the member, the degree,
# the dimension and its parts) and joins them as the parameter's slices are joined; loading
# cuts this rank's slice out of the whole state again. Scalar state (Adam's step) is the same on
# every member. The parts are (size, whole) pairs along the dimension (Note [Fused parts] in
# decomposer/tensor_parallel_split.h): a member holds slice j of each cut part and every whole
# part, in order.
def _parts_text(parts):
    return ",".join(f"{size}{'w' if whole else ''}" for size, whole in parts)


def _parts_of(text):
    return tuple((int(p.rstrip("w")), p.endswith("w")) for p in text.split(","))


def _member_extent(parts, degree):
    return sum(size if whole else size // degree for size, whole in parts)


def _join_slices(values, dim, parts):
    pieces, at = [], 0
    for size, whole in parts:
        width = size if whole else size // len(values)
        pieces += [v.narrow(dim, at, width) for v in (values[:1] if whole else values)]
        at += width
    return torch.cat(pieces, dim)


def _cut_slice(whole_value, dim, parts, degree, index):
    pieces, at = [], 0
    for size, whole in parts:
        width = size if whole else size // degree
        pieces.append(whole_value.narrow(dim, at + (0 if whole else index * width), width))
        at += size
    return torch.cat(pieces, dim).clone()


def _one_layout(pieces):
    """The pieces of one holding of a table tied across stages that hold it differently (Note
    [Tied tables across stages] in staging/gradient_sync.h: whole on some ranks, in slices of
    different degrees on others; every holding has the same values): the whole ones if any, else
    the slices of the smallest degree."""
    whole = [(offset, value) for offset, value in pieces if not isinstance(offset, tuple)]
    if whole:
        return whole
    degree = min(offset[1] for offset, _ in pieces)
    return [(offset, value) for offset, value in pieces if offset[1] == degree]


def _assemble(pieces, shape):
    """One state value of a parameter of `shape` from the (offset, value) pieces of its shards:
    an elementwise state (a 1-d tensor per piece) is put back together in the parameter's shape;
    a scalar one (e.g. Adam's step, equal on every replica) is taken from the first piece.
    Tensor-parallel slices are joined, each first put together from its ZeRO-1 pieces (Note
    [Tensor-parallel optimizer state])."""
    pieces = _one_layout(pieces)
    offset, first = pieces[0]
    if isinstance(offset, tuple):
        _, degree, dim, parts, _ = offset
        slice_shape = list(shape)
        slice_shape[dim] = _member_extent(parts, degree)
        members = {}
        for (member, *_, zero), value in pieces:
            members.setdefault(member, []).append((zero, value))
        if sorted(members) != list(range(degree)):
            raise _autostage.InternalError(f"tensor-parallel slices {sorted(members)} of {degree}")
        values = [_assemble(members[m], slice_shape) for m in range(degree)]
        return _join_slices(values, dim, parts)
    if offset < 0 or not isinstance(first, torch.Tensor) or first.dim() != 1:
        return first
    whole = torch.zeros(math.prod(shape), dtype=first.dtype, device=first.device)
    for offset, value in pieces:
        whole[offset:offset + value.numel()] = value
    return whole.view(shape)


def global_state_dict(local, current_groups, all_groups, shards=None, slices=None):
    """The global state dict from PyTorch's `local` one (collective). `shards`: Note [ZeRO-1
    optimizer]; `slices`: {id(param): (dim, parts, degree, index, whole shape)}, Note
    [Tensor-parallel optimizer state]."""
    shards, slices = shards or {}, slices or {}
    _, local_index = _packed_indices(current_groups)
    global_packed, global_index = _packed_indices(all_groups)
    by_local = {local_index[id(p)]: p for params in current_groups for p in params}
    owned = []
    for index, entry in local["state"].items():
        p, piece = by_local[index], ""
        if id(p) in shards:
            _, p, offset, length = shards[id(p)]
            piece = f"{offset}+{length}"
        g = global_index[id(p)]
        spec = slices.get(id(p))
        for order, (key, value) in enumerate(entry.items()):
            elementwise = isinstance(value, torch.Tensor) and (
                value.shape == p.shape if not piece else value.dim() == 1)
            if spec is not None and elementwise:
                dim, parts, degree, member, _ = spec
                where = (f"tp{member}:{degree}:{dim}:{_parts_text(parts)}"
                         + (f"|{piece}" if piece else ""))
                owned.append(_encode(g, order, key, value, where))
            else:
                owned.append(_encode(g, order, key, value, piece))
    gathered = _autostage._gather_from_owners(owned, "optimizer.state_dict(from_global=True)")
    entries = sorted((_decode(name, t) for name, t in gathered),
                     key=lambda e: (*e[:3], isinstance(e[3], tuple), e[3]))
    params = {global_index[id(p)]: p for group in all_groups for p in group}
    pieces = {}
    for index, order, key, offset, value in entries:
        pieces.setdefault(index, {}).setdefault(key, []).append((offset, value))
    whole = {global_index[id(p)]: (slices[id(p)][4] if id(p) in slices else tuple(p.shape))
             for group in all_groups for p in group}
    state = {index: {key: _assemble(values, whole[index]) for key, values in keys.items()}
             for index, keys in pieces.items()}
    groups = []
    for group, indices in zip(local["param_groups"], global_packed):
        groups.append(dict(group, params=indices))
    return {"state": state, "param_groups": groups}


def _cut(entry, param, offset, length):
    """The state of one shard (Note [ZeRO-1 optimizer]) from its parameter's global entry."""
    def piece(value):
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape == param.shape:
            return value.reshape(-1)[offset:offset + length].clone()
        return value
    return {key: piece(value) for key, value in entry.items()}


def local_state_dict(state_dict, current_groups, all_groups, shards=None, slices=None):
    """This rank's share of a global state dict, in PyTorch's layout for `current_groups`, after
    checking that the dict was saved for the same groups (raises ConfigError naming the
    difference). `shards`: Note [ZeRO-1 optimizer]; `slices`: Note [Tensor-parallel optimizer
    state]."""
    shards, slices = shards or {}, slices or {}
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
            param = shards[id(p)][1] if id(p) in shards else p
            # An empty entry is no state (reading optimizer.state[p] of a parameter that has
            # none adds one; LibTorch 1.13's Adam.__setstate__ fails on it): left out.
            entry = state_dict["state"].get(saved_index[id(param)])
            if entry and id(param) in slices:  # Note [Tensor-parallel optimizer state]
                dim, parts, degree, member, whole = slices[id(param)]
                entry = {key: (_cut_slice(value, dim, parts, degree, member)
                               if isinstance(value, torch.Tensor) and tuple(value.shape) == whole
                               else value)
                         for key, value in entry.items()}
            if entry and id(p) in shards:
                _, param, offset, length = shards[id(p)]
                entry = _cut(entry, param, offset, length)
            if entry:
                state[local_index[id(p)]] = entry
    groups = [dict(saved, params=indices) for saved, indices in zip(saved_groups, local_packed)]
    return {"state": state, "param_groups": groups}


def patch_optimizer(optimizer, all_groups, deployed, shards=dict, slices=dict):
    """Adds the from_global flag to the instance's state_dict/load_state_dict. `all_groups`: the
    full parameter list of each group (before filtering); `deployed()`: whether the groups are
    filtered to this rank's parameters now; `shards()`: the current {id(shard): (shard,
    parameter, offset, length)} (Note [ZeRO-1 optimizer]; empty without ZeRO-1); `slices()`:
    Note [Tensor-parallel optimizer state]."""
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
        return global_state_dict(local, current_groups(), all_groups, shards(), slices())

    def load_state_dict(state_dict, from_global=False):
        if not from_global:
            return plain_load_state_dict(state_dict)
        return plain_load_state_dict(local_state_dict(state_dict, current_groups(), all_groups,
                                                      shards(), slices()))

    optimizer.state_dict = state_dict
    optimizer.load_state_dict = load_state_dict
    optimizer._autostage_patched = True


def patch_zero_step(optimizer, shards, gather, sharded_params):
    """Note [ZeRO-1 optimizer]: wraps the instance's step (shard gradients before, `gather()` of
    the stepped pieces after; collective) and zero_grad (the whole gradients of
    `sharded_params()`, the sharded parameters this rank holds, also those it owns no piece of:
    RaNNC's _sync_orig_params(sync_grad=True) gathers whole gradients into them), once.
    Both stay bound methods, so an LR scheduler made later can wrap step as usual (and one made
    earlier still finds its counting wrapper)."""
    if getattr(optimizer, "_autostage_zero_patched", False):
        return
    plain_step = optimizer.step
    plain_zero_grad = optimizer.zero_grad

    def step(self, *args, **kwargs):
        for shard, param, offset, length in shards().values():
            shard.grad = (None if param.grad is None
                          else param.grad.view(-1).narrow(0, offset, length))
        result = plain_step(*args, **kwargs)
        gather()
        return result

    def zero_grad(self, set_to_none=False):
        plain_zero_grad(set_to_none=set_to_none)
        for param in sharded_params():
            if param.grad is None:
                continue
            if set_to_none:
                param.grad = None
            else:
                with torch.no_grad():
                    param.grad.zero_()

    if hasattr(plain_step, "_with_counter"):
        step._with_counter = True
    optimizer.step = types.MethodType(step, optimizer)
    optimizer.zero_grad = types.MethodType(zero_grad, optimizer)
    optimizer._autostage_zero_patched = True
