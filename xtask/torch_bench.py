"""PyTorch's counterparts of `gradwire bench kernels` on the same GPU.

torch.topk of the magnitudes (1 %), the f16 and bf16 casts, and a
device-to-device copy of the same bytes, on the same gradient-like data as
gradwire's benches (a cube of a uniform in [-1, 1] times 0.01), timed with
CUDA events as the median of repeated runs with rotating inputs. Prints one
row per measurement with the ratio against the copy, as gradwire does, so
the two tables compare directly.

    python3 torch_bench.py --sizes 1M,16M,64M [--secs 0.5]
"""

import argparse
import statistics
import time

import torch

ROTATION = 4


def parse_size(text):
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(text[:-1] if scale != 1 else text) * scale


def timed(fn, inputs, secs):
    fn(inputs[0])  # warm-up
    torch.cuda.synchronize()
    times = []
    start = time.perf_counter()
    i = 0
    while len(times) < 5 or time.perf_counter() - start < secs:
        begin = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        begin.record()
        fn(inputs[i % len(inputs)])
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) / 1e3)
        i += 1
        if len(times) >= 10_000:
            break
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1M,16M,64M")
    parser.add_argument("--secs", type=float, default=0.5)
    args = parser.parse_args()
    device = torch.device("cuda:0")
    print(f"# {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print(f"{'op':<12} {'elements':>10} {'secs':>12} {'GB/s':>9} {'copy GB/s':>10} {'vs copy':>8}")
    for n in (parse_size(s) for s in args.sizes.split(",")):
        g = torch.Generator(device=device).manual_seed(7)
        inputs = []
        for _ in range(ROTATION):
            u = torch.rand(n, generator=g, device=device) * 2 - 1
            inputs.append(u * u * u * 0.01)
        dst = torch.empty_like(inputs[0])
        k = max(1, -(-n // 100))
        ops = {
            "copy": lambda x: dst.copy_(x),
            "f16": lambda x: x.to(torch.float16),
            "bf16": lambda x: x.to(torch.bfloat16),
            "topk": lambda x: torch.topk(x.abs(), k, sorted=False),
        }
        copy = timed(ops["copy"], inputs, args.secs)
        copy_gbs = 4 * n / copy / 1e9
        for name, fn in ops.items():
            secs = copy if name == "copy" else timed(fn, inputs, args.secs)
            gbs = 4 * n / secs / 1e9
            print(f"{name:<12} {n:>10} {secs:>12.6f} {gbs:>9.1f} {copy_gbs:>10.1f} {gbs / copy_gbs:>8.3f}")


if __name__ == "__main__":
    main()
