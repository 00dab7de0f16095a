"""Train a ResNet-18 on an ImageNet-style folder with ringtier's input pipeline, checkpoints and
metrics: a file to copy and adapt.

    python examples/python/train_imagenet.py --data DIR [--steps N] [--device cpu]
        [--batch-size 32] [--image-size 224] [--workers 0] [--ckpt DIR] [--ckpt-every 20]
        [--metrics-addr 127.0.0.1:9464]

DIR is torchvision's ``ImageFolder`` layout: ``DIR/<class>/<image>.jpg`` (``ringtier gen
--format jpeg --dir DIR`` makes one). What each piece does:

* input: ``ringtier.torch.ImageFolder`` with ``ringtier.transforms`` (torchvision's names and
  semantics: RandomResizedCrop, RandomHorizontalFlip, ToDtype, Normalize), decoded and
  transformed on Rust threads a few batches ahead of the step; each batch is one
  ``(n, 3, S, S)`` float32 tensor (pinned when CUDA is available, for
  ``.cuda(non_blocking=True)``). ``--workers 0`` is the fast setting: the engine has its own
  threads;
* model: torchvision's ``resnet18`` when torchvision is installed, else the same network
  written out below (no dependency beyond torch);
* checkpoints: ``ringtier.CheckpointStore`` (durable on the fast tier, drained to the slow one
  in the background); the run resumes from the newest checkpoint found in ``--ckpt``;
* metrics: ``ringtier.serve_metrics`` serves Prometheus ``/metrics`` (loader stall, bytes read,
  checkpoint blocking time, ...) while the script runs.

The last line printed is one JSON object: images/s, stall % (the share of the loop spent
waiting for the next batch), steps, the last loss, the checkpoint step and the metrics address.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import urllib.request
from typing import Any, Dict, List, Optional

import torch
import torch.nn as nn
from torch.utils.data import DataLoader

import ringtier
import ringtier.torch as rt
from ringtier import transforms as T

# ---- the model -------------------------------------------------------------------------------


class BasicBlock(nn.Module):
    """ResNet's two 3x3 convolutions with a shortcut (He et al., 2016)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.downsample: Optional[nn.Module] = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        idt = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + idt)


class ResNet18(nn.Module):
    """ResNet-18 as torchvision builds it (11.7 M parameters for 1,000 classes)."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)
        )
        layers: List[nn.Module] = []
        cin = 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.layers(self.stem(x))), 1))


def make_model(num_classes: int) -> nn.Module:
    try:
        from torchvision.models import resnet18

        return resnet18(num_classes=num_classes)
    except ImportError:
        return ResNet18(num_classes)


# ---- the run ---------------------------------------------------------------------------------


def scrape(addr: str) -> Dict[str, float]:
    """A few of ringtier's metrics, read over HTTP as Prometheus would."""
    text = urllib.request.urlopen(f"http://{addr}/metrics", timeout=5).read().decode()
    want = ("ringtier_loader_stall_seconds_sum", "ringtier_loader_batches_total", "ringtier_checkpoint_blocking_seconds_sum")
    out: Dict[str, float] = {}
    for line in text.splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name in want:
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def optimizer_state(opt: torch.optim.Optimizer) -> Dict[str, Any]:
    """The optimizer's state dict with string keys (the store's keys are strings; torch's
    optimizers key their per-parameter state by parameter index)."""
    sd = opt.state_dict()
    return {"state": {str(k): v for k, v in sd["state"].items()}, "param_groups": sd["param_groups"]}


