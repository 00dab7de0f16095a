"""Photo-sized JPEGs for bench/python/transforms_bench.py: N images of about 500x375 (a quarter
portrait), smooth colour fields with texture and edges (not noise: about 62 KB each at quality
85, the size of ImageNet's photos), in 50 class directories.

    python bench/python/make_photos.py DIR N
"""

import io
import os
import sys

import numpy as np
from PIL import Image

root, n = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(42)
total = 0
for i in range(n):
    w, h = (500, 375) if rng.random() < 0.75 else (375, 500)
    w += int(rng.integers(-20, 21))
    h += int(rng.integers(-15, 16))
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.empty((h, w, 3), np.float32)
    for c in range(3):
        fx, fy = rng.uniform(0.005, 0.05, 2)
        img[..., c] = 120 + 80 * np.sin(x * fx + c + i) * np.cos(y * fy - c)
    img += rng.normal(0, 9, (h, w, 1)) + rng.normal(0, 6, img.shape)  # texture
    img[((x // (7 + i % 13)) + (y // (11 + i % 7))) % 6 == 0] += 45  # edges
    d = os.path.join(root, f"n{i % 50:04d}")
    os.makedirs(d, exist_ok=True)
    buf = io.BytesIO()
    Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(buf, format="JPEG", quality=85)
    with open(os.path.join(d, f"img{i:05d}.jpg"), "wb") as f:
        f.write(buf.getvalue())
    total += len(buf.getvalue())
print(f"{n} files, {total / 1e6:.1f} MB, {total / n / 1e3:.1f} KB mean")
