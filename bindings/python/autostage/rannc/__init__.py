"""RaNNC's Python API (``pyrannc``) over autostage.

A script written for RaNNC runs on autostage after one changed line::

    from autostage import rannc as pyrannc

The names, signatures and meanings follow pyrannc's documentation; what differs is listed in
docs/rannc-migration.md. Options autostage does not implement raise NotImplementedError naming
the option, so nothing a script asks for is silently dropped. RaNNC's configuration variables
(``RANNC_PARTITION_NUM`` ...) are read by autostage's config for the options both share
(``AUTOSTAGE_<KEY>`` wins when both are set).
"""

import logging
import weakref

import torch

from .. import _autostage
from ..module import Module
from ..structure import map_tensors
from . import amp  # noqa: F401  (pyrannc.amp)

logger = logging.getLogger("autostage.rannc")

_live_modules = weakref.WeakSet()  # live RaNNCModules, released by clear()
_zero_forced = False  # whether the last RaNNCModule set zero=1 (enable_zero=True)


def get_rank():
    """Rank of this process in MPI_COMM_WORLD."""
    return _autostage.get_rank()


def get_world_size():
    """Size of MPI_COMM_WORLD."""
    return _autostage.get_world_size()


def barrier():
    """Blocks until every rank reaches it."""
    _autostage.barrier()


def clear():
    """Releases every RaNNCModule's deployment (stages, buffers). A released module refuses
    further calls; wrap the model again to go on."""
    for module in list(_live_modules):
        module._release()


def delay_grad_allreduce(delay):
    """With ``True``, backward leaves gradients local (no allreduce over replicas);
    ``model.allreduce_grads()`` then performs it once (gradient accumulation)."""
    _autostage.delay_grad_allreduce(bool(delay))


def keep_graph(keep):
    """RaNNC passes ``keep`` to backward's ``retain_graph``. autostage frees each pipeline step
    after its backward, so only ``keep_graph(False)`` (the default behaviour) is accepted."""
    if keep:
        raise NotImplementedError(
            "keep_graph(True): autostage does not keep the pipeline's graph for a second "
            "backward of the same forward; run the forward again for each backward")


def sync_params_on_init(sync):
    """RaNNC can skip synchronising initial parameters. autostage always copies them from
    rank 0 when it deploys; ``False`` is accepted but changes nothing (logged)."""
    if not sync:
        logger.warning("sync_params_on_init(False): autostage always copies the initial "
                       "parameters from rank 0 at deployment")


