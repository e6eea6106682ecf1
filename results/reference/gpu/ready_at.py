"""When gradients become ready during a real backward, measured, against the model's assumption.

perf/terms.py's gradient_ready_at assumes backward visits the layers in reverse forward order,
each taking time in proportion to its forward multiply-adds. Here each parameter's
post-accumulate-grad hook records a CUDA event (or a host clock on CPU); the share of backward
done when each tenth of the gradient bytes is ready is compared with the assumption's.
Also: the forward's share of forward+backward, and images/s of the plain step.

Made ``ready_at.json`` beside it: ``python results/reference/gpu/ready_at.py ready_at.json [MODELS]`` on
a CUDA node (MODELS: a comma-separated subset of CASES' names) (on the CPU it skips resnet50 and measures fp32 only). On the H200, resnet50 bf16 at batch 128: 90%
of the gradient bytes ready at 0.34 of backward, against 0.49 assumed (the first layers' wide
activations cost more than their multiply-adds say); at batch 32 and for the small CIFAR models, where
kernels are launch-bound, later than assumed (resnet20: the first tenth at 0.25, against 0.06).
"""
import json
import sys
import time

import torch

from downpour_lib.engine import task_loss
from downpour_lib.models import MODELS, build_model
from downpour_lib.perf.terms import gradient_ready_at

CASES = [("resnet50", (3, 224, 224), 1000, 128), ("resnet20", (3, 32, 32), 10, 32),
         ("inception_small", (3, 32, 32), 10, 32), ("resnet50", (3, 224, 224), 1000, 32),
         ("gpt2", (1024,), 50257, 16), ("gpt-mini", (128,), 256, 32)]


def measure(name, shape, classes, batch, device, precision, steps=12, warm=5):
    torch.manual_seed(0)
    model = build_model(name, shape, classes).to(device)
    cuda = device.type == "cuda"
    lm = MODELS[name].task == "lm"  # tokens in, the next tokens as targets
    if cuda and not lm:
        model = model.to(memory_format=torch.channels_last)
    params = [p for p in model.parameters() if p.requires_grad]
    if lm:
        x = torch.randint(0, classes, (batch, *shape), device=device)
        y = torch.randint(0, classes, (batch, *shape), device=device)
        example = torch.randint(0, classes, (2, *shape))
    else:
        x = torch.randn(batch, *shape, device=device)
        if cuda:
            x = x.contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, classes, (batch,), device=device)
        example = torch.randn(2, *shape)
    analytic = gradient_ready_at(build_model(name, shape, classes), example)
    marks = {}

    def clock():
        if cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def hook(i):
        def f(_p):
            marks[i] = clock()
        return f

    handles = [p.register_post_accumulate_grad_hook(hook(i)) for i, p in enumerate(params)]
    opt = torch.optim.SGD(params, lr=0.01, momentum=0.9)
    dtype = {"bf16": torch.bfloat16, "fp32": None}[precision]
    shares, fwd_shares, step_s = [], [], []
    for s in range(warm + steps):
        marks.clear()
        t0 = clock()
        if dtype is not None:
            with torch.autocast(device.type, dtype=dtype):
                loss = task_loss(model(x), y)
        else:
            loss = task_loss(model(x), y)
        t1 = clock()
        loss.backward()
        t2 = clock()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t3 = clock()
        if cuda:
            torch.cuda.synchronize()
            el = lambda a, b: a.elapsed_time(b) / 1e3  # noqa: E731
        else:
            el = lambda a, b: b - a  # noqa: E731
        if s < warm:
            continue
        bwd = el(t1, t2)
        fwd_shares.append(el(t0, t1) / el(t0, t2))
        step_s.append(el(t0, t3))
        ready = sorted((el(t1, marks[i]) / bwd, params[i].numel()) for i in range(len(params)))
        total = sum(n for _, n in ready)
        out, done, k = [], 0, 1
        for t, n in ready:
            done += n
            while k <= 10 and done * 10 >= k * total:
                out.append(t)
                k += 1
        shares.append(out)
    for h in handles:
        h.remove()
    med = [sorted(c)[len(c) // 2] for c in zip(*shares, strict=True)]
    step = sorted(step_s)[len(step_s) // 2]
    return {"model": name, "batch": batch, "device": str(device), "precision": precision,
            "measured_ready_at": [round(v, 3) for v in med], "analytic_ready_at": list(analytic),
            "forward_share": round(sorted(fwd_shares)[len(fwd_shares) // 2], 3),
            "step_s": round(step, 5), "images_per_s": round(batch / step, 1)}


def main():
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    rows = []
    only = sys.argv[2].split(",") if len(sys.argv) > 2 else None  # e.g. gpt2,gpt-mini
    for name, shape, classes, batch in CASES:
        if only is not None and name not in only:
            continue
        if device.type == "cpu" and name in ("resnet50", "gpt2"):
            continue
        for precision in (["bf16", "fp32"] if device.type == "cuda" else ["fp32"]):
            r = measure(name, shape, classes, batch, device, precision)
            rows.append(r)
            print(json.dumps(r), flush=True)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
