"""A training script written for RaNNC, run on autostage (see test_rannc.py): apart from the
import line it uses only pyrannc's API and plain PyTorch. Each rank trains the wrapped model on
its local batch and, beside it, a plain model on the global batch, and prints what differs.
Usage: rannc_script_check.py DEPLOYMENT_PATH"""

import sys

import torch

from autostage import rannc as pyrannc  # the only autostage-specific line


class Net(torch.nn.Module):
    def __init__(self, hidden, layers):
        super().__init__()
        torch.manual_seed(7)
        self.layers = torch.nn.ModuleList([torch.nn.Linear(hidden, hidden) for _ in range(layers)])

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


def data(seed, rows, hidden):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, hidden, generator=g), torch.randn(rows, hidden, generator=g)


def close(a, b):
    return torch.allclose(a, b, rtol=1e-5, atol=1e-6)


def main():
    path = sys.argv[1]
    hidden, local = 16, 8
    rank, world = pyrannc.get_rank(), pyrannc.get_world_size()
    rows = slice(rank * local, (rank + 1) * local)
    failures = []

    model, reference = Net(hidden, 4), Net(hidden, 4)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.Adam(reference.parameters(), lr=1e-2)
    model = pyrannc.RaNNCModule(model, optimizer)
    criterion = torch.nn.MSELoss()

    for step in range(3):
        x, y = data(step, world * local, hidden)
        loss = criterion(model(x[rows]), y[rows])
        loss.backward()
        optimizer.step()
        model.zero_grad()
        ref_loss = criterion(reference(x)[rows], y[rows])
        criterion(reference(x), y).backward()
        ref_opt.step()
        ref_opt.zero_grad()
        if abs(loss.item() - ref_loss.item()) > 1e-5 * max(1.0, abs(ref_loss.item())):
            failures.append(f"step {step}: loss {loss.item()} != plain {ref_loss.item()}")

    # Gradients of one more batch, clipped by their global norm.
    x, y = data(10, world * local, hidden)
    criterion(model(x[rows]), y[rows]).backward()
    criterion(reference(x), y).backward()
    model.clip_grad_norm(0.01)
    torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.01)
    for name, p in reference.named_parameters():
        grad = model.get_param_grad(name)
        if grad is None or not close(grad, p.grad):
            failures.append(f"get_param_grad({name}) after clip_grad_norm differs from plain")
        if not close(model.get_param(name), p.detach()):
            failures.append(f"get_param({name}) differs from plain")

    state = model.state_dict()
    for key, value in reference.state_dict().items():
        if key not in state or not close(state[key], value):
            failures.append(f"state_dict()[{key}] differs from plain")
    plain = Net(hidden, 4)
    plain.load_state_dict(state)  # loadable by the unwrapped model

    model.save_deployment(path)
    pyrannc.barrier()
    if rank == 0:
        pyrannc.show_deployment(path, world * local)

    for failure in failures:
        print(f"rank {rank}: FAIL {failure}", flush=True)
    print(f"rank {rank}: rannc script checked; {len(failures)} failures", flush=True)
    pyrannc.barrier()
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