def show_deployment(path, batch_size):
    """Prints a saved deployment: its stages, their ranks and the micro-batch size each replica
    runs for a global batch of ``batch_size``."""
    info = _autostage._read_deployment(str(path))
    micro = info["micro_batches"]
    lines = [f"Deployment {path}: world_size={info['world_size']} "
             f"planned batch_size={info['batch_size']} device_memory={info['device_memory']} "
             f"graph_hash={info['graph_hash']} schedule={info['schedule']} "
             f"micro_batches={micro}"]
    for stage in info["stages"]:
        replicas = len(stage["ranks"])
        per_replica = -(-batch_size // (micro * replicas))
        lines.append(f"  {stage['name']}: ranks={stage['ranks']} replicas={replicas} "
                     f"nodes={stage['node_count']} recompute={stage['recompute']} "
                     f"zero={int(stage.get('zero', False))} "
                     f"micro_batch_size={per_replica} "
                     f"fwd={stage['forward_seconds'] * 1e3:.3f}ms "
                     f"bwd={stage['backward_seconds'] * 1e3:.3f}ms "
                     f"memory={stage['memory_bytes']}")
    print("\n".join(lines), flush=True)


def allreduce_grads(rmodel, optimizer, prescale=1.0):
    """RaNNC's module-level allreduce after ``delay_grad_allreduce(True)``: multiplies this rank's
    gradients by ``prescale`` and sums them over their holders (``rmodel.allreduce_grads()``).
    Returns whether a loss-scale overflow happened (never: there is no Apex loss scaler).
    Collective: call on every rank."""
    if prescale != 1.0:
        with torch.no_grad():
            for p in rmodel.parameters():
                if p.grad is not None:
                    p.grad.mul_(prescale)
    rmodel.allreduce_grads()
    return False


def _unsupported(option, value, why):
    raise NotImplementedError(f"RaNNCModule({option}={value!r}): {why}")


class _GatherRows(torch.autograd.Function):
    """Concatenates every rank's rows (gather_inputs=False). Backward hands each rank the
    gradient of its own rows, times the world size: autostage averages gradients over the
    ranks' losses (as DDP), while here every rank computes the same loss of the whole batch."""

    @staticmethod
    def forward(ctx, rows, begin, end, world):
        ctx.span = (begin, end, world)
        return torch.cat(_autostage._all_gather(rows.detach().contiguous()))

    @staticmethod
    def backward(ctx, grad):
        begin, end, world = ctx.span
        return grad[begin:end] * world, None, None, None


class RaNNCModule(Module):
    """``pyrannc.RaNNCModule`` on autostage: wraps ``model`` (and trims ``optimizer`` to this
    rank's parameters after deployment), partitions it on the first call and trains it with
    the single-process loop. See autostage.Module for the runtime semantics."""

    def __init__(self, model, optimizer=None, gather_inputs=True, load_deployment=None,
                 enable_apex_amp=False, allreduce_amp_master_params=False, enable_zero=False,
                 check_unused_values=True, offload_params=False):
        if enable_apex_amp:
            if amp._apex_prepared(optimizer):
                raise _autostage.UnsupportedError(
                    "RaNNCModule(enable_apex_amp=True): the optimizer was prepared by Apex "
                    "(amp.initialize), whose fp16 model copy and master weights autostage does "
                    "not run; drop amp.initialize and pass precision='fp16' (dynamic loss "
                    "scaling) or precision='bf16' to autostage.Module")
            _autostage._log_info("RaNNC", "enable_apex_amp=True: the optimizer was not prepared "
                                 "by Apex (amp.initialize), so Apex is not used; training in "
                                 "the parameters' dtype")
        # allreduce_amp_master_params: RaNNC allreduces Apex's fp32 master gradients. Without
        # Apex the master parameters are the parameters: gradients are allreduced as usual.
        if offload_params:
            _unsupported("offload_params", offload_params,
                         "autostage does not offload parameters to host memory")
        # enable_zero: ZeRO-1 in every replicated stage (option zero=1); without it the
        # planner may still choose ZeRO-1 where a stage would not fit otherwise (zero=auto).
        # Options are process-wide: a module made with enable_zero=False after one made with
        # True must not inherit its zero=1.
        global _zero_forced
        zero = {}
        if enable_zero:
            zero, _zero_forced = {"zero": 1}, True
        elif _zero_forced:
            zero, _zero_forced = {"zero": "auto"}, False
        super().__init__(model, optimizer, load_deployment=load_deployment, **zero)
        self.gather_inputs = bool(gather_inputs)
        # RaNNC stops on unused graph values when this is true. autostage does not look for
        # them (docs/rannc-migration.md): both settings train the same way.
        self.check_unused_values = bool(check_unused_values)
        self.enable_apex_amp = bool(enable_apex_amp)
        self.allreduce_amp_master_param = bool(allreduce_amp_master_params)
        self.enable_zero = bool(enable_zero)
        # RaNNC's lookup tables of the model's parameters by name.
        self.name_to_param = dict(model.named_parameters())
        self.name_to_pid = {n: id(p) for n, p in self.name_to_param.items()}
        self._released = False
        _live_modules.add(self)

    # -- calls ----------------------------------------------------------------------------

    def forward(self, *args, **kwargs):
        if self._released:
            raise RuntimeError("this RaNNCModule was released by clear(); wrap the model "
                               "in a new RaNNCModule to go on")
        if self.gather_inputs:
            return super().forward(*args, **kwargs)
        return self._forward_rank0_inputs(args, kwargs)

    def _forward_rank0_inputs(self, args, kwargs):
        """gather_inputs=False: the batch is the one rank 0 passed (its positional tensors and
        tensors passed by keyword; other keyword values are every rank's own). Every rank runs
        its share of rank 0's rows and gets back the output of the whole batch."""
        world, rank = get_world_size(), get_rank()
        if not all(isinstance(value, torch.Tensor) for value in args):
            return super().forward(*args, **kwargs)  # autostage reports it on every rank
        names = [k for k, v in kwargs.items() if isinstance(v, torch.Tensor)]
        inputs = []
        for value in list(args) + [kwargs[k] for k in names]:
            copy = value.detach().clone().contiguous()
            if world > 1:
                _autostage._broadcast(copy, 0)
            inputs.append(copy)
        rows = inputs[0].size(0) if inputs and inputs[0].dim() > 0 else 0
        if rows % world:
            raise ValueError(f"gather_inputs=False: rank 0's batch of {rows} rows does not "
                             f"split evenly over {world} ranks; use a multiple of {world}")
        begin, end = rank * rows // world, (rank + 1) * rows // world
        inputs = [x[begin:end] if x.dim() > 0 else x for x in inputs]
        local_kwargs = dict(kwargs, **dict(zip(names, inputs[len(args):])))
        outputs = super().forward(*inputs[:len(args)], **local_kwargs)
        return map_tensors(lambda o: self._gather(o, begin, end, world), outputs)

    @staticmethod
    def _gather(output, begin, end, world):
        if output.dim() == 0 or world == 1:
            return output  # a loss is already the whole batch's (Note [Loss outputs])
        return _GatherRows.apply(output, begin, end, world)

    # -- parameters, gradients, state -----------------------------------------------------

    def parameters(self, *args, **kwargs):
        """The model's parameters before deployment; afterwards only this rank's (as RaNNC)."""
        local = self._local_ids()
        for p in self.model.parameters(*args, **kwargs):
            if local is None or p.data_ptr() in local:
                yield p

    def named_parameters(self, *args, **kwargs):
        local = self._local_ids()
        for name, p in self.model.named_parameters(*args, **kwargs):
            if local is None or p.data_ptr() in local:
                yield name, p

    def _local_ids(self):
        return {p.data_ptr() for p in self.local_parameters()} if self.ready else None

    def state_dict(self, *args, no_hook=False, amp_master_params=True, **kwargs):
        """The whole model's state with the original keys, on every rank. Collective after
        deployment. ``no_hook=True`` skips the model's state_dict hooks; amp_master_params
        only concerns Apex AMP, which is not supported."""
        if not no_hook:
            return super().state_dict(*args, **kwargs)
        stashed = {}
        for module in self.model.modules():
            stashed[module] = module._state_dict_hooks
            module._state_dict_hooks = type(module._state_dict_hooks)()
        try:
            return super().state_dict(*args, **kwargs)
        finally:
            for module, hooks in stashed.items():
                module._state_dict_hooks = hooks

    def zero_grad(self, set_to_none=False):
        """Sets the gradients of this rank's parameters to zero."""
        for p in self.model.parameters():
            if p.grad is not None:
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.detach_().zero_()

    def get_param(self, name, amp_master_param=False):
        """The current value of parameter ``name`` (a named_parameters name of the model) from
        the rank holding it. Collective after deployment: call on every rank."""
        return self._gather_param(name, amp_master_param, grad=False)

    def get_param_grad(self, name, amp_master_param=False):
        """The gradient of parameter ``name`` from the rank holding it (None when it has none).
        Collective after deployment: call on every rank."""
        return self._gather_param(name, amp_master_param, grad=True)

    def _gather_param(self, name, amp_master_param, grad):
        # amp_master_param: Apex's fp32 master copy; without Apex it is the parameter itself.
        params = dict(self.model.named_parameters())
        if name not in params:
            raise RuntimeError(f"No parameter found: {name}")
        param = params[name]
        if not self.ready:
            return param.grad if grad else param
        value = param.grad if grad else param.detach()
        held = param.data_ptr() in self._local_ids() and value is not None
        # The lowest rank holding it sends it to every rank (Note [Gathering from owners]).
        how = "get_param_grad()" if grad else "get_param()"
        gathered = _autostage._gather_from_owners([(name, value)] if held else [], how)
        if not gathered:
            return None if grad else param.detach().clone()  # no stage reads it: never trained
        return gathered[0][1]

    def _sync_orig_params(self, sync_all_ranks=False, sync_grad=False, name_pattern=None):
        """RaNNC's gather of the trained state into the original model's tensors: every
        parameter (whose name contains ``name_pattern``, when given) takes the value of the rank
        holding it, on rank 0 or, with ``sync_all_ranks``, on every rank; with ``sync_grad``
        also its gradient. Under ZeRO (``enable_zero``) the summed gradient is split over a
        stage's replicas after backward: ``sync_grad`` first gathers the pieces, so every
        replica (and the receiving ranks) hold the whole gradient. Collective: call on every
        rank. Does nothing before deployment."""
        if not self.ready:
            return
        if sync_grad and self._impl.zero_stage is not None:
            self._impl.gather_grads()
        names = sorted(n for n in self.name_to_param if name_pattern is None or name_pattern in n)
        local = self._local_ids()
        held = [n for n in names if self.name_to_param[n].data_ptr() in local]
        receive = sync_all_ranks or get_rank() == 0
        values = _autostage._gather_from_owners(
            [(n, self.name_to_param[n].detach()) for n in held], "sync_orig_params()")
        grads = _autostage._gather_from_owners(
            [(n, self.name_to_param[n].grad) for n in held
             if self.name_to_param[n].grad is not None],
            "sync_orig_params(sync_grad=True)") if sync_grad else []
        if receive:
            with torch.no_grad():
                for name, value in values:
                    param = self.name_to_param[name]
                    if param.data_ptr() not in local:
                        param.copy_(value.view(param.shape))
                for name, grad in grads:
                    param = self.name_to_param[name]
                    if param.data_ptr() in local:
                        continue
                    if param.grad is None:
                        param.grad = grad.view(param.shape).clone()
                    else:
                        param.grad.copy_(grad.view(param.shape))
        barrier()

    def _keep_local_parameters(self):
        super()._keep_local_parameters()
        if self._optimizer is not None:
            self._optimizer.param_zero_range = self._zero_ranges()

    def _zero_ranges(self):
        """RaNNC's ``optimizer.param_zero_range``: {id(parameter): slice} of each flattened
        parameter this rank's optimizer steps: its ZeRO-1 piece (empty where it owns none of a
        sharded parameter), or the whole of a parameter it steps unsharded."""
        by_ptr = {p.data_ptr(): p for p in self.model.parameters()}
        ranges = {}
        for tensor, offset, length in self._impl.zero_shards():
            param = by_ptr.get(tensor.data_ptr())
            if param is not None:
                ranges[id(param)] = slice(offset, offset + length)
        for p in self._impl.parameters():
            param = by_ptr.get(p.data_ptr())
            if param is not None and param.requires_grad and id(param) not in ranges:
                ranges[id(param)] = slice(0, param.numel())
        return ranges

    def save_deployment(self, file):
        """Rank 0 writes the deployment (graph partitioning) to ``file``."""
        if not self.ready:
            raise RuntimeError("Failed to save deployment. Module is not ready.")
        if get_rank() == 0:
            super().save_deployment(file)
        else:
            logger.debug("save_deployment works only on rank 0")

    # -- modes and lifetime ---------------------------------------------------------------

    def enable_dropout(self, enable):
        """Switches the model's dropout modules on (``True``) or off. After deployment the
        module is re-traced and re-planned on its next call (parameters, buffers and optimizer
        state carry over). Collective when deployed: call on every rank."""
        dropouts = [m for m in self.model.modules()
                    if isinstance(m, torch.nn.modules.dropout._DropoutNd)
                    and m.training != bool(enable)]
        for m in dropouts:
            m.train(bool(enable))
        if dropouts and self._impl is not None:
            self._redeploy_next_call()

    def undeploy(self):
        """Releases this module's deployment; the next call re-traces and re-plans with the
        current state. Collective: call on every rank."""
        if self._impl is not None:
            self._redeploy_next_call()

    def _redeploy_next_call(self):
        # Module._undeploy: the parameters, buffers and optimizer state carry over.
        self._undeploy()

    def _release(self):
        self._impl, self._last_mode, self._selection, self._selected = None, None, None, None
        self._released = True

    def __getattr__(self, attr):
        try:
            return super().__getattr__(attr)
        except AttributeError:
            model = self.__dict__.get("_modules", {}).get("model")
            if model is None or attr.startswith("__"):
                raise
            return getattr(model, attr)
