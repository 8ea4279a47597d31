"""PyTorch DDP's counterpart of `gradwire bench distopt --device cuda`.

What DDP adds to a step on one GPU (world size 1, NCCL), for ResNet-50's
parameter shapes (torchvision's, in declaration order, built as gradwire's
`resnet50_shapes` builds them: 161 tensors, 25,557,032 parameters). The
model's forward is `sum((p * c).sum())` over its parameters with a fixed
`c` per parameter, so that backward makes one fresh gradient per parameter
(`c`) in reverse order, as a network's backward does, at almost no cost of
its own; the optimizer is SGD with momentum 0.9 (lr 0.01), gradwire's.

Setups, each a model of its own, taking turns round after round (the
median over the rounds of the mean step time in a round; the device waited
for after every step): plain PyTorch (no DDP), DDP (default 25 MB
buckets), DDP with its fp16 compression hook, DDP with its PowerSGD hook
(rank 4, compressing from the first step). The "added ms" column is each
DDP setup's step minus the plain one's, as `gradwire bench distopt`'s is
DistOpt's step minus the optimizer alone's.

    python3 torch_ddp_bench.py [--steps 10] [--rounds 5] [--device cuda]

`--device cpu` runs the same on the CPU with the gloo backend (a check of
the script where there is no GPU), without the PowerSGD hook.
"""

import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP


def resnet50_shapes():
    """torchvision's ResNet-50 parameter shapes (gradwire's resnet50_shapes)."""
    shapes = []

    def conv_bn(out, inp, k):
        shapes.extend([(out, inp, k, k), (out,), (out,)])

    conv_bn(64, 3, 7)
    inp = 64
    for blocks, width in [(3, 64), (4, 128), (6, 256), (3, 512)]:
        for b in range(blocks):
            conv_bn(width, inp, 1)
            conv_bn(width, width, 3)
            conv_bn(width * 4, width, 1)
            if b == 0:
                conv_bn(width * 4, inp, 1)  # the projection shortcut
            inp = width * 4
    shapes.extend([(1000, 2048), (1000,)])
    return shapes


class Shapes(torch.nn.Module):
    """Parameters of the given shapes; forward is sum((p * c).sum())."""

    def __init__(self, shapes, device):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.params = torch.nn.ParameterList(
            torch.nn.Parameter((torch.rand(s, generator=g) * 0.2 - 0.1).to(device)) for s in shapes
        )
        for k, s in enumerate(shapes):
            self.register_buffer(f"c{k}", ((torch.rand(s, generator=g) * 2 - 1) * 0.01).to(device))

    def forward(self):
        total = None
        for k, p in enumerate(self.params):
            term = (p * getattr(self, f"c{k}")).sum()
            total = term if total is None else total + term
        return total


def setups(shapes, device):
    """(name, module to step, optimizer) of every setup."""
    made = []
    plain = Shapes(shapes, device)
    made.append(("plain (no DDP)", plain))
    ddp = DDP(Shapes(shapes, device), device_ids=None)
    made.append(("ddp", ddp))
    fp16 = DDP(Shapes(shapes, device), device_ids=None)
    fp16.register_comm_hook(state=None, hook=default_hooks.fp16_compress_hook)
    made.append(("ddp fp16 hook", fp16))
    if device.type == "cpu":
        # On gloo (torch 2.15, this project's 2-core machine) the hook hung
        # in 3 of 5 runs, two of its future callbacks waiting in
        # compute_qs and unpack_uncompressed_tensors; NCCL's path is the one
        # this script measures.
        print("# ddp powersgd rank 4: skipped on the CPU")
        return with_optimizers(made)
    try:
        import numpy  # noqa: F401 (PowerSGDState needs it)
    except ImportError:
        print("# ddp powersgd rank 4: skipped, PyTorch's PowerSGD hook needs numpy")
        return with_optimizers(made)
    psgd = DDP(Shapes(shapes, device), device_ids=None)
    state = powerSGD_hook.PowerSGDState(
        process_group=None,
        matrix_approximation_rank=4,
        start_powerSGD_iter=2,  # PyTorch's least; the warm-up round passes it
        min_compression_rate=2,
        use_error_feedback=True,
        warm_start=True,
    )
    psgd.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    made.append(("ddp powersgd rank 4", psgd))
    return with_optimizers(made)


def with_optimizers(made):
    """Each (name, module) with an SGD of its own (gradwire's settings)."""
    return [
        (name, module, torch.optim.SGD(module.parameters(), lr=0.01, momentum=0.9))
        for name, module in made
    ]


def wait(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(module, optimizer, steps, device):
    """Mean seconds per step over `steps` steps."""
    start = time.perf_counter()
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        module().backward()
        optimizer.step()
        wait(device)
    return (time.perf_counter() - start) / steps


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = parser.parse_args()
    device = torch.device("cuda:0" if args.device == "cuda" else "cpu")
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # A file store: no TCP port to find free (one run of this script hung
    # after a previous run on the same fixed port, with no error).
    with tempfile.TemporaryDirectory() as folder:
        store = dist.FileStore(os.path.join(folder, "store"), 1)
        dist.init_process_group(backend, store=store, rank=0, world_size=1)
        run(args, device, backend)
        dist.destroy_process_group()


def run(args, device, backend):
    """Every setup, in turns; prints the table."""
    shapes = resnet50_shapes()
    params = sum(torch.Size(s).numel() for s in shapes)
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else "CPU"
    print(f"# {name}, torch {torch.__version__}, {backend}, {len(shapes)} tensors, {params} parameters")
    made = setups(shapes, device)
    times = {n: [] for n, _, _ in made}
    for round_ in range(args.rounds + 1):
        for n, module, optimizer in made:
            secs = timed(module, optimizer, args.steps, device)
            if round_ > 0:  # the first round warms up (and passes PowerSGD's start)
                times[n].append(secs)
    plain = statistics.median(times[made[0][0]]) * 1e3
    print(f"{'setup':<22} {'params':>10} {'ms per step':>12} {'added ms':>9} {'vs plain':>9}")
    for n, _, _ in made:
        ms = statistics.median(times[n]) * 1e3
        print(f"{n:<22} {params:>10} {ms:>12.3f} {ms - plain:>9.3f} {ms / plain:>9.3f}")


if __name__ == "__main__":
    main()
