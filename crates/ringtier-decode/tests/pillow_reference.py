"""Reference outputs for the decode tests, computed with Pillow as torchvision does on PIL images.

Usage: pillow_reference.py CASES.json OUT_DIR. Each case: {"file", "op", "size", ...}; writes
OUT_DIR/<name>.rgb (HWC uint8). Ops:
  resize        img.convert('RGB').resize((s, s), BILINEAR)               (optionally after draft)
  center        torchvision Resize(resize) then CenterCrop(s)
  crop          img.crop(box).resize((s, s), BILINEAR), mirrored if flip  (RandomResizedCrop)
  box           img.resize((s, s), BILINEAR, box=box) after draft to `scale` (DCT-scaled crop)
"""
import json
import sys

from PIL import Image, ImageOps


def load(case):
    im = Image.open(case["file"])
    d = case.get("draft", 1)
    if d > 1:
        w, h = im.size
        im.draft("RGB", (w // d, h // d))
        want = ((w + d - 1) // d, (h + d - 1) // d)
        assert im.size == want, (im.size, want, d)
    return im.convert("RGB")


def run(case):
    s = case["size"]
    im = load(case)
    op = case["op"]
    if op == "resize":
        out = im.resize((s, s), Image.BILINEAR)
    elif op == "center":
        r = case["resize"]
        w, h = im.size
        if w <= h:
            ow, oh = r, int(r * h / w)
        else:
            ow, oh = int(r * w / h), r
        im = im.resize((ow, oh), Image.BILINEAR)
        top = int(round((oh - s) / 2.0))
        left = int(round((ow - s) / 2.0))
        out = im.crop((left, top, left + s, top + s))
    elif op == "crop":
        l, t, w, h = case["box"]
        out = im.crop((l, t, l + w, t + h)).resize((s, s), Image.BILINEAR)
    elif op == "box":
        l, t, w, h = case["box"]
        out = im.resize((s, s), Image.BILINEAR, box=(l, t, l + w, t + h))
    else:
        raise SystemExit(f"unknown op {op}")
    if case.get("flip"):
        out = ImageOps.mirror(out)
    return out.tobytes()


def main():
    cases = json.load(open(sys.argv[1]))
    for c in cases:
        with open(f"{sys.argv[2]}/{c['name']}.rgb", "wb") as f:
            f.write(run(c))


if __name__ == "__main__":
    main()