def load_optimizer_state(opt: torch.optim.Optimizer, saved: Dict[str, Any]) -> None:
    opt.load_state_dict({"state": {int(k): v for k, v in saved["state"].items()},
                         "param_groups": saved["param_groups"]})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="ImageFolder root: DIR/<class>/<image>.jpg")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--workers", type=int, default=0, help="DataLoader workers (0 is the fast setting)")
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--ckpt", help="checkpoint directory (fast/ and slow/ tiers under it); default a temporary one")
    ap.add_argument("--ckpt-every", type=int, default=50, help="steps between checkpoints (and one at the end)")
    ap.add_argument("--metrics-addr", default="127.0.0.1:0", help="where /metrics is served (port 0: any free one)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    device = torch.device(a.device)

    # Metrics first: loaders and stores register theirs when they are made.
    addr = ringtier.serve_metrics(a.metrics_addr)

    train_tf = T.Compose([
        T.RandomResizedCrop(a.image_size),
        T.RandomHorizontalFlip(),
        T.ToDtype(torch.float32, scale=True),
        T.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
    ])
    ds = rt.ImageFolder(a.data, transform=train_tf, batch_size=a.batch_size, seed=a.seed, drop_last=True)
    # The dataset makes the batches: batch_size=None here.
    dl = DataLoader(ds, batch_size=None, num_workers=a.workers, persistent_workers=a.workers > 0)

    model = make_model(len(ds.classes)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9, weight_decay=1e-4)
    loss_fn = nn.CrossEntropyLoss()

    tmp = None
    if a.ckpt is None:
        tmp = tempfile.TemporaryDirectory(prefix="ringtier-example-")
        a.ckpt = tmp.name
    tiers = [os.path.join(a.ckpt, "fast"), os.path.join(a.ckpt, "slow")]
    for t in tiers:
        os.makedirs(t, exist_ok=True)
    store = ringtier.CheckpointStore(tiers, prefix="resnet18", keep_last=2)
    step, epoch = 0, 0
    if store.latest() is not None:
        state = store.load()
        model.load_state_dict(state["model"])
        load_optimizer_state(opt, state["optimizer"])
        step, epoch = int(state["step"]), int(state["epoch"])
        print(f"resumed from step {step} (epoch {epoch})", flush=True)

    def checkpoint() -> Any:
        # async_save copies the state and returns: the next steps overlap the write.
        return store.async_save(step, {"model": model.state_dict(), "optimizer": optimizer_state(opt),
                                       "step": step, "epoch": epoch})

    model.train()
    pending = None
    first = step
    images = 0
    wait_s = 0.0
    loss_v = float("nan")
    t_start = time.perf_counter()
    while step < first + a.steps:
        ds.set_epoch(epoch)
        it = iter(dl)
        at_start = step
        while step < first + a.steps:
            t0 = time.perf_counter()
            try:
                x, y = next(it)
            except StopIteration:
                break
            x = x.to(device, non_blocking=True)
            y = y.to(device, non_blocking=True)
            wait_s += time.perf_counter() - t0
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            step += 1
            images += x.shape[0]
            if step % a.ckpt_every == 0:
                if pending is not None:
                    pending.result()
                pending = checkpoint()
            if step % 10 == 0 or step == first + 1:
                loss_v = loss.item()
                el = time.perf_counter() - t_start
                print(f"step {step} epoch {epoch} loss {loss_v:.3f} {images / el:.1f} images/s "
                      f"stall {100 * wait_s / el:.1f}%", flush=True)
        else:
            break
        if step == at_start:
            raise SystemExit(f"{a.data}: an epoch gave no batch of {a.batch_size} images (too few images?)")
        epoch += 1
    loss_v = float(loss.item()) if images else loss_v
    elapsed = time.perf_counter() - t_start
    if pending is not None:
        pending.result()
    if step % a.ckpt_every != 0 and images:
        checkpoint().result()
    metrics = scrape(addr)
    store.close(drain=True)
    if tmp is not None:
        tmp.cleanup()
    print(json.dumps({
        "images_per_s": round(images / elapsed, 2),
        "stall_pct": round(100 * wait_s / elapsed, 2),
        "steps": step - first,
        "images": images,
        "batch_size": a.batch_size,
        "image_size": a.image_size,
        "workers": a.workers,
        "device": str(device),
        "loss": round(loss_v, 4),
        "checkpoint_step": step,
        "metrics_addr": addr,
        "loader_stall_seconds": round(metrics.get("ringtier_loader_stall_seconds_sum", 0.0), 3),
        "model": type(model).__module__.split(".")[0] + "." + type(model).__name__,
    }))


if __name__ == "__main__":
    main()
