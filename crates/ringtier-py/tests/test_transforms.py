"""``ringtier.transforms`` against torchvision's ``transforms.v2`` on the same images, and the
datasets that run them (``ringtier.torch.ImageFolder``, ``transform=`` on the file and record
datasets).

The seed-free transforms (Resize, CenterCrop, a forced flip, ToDtype, Normalize) are compared
on the same decoded pixels: at most 1 level of difference per byte and a mean of at most 0.35.
JPEG decode is compared separately, with the decoder's own tolerance (docs/DECODE.md)."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
import pytest

torch = pytest.importorskip("torch")
tv = pytest.importorskip("torchvision")
Image = pytest.importorskip("PIL.Image")
from torchvision.transforms import v2  # noqa: E402

import ringtier  # noqa: E402
import ringtier.torch as rt  # noqa: E402
from ringtier import transforms as T  # noqa: E402

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]

# The acceptance bound on the seed-free transforms, in levels of 0..255.
MAX_LEVELS, MEAN_LEVELS = 1, 0.35


def photo(h: int, w: int, seed: int) -> np.ndarray:
    """An (h, w, 3) uint8 image with the structure of a photo: smooth gradients, edges, noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.empty((h, w, 3), np.float32)
    for c in range(3):
        fx, fy = rng.uniform(0.005, 0.08, 2)
        img[..., c] = 127 + 90 * np.sin(x * fx + c) * np.cos(y * fy - c)
    img[(x // 17 + y // 23) % 5 == 0] += 60  # hard edges
    img += rng.normal(0, 8, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def levels(ours: torch.Tensor, theirs: torch.Tensor, scale: List[float], offset: List[float]) -> Tuple[float, float]:
    """Largest and mean difference in levels of 0..255, where value = level * scale + offset."""
    assert ours.shape == theirs.shape, (ours.shape, theirs.shape)
    s = torch.tensor(scale).view(3, 1, 1)
    o = torch.tensor(offset).view(3, 1, 1)
    a = (ours.double() - o) / s
    b = (theirs.double() - o) / s
    d = (a - b).abs()
    return float(d.max()), float(d.mean())


SIZES = [(375, 500), (500, 375), (333, 333), (120, 90), (64, 300), (1001, 769)]

SEED_FREE = [
    ("Resize(224,224)", lambda m: [m.Resize((224, 224))]),
    ("Resize(256)+CenterCrop(224)", lambda m: [m.Resize(256), m.CenterCrop(224)]),
    ("Resize(73)+CenterCrop(64)", lambda m: [m.Resize(73), m.CenterCrop(64)]),
    ("CenterCrop(64)", lambda m: [m.CenterCrop(64)]),
    ("flip(p=1)+Resize(160,160)", lambda m: [m.RandomHorizontalFlip(p=1.0), m.Resize((160, 160))]),
    ("Resize(160,160)+flip(p=0)", lambda m: [m.Resize((160, 160)), m.RandomHorizontalFlip(p=0.0)]),
]

DTYPES = [
    ("uint8", lambda m: [], [1.0] * 3, [0.0] * 3),
    ("ToDtype(uint8)", lambda m: [m.ToDtype(torch.uint8)], [1.0] * 3, [0.0] * 3),
    ("ToDtype(float32,scale)", lambda m: [m.ToDtype(torch.float32, scale=True)], [1 / 255] * 3, [0.0] * 3),
    ("ToDtype(float32)", lambda m: [m.ToDtype(torch.float32)], [1.0] * 3, [0.0] * 3),
    (
        "ToDtype(float32,scale)+Normalize",
        lambda m: [m.ToDtype(torch.float32, scale=True), m.Normalize(MEAN, STD)],
        [1 / 255 / s for s in STD],
        [-mu / s for mu, s in zip(MEAN, STD)],
    ),
]


@pytest.mark.parametrize("geometry", SEED_FREE, ids=[g[0] for g in SEED_FREE])
@pytest.mark.parametrize("dtype", DTYPES, ids=[d[0] for d in DTYPES])
def test_seed_free_transforms_match_torchvision_within_one_level(geometry, dtype):
    gname, geo = geometry
    dname, dt, scale, offset = dtype
    worst, worst_mean = 0.0, 0.0
    for i, (h, w) in enumerate(SIZES):
        if gname == "CenterCrop(64)" and (h < 64 or w < 64):
            continue
        hwc = photo(h, w, seed=i)
        chw = torch.from_numpy(hwc).permute(2, 0, 1).contiguous()
        theirs = v2.Compose(geo(v2) + dt(v2))(chw)
        ours = T.Compose(geo(T) + dt(T))(chw)
        assert ours.dtype == theirs.dtype, (ours.dtype, theirs.dtype)
        mx, mean = levels(ours, theirs, scale, offset)
        worst, worst_mean = max(worst, mx), max(worst_mean, mean)
        assert mx <= MAX_LEVELS + 1e-3 and mean <= MEAN_LEVELS, f"{gname} {dname} {h}x{w}: max {mx:.3f} mean {mean:.4f}"
    print(f"{gname} {dname}: worst max {worst:.3f} levels, worst mean {worst_mean:.4f}")


def test_torchvision_objects_compile_and_agree():
    """A torchvision v2 Compose is accepted as is (converted) and gives the same pixels."""
    tvc = v2.Compose([v2.ToImage(), v2.Resize(256), v2.CenterCrop(224), v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)])
    pipe = T.compile_transform(tvc)
    assert (pipe.size, pipe.dtype) == (224, "float32")
    ours = T.Compose(list(tvc.transforms))
    chw = torch.from_numpy(photo(375, 500, 3)).permute(2, 0, 1).contiguous()
    mx, mean = levels(ours(chw), tvc(chw), [1 / 255 / s for s in STD], [-m / s for m, s in zip(MEAN, STD)])
    assert mx <= MAX_LEVELS + 1e-3 and mean <= MEAN_LEVELS


def test_random_transforms_are_reproducible_per_seed_epoch_index():
    t = T.Compose([T.RandomResizedCrop(96), T.RandomHorizontalFlip(), T.ToDtype(torch.float32, scale=True)])
    img = photo(300, 400, 1)
    a = t(img, index=5, epoch=2, seed=11)
    assert torch.equal(a, t(img, index=5, epoch=2, seed=11))
    others = [t(img, index=6, epoch=2, seed=11), t(img, index=5, epoch=3, seed=11), t(img, index=5, epoch=2, seed=12)]
    assert all(not torch.equal(a, o) for o in others)
    # The crop follows torchvision's get_params: the scale range is honoured (a full-image
    # crop resized equals Resize((96, 96)); scale=(1, 1) and ratio of the image forces it).
    full = T.Compose([T.RandomResizedCrop(96, scale=(1.0, 1.0), ratio=(4 / 3, 4 / 3))])
    ref = T.Compose([T.Resize((96, 96))])
    assert torch.equal(full(img, index=3), ref(img))


def write_jpegs(root: Path, per_class: Dict[str, int], seed: int = 0) -> Dict[str, np.ndarray]:
    """JPEGs of photo-like content in class directories; returns PIL's decode of each."""
    decoded = {}
    rng = np.random.default_rng(seed)
    for c, n in per_class.items():
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            h, w = (int(v) for v in rng.integers(80, 420, 2))
            buf = io.BytesIO()
            Image.fromarray(photo(h, w, seed * 1000 + i + hash(c) % 97)).save(buf, format="JPEG", quality=90)
            key = f"{c}/img{i:03d}.jpg"
            (root / key).write_bytes(buf.getvalue())
            decoded[key] = np.array(Image.open(io.BytesIO(buf.getvalue())).convert("RGB"))
    return decoded


def draft_reference(jpeg: bytes, region_side: int, size: int) -> np.ndarray:
    """PIL's decode as the build's decoder sees the image: libjpeg-turbo decodes DCT-scaled
    (the largest of 1/8, 1/4, 1/2 that keeps a region of `region_side` pixels at least `size`:
    Pillow's ``draft`` rule, docs/DECODE.md), zune-jpeg at full size."""
    im = Image.open(io.BytesIO(jpeg))
    if ringtier.JPEG_DECODER == "libjpeg-turbo":
        w, h = im.size
        d = next((d for d in (8, 4, 2) if region_side >= size * d), 1)
        if d > 1:
            im.draft("RGB", (w // d, h // d))
    return np.array(im.convert("RGB"))


@pytest.fixture
def folder(tmp_path: Path):
    root = tmp_path / "folder"
    decoded = write_jpegs(root, {"n02": 7, "a01": 5, "Zeta": 4})
    (root / "a01" / "notes.txt").write_text("not an image")
    return root, decoded


def test_image_folder_matches_torchvisions_classes_samples_and_targets(folder):
    root, _ = folder
    ours = rt.ImageFolder(root, transform=T.Compose([T.Resize((32, 32))]))
    theirs = tv.datasets.ImageFolder(str(root))
    assert ours.classes == theirs.classes == ["Zeta", "a01", "n02"]
    assert ours.class_to_idx == theirs.class_to_idx
    assert [(os.path.join(root, k), t) for k, t in ours.samples] == theirs.samples
    assert ours.targets == theirs.targets


def test_image_folder_batches_are_decoded_labelled_and_every_sample_once(folder):
    root, decoded = folder
    t = T.Compose([T.Resize((48, 48)), T.ToDtype(torch.float32, scale=True)])
    ds = rt.ImageFolder(root, transform=t, batch_size=5, seed=3)
    label_of = {k: lab for k, lab in ds.samples}
    seen = 0
    for images, labels in ds:
        assert images.dtype == torch.float32 and images.shape[1:] == (3, 48, 48)
        assert labels.dtype == torch.int64 and len(labels) == len(images)
        seen += len(images)
    assert seen == len(decoded) == 16
    # Same pixels as the transform of PIL's decode, within the decoder's tolerance, and the
    # label of each image is its class directory's index (found through the pixels). The
    # region is the whole image: libjpeg-turbo decodes it DCT-scaled to no less than 48 pixels
    # a side, so the reference is PIL's decode drafted the same way.
    refs = {}
    for k, v in decoded.items():
        jpeg = (root / k).read_bytes()
        refs[k] = t(draft_reference(jpeg, min(v.shape[:2]), 48))
    for images, labels in ds:
        for img, lab in zip(images, labels):
            key = min(refs, key=lambda k: float((refs[k] - img).abs().mean()))
            assert float((refs[key] - img).abs().mean()) * 255 < 0.6
            assert label_of[key] == int(lab)


def test_jpeg_decode_against_pillow_and_torchvision(folder):
    """End to end (decode included) against PIL decode + torchvision: the transform adds no
    more than the decoder's own difference (docs/DECODE.md: zune-jpeg up to 6 levels, mean
    under 0.55; libjpeg-turbo as Pillow, 1 level). Both decode at full size here
    (``dct_scaling=False``): libjpeg-turbo's DCT-scaled decode is Pillow's ``draft``, compared
    in ringtier-decode's tests and in the ImageFolder test above."""
    root, decoded = folder
    pipe = T.Compose([T.Resize(64), T.CenterCrop(64)]).compile(dct_scaling=False)
    keys = sorted(decoded)
    items = [(root / k).read_bytes() for k in keys]
    batch = pipe.submit(items, list(range(len(items)))).wait()
    images = torch.frombuffer(batch, dtype=torch.uint8).view(batch.shape)
    tvt = v2.Compose([v2.Resize(64), v2.CenterCrop(64)])
    tol = (1, 0.35) if ringtier._ringtier.JPEG_DECODER == "libjpeg-turbo" else (7, 0.6)
    for img, k in zip(images, keys):
        ref = tvt(torch.from_numpy(decoded[k]).permute(2, 0, 1).contiguous())
        d = (img.int() - ref.int()).abs()
        assert int(d.max()) <= tol[0] and float(d.float().mean()) <= tol[1], (k, int(d.max()), float(d.float().mean()))


def test_random_epochs_are_reproducible_whatever_the_batching(folder):
    root, _ = folder
    t = T.Compose([T.RandomResizedCrop(40), T.RandomHorizontalFlip(), T.ToDtype(torch.float32, scale=True)])

    def by_key(batch_size: int, epoch: int) -> Dict[str, torch.Tensor]:
        ds = rt.IterableDataset(root, transform=t, batch_size=batch_size, seed=9, with_keys=True, shuffle=True)
        ds.set_epoch(epoch)
        out = {}
        for keys, images in ds:
            for k, img in zip(keys, images):
                out[k] = img.clone()
        return out

    a, b, c = by_key(4, 0), by_key(7, 0), by_key(4, 1)
    jpegs = {k for k in a if k.endswith(".jpg")}
    assert jpegs and set(a) == set(b)
    assert all(torch.equal(a[k], b[k]) for k in jpegs)
    assert any(not torch.equal(a[k], c[k]) for k in jpegs)


def test_batches_are_one_buffer_shared_with_torch_without_a_copy(folder):
    root, decoded = folder
    pipe = T.compile_transform(T.Compose([T.Resize((16, 16))]))
    items = [(root / k).read_bytes() for k in sorted(decoded)[:3]]
    batch = pipe.submit(items, [0, 1, 2]).wait()
    assert batch.shape == (3, 3, 16, 16) and len(batch) == 3 * 3 * 16 * 16
    t = torch.frombuffer(batch, dtype=torch.uint8).view(batch.shape)
    assert t.data_ptr() % 4096 == 0
    view = memoryview(batch)
    view[5] = (int(t.view(-1)[5]) + 1) % 256
    assert int(t.view(-1)[5]) == view[5]  # the same memory
    del view
    # A caller's buffer (as a pinned tensor's memory would be) is filled in place.
    out = torch.zeros((3, 3, 16, 16), dtype=torch.uint8)
    done = pipe.submit(items, [0, 1, 2], 0, out.numpy()).wait()
    assert done.shape == (3, 3, 16, 16) and len(done) == 0
    assert torch.equal(out, t.view(3, 3, 16, 16)) or int((out.int() - t.int()).abs().max()) <= 1


def test_pinned_memory_when_cuda_is_available(folder):
    root, _ = folder
    t = T.Compose([T.Resize((16, 16))])
    if not torch.cuda.is_available():
        with pytest.raises(ringtier.InvalidInputError, match="needs CUDA"):
            next(iter(rt.ImageFolder(root, transform=t, pin_memory=True)))
        images, _ = next(iter(rt.ImageFolder(root, transform=t)))
        assert not images.is_pinned()
        return
    images, _ = next(iter(rt.ImageFolder(root, transform=t)))
    assert images.is_pinned()
    assert torch.equal(images.cuda(non_blocking=True).cpu(), images)


def test_corrupt_images_are_skipped_or_fail_by_choice(folder):
    root, decoded = folder
    (root / "a01" / "img000.jpg").write_bytes(b"\xff\xd8\xff\xe0 truncated")
    t = T.Compose([T.Resize((16, 16))])
    n = sum(len(x) for x, _ in rt.ImageFolder(root, transform=t, batch_size=4))
    assert n == len(decoded) - 1
    with pytest.raises(ringtier.CorruptError, match="sample"):
        for _ in rt.ImageFolder(root, transform=t, batch_size=4, on_bad="fail"):
            pass


def test_webdataset_cls_fields_become_labels(tmp_path):
    shards = tmp_path / "wds"
    shards.mkdir()
    labels = {}
    for s in range(2):
        with tarfile.open(shards / f"shard-{s:02d}.tar", "w") as tar:
            for i in range(6):
                key = f"s{s}i{i}"
                buf = io.BytesIO()
                Image.fromarray(photo(60 + 10 * i, 90, s * 10 + i)).save(buf, format="JPEG")
                labels[key] = (s * 6 + i) % 5
                for name, data in ((f"{key}.jpg", buf.getvalue()), (f"{key}.cls", f"{labels[key]}\n".encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    t = T.Compose([T.RandomResizedCrop(32), T.ToDtype(torch.float32, scale=True)])
    ds = rt.RecordDataset(shards, format="wds", transform=t, batch_size=4, with_keys=True)
    got = {}
    for keys, images, labs in ds:
        assert images.shape[1:] == (3, 32, 32) and labs.dtype == torch.int64
        got.update({k: int(lab) for k, lab in zip(keys, labs)})
    assert got == labels
    with pytest.raises(ringtier.InvalidInputError, match="no label field 'label'"):
        next(iter(rt.RecordDataset(shards, format="wds", transform=t, label_field="label")))


@pytest.mark.parametrize(
    "chain, match",
    [
        (lambda: [T.Resize(64)], "cannot be batched"),
        (lambda: [T.ToDtype(torch.float32, scale=True)], "fixes the output size"),
        (lambda: [T.Resize((64, 64)), T.Normalize(MEAN, STD)], "needs a float image"),
        (lambda: [T.ToDtype(torch.float32, scale=True), T.Resize((64, 64))], "put ToDtype and Normalize last"),
        (lambda: [T.RandomResizedCrop(64), T.CenterCrop(32)], "not supported"),
        (lambda: [T.Resize((64, 32))], "square"),
        (lambda: [v2.RandomRotation(10), T.Resize((64, 64))], "RandomRotation is not a transform"),
        (lambda: [v2.Resize((64, 64), interpolation=v2.InterpolationMode.NEAREST)], "bilinear"),
        (lambda: [T.Resize((64, 64)), v2.ToDtype(torch.float16, scale=True)], "float16"),
        (lambda: [T.Resize((64, 64)), lambda x: x], "not a transform ringtier can run"),
    ],
)
def test_unsupported_chains_raise_clear_errors(chain, match):
    with pytest.raises(T.TransformError, match=match):
        T.Compose(chain())


def test_wrong_types_raise_clear_errors(folder, tmp_path):
    root, _ = folder
    with pytest.raises(TypeError, match="list of transforms"):
        T.Compose("Resize")
    with pytest.raises(TypeError, match="size must be"):
        T.Resize("224")
    with pytest.raises(TypeError, match="p must be"):
        T.RandomHorizontalFlip(p=2)
    with pytest.raises(TypeError, match="transform= takes"):
        rt.ImageFolder(root, transform="resize")
    with pytest.raises(ringtier.NotFoundError):
        rt.ImageFolder(tmp_path / "missing", transform=T.Compose([T.Resize((8, 8))]))
    with pytest.raises(ringtier.InvalidInputError, match="leave decode=None"):
        rt.IterableDataset(root, transform=T.Compose([T.Resize((8, 8))]), decode=8)
    pipe = T.compile_transform(T.Compose([T.Resize((8, 8))]))
    with pytest.raises(TypeError, match="batch item 1 is a int"):
        pipe.submit([b"\xff\xd8", 5], [0, 1])
    with pytest.raises(ringtier.InvalidInputError, match="2 items but 1 indices"):
        pipe.submit([b"a", b"b"], [0])
    with pytest.raises(ringtier.InvalidInputError, match="out= must be writable"):
        pipe.submit([b"a"], [0], 0, np.zeros(10, np.uint8))
    img = photo(40, 50, 0)
    with pytest.raises(ringtier.InvalidInputError, match="larger than the image"):
        T.Compose([T.CenterCrop(64)])(img)
    with pytest.raises(TypeError, match="uint8"):
        T.Compose([T.Resize((8, 8))])(img.astype(np.float32))
