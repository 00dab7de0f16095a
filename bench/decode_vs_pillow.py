#!/usr/bin/env python3
"""The Pillow side of `ringtier bench decode`: what a PyTorch DataLoader worker runs per image.

One pass over JPEGs held in memory (so only decode and transform are timed), one Python thread,
with the transform chains of torchvision on PIL images:

  resize         Image.open(f).convert('RGB').resize((s, s), BILINEAR)      (issue 17's baseline)
  resize-draft   the same after im.draft('RGB', (s, s)) (DCT-domain downscaling; not what
                 torchvision does, listed as Pillow's best case)
  center         Resize(s * 8 / 7) + CenterCrop(s)  (eval; 256/224)
  rrc-flip       RandomResizedCrop(s) + RandomHorizontalFlip()   (train)
  rrc-flip-norm  the same + ToTensor() + Normalize(ImageNet mean/std): CHW float32 (needs numpy)

torchvision is not needed: its PIL code paths are reproduced here (get_params, crop, resize,
mirror, the float conversion). Prints one JSON line: chain, images, seconds, cpu_seconds.

  decode_vs_pillow.py --list FILES.txt --chain rrc-flip [--size 224] [--seed 0]
  decode_vs_pillow.py --dir DIR --files 2000 --chain resize       (standalone: first N *.jpg)
"""
import argparse
import io
import json
import math
import os
import random
import sys
import time

from PIL import Image, ImageOps, features

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def rrc_params(w, h, rng, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """torchvision.transforms.RandomResizedCrop.get_params (left, top, width, height)."""
    area = w * h
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        cw = int(round(math.sqrt(target * aspect)))
        ch = int(round(math.sqrt(target / aspect)))
        if 0 < cw <= w and 0 < ch <= h:
            return rng.randint(0, w - cw), rng.randint(0, h - ch), cw, ch
    in_ratio = w / h
    if in_ratio < min(ratio):
        cw, ch = w, int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        ch, cw = h, int(round(h * max(ratio)))
    else:
        cw, ch = w, h
    return (w - cw) // 2, (h - ch) // 2, cw, ch


def make_chain(name, s, rng):
    if name == "resize":
        return lambda b: Image.open(io.BytesIO(b)).convert("RGB").resize((s, s), Image.BILINEAR)

    if name == "resize-draft":
        def f(b):
            im = Image.open(io.BytesIO(b))
            im.draft("RGB", (s, s))
            return im.convert("RGB").resize((s, s), Image.BILINEAR)
        return f

    if name == "center":
        r = s * 8 // 7

        def f(b):
            im = Image.open(io.BytesIO(b)).convert("RGB")
            w, h = im.size
            ow, oh = (r, int(r * h / w)) if w <= h else (int(r * w / h), r)
            im = im.resize((ow, oh), Image.BILINEAR)
            top, left = int(round((oh - s) / 2.0)), int(round((ow - s) / 2.0))
            return im.crop((left, top, left + s, top + s))
        return f

    if name in ("rrc-flip", "rrc-flip-norm"):
        def crop(b):
            im = Image.open(io.BytesIO(b)).convert("RGB")
            left, top, cw, ch = rrc_params(im.size[0], im.size[1], rng)
            im = im.crop((left, top, left + cw, top + ch)).resize((s, s), Image.BILINEAR)
            if rng.random() < 0.5:
                im = ImageOps.mirror(im)
            return im
        if name == "rrc-flip":
            return crop
        import numpy as np
        mean = np.array(MEAN, dtype=np.float32).reshape(3, 1, 1)
        std = np.array(STD, dtype=np.float32).reshape(3, 1, 1)

        def norm(b):
            # ToTensor: HWC uint8 -> CHW float in [0, 1]; Normalize: (x - mean) / std.
            x = np.asarray(crop(b), dtype=np.uint8).transpose(2, 0, 1).astype(np.float32) / 255.0
            return (x - mean) / std
        return norm

    raise SystemExit(f"unknown chain {name}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--list", help="file with one JPEG path per line")
    p.add_argument("--dir", help="directory to take the first --files *.jpg from (sorted)")
    p.add_argument("--files", type=int, default=2000)
    p.add_argument("--chain", default="resize")
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    if a.list:
        paths = [l.strip() for l in open(a.list) if l.strip()]
    elif a.dir:
        paths = []
        for root, _, names in os.walk(a.dir):
            paths += [os.path.join(root, n) for n in names if n.endswith(".jpg")]
        paths = sorted(paths)[: a.files]
    else:
        p.error("--list or --dir")
    data = [open(x, "rb").read() for x in paths]
    f = make_chain(a.chain, a.size, random.Random(a.seed))
    c0, t0 = time.process_time(), time.perf_counter()
    for b in data:
        f(b)
    t, c = time.perf_counter() - t0, time.process_time() - c0
    print(json.dumps({
        "chain": a.chain, "images": len(data), "seconds": t, "cpu_seconds": c,
        "pillow": Image.__version__ if hasattr(Image, "__version__") else None,
        "libjpeg_turbo": bool(features.check_feature("libjpeg_turbo")),
        "python": sys.version.split()[0],
    }))


if __name__ == "__main__":
    main()
