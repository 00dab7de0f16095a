"""``ringtier.transforms``: torchvision's image transforms, run in Rust threads on whole batches.

The classes take torchvision's parameter names and follow the semantics of
``torchvision.transforms.v2`` on ``uint8`` images::

    import torch
    from ringtier import transforms as T

    transform = T.Compose([
        T.RandomResizedCrop(224),
        T.RandomHorizontalFlip(),
        T.ToDtype(torch.float32, scale=True),
        T.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
    ])
    ds = ringtier.torch.ImageFolder("/data/imagenet/train", transform=transform)

A :class:`Compose` is compiled (:meth:`Compose.compile`) into one
:class:`ringtier.TransformPipeline`: JPEG decode, crop, resize, flip, CHW layout, dtype and
normalization in one pass per image, on a pool of threads, into one buffer per batch that torch
shares without a copy. The random crop and flip of a sample depend only on (seed, epoch,
dataset index), so an epoch is reproducible whatever the batch order, workers or ranks.

What compiles (anything else raises :class:`TransformError` naming the transform):

* geometry, on the ``uint8`` image: ``RandomResizedCrop(s)``; ``Resize(r)`` then
  ``CenterCrop(s)``; ``CenterCrop(s)`` alone; ``Resize((s, s))``; outputs are square (a batch
  has one shape), resizing is bilinear with antialiasing (torchvision's default);
* ``RandomHorizontalFlip(p)`` anywhere in the chain;
* last, the type: ``ToDtype(torch.float32, scale=True|False)``, then any ``Normalize``
  (``Normalize`` needs a float image, as in torchvision); ``ToDtype(torch.uint8)`` on a
  ``uint8`` image is a no-op; the output is ``uint8`` unless a ``ToDtype(float32)`` is there;
* ``ToImage``, ``PILToTensor`` (no-ops: images are already tensors here) and ``ToTensor``
  (``ToDtype(float32, scale=True)``).

torchvision transform objects (``torchvision.transforms`` or ``.v2``) of these kinds are
accepted in a :class:`Compose` too and converted (:func:`from_torchvision`).
"""

from __future__ import annotations

import math
import numbers
from typing import Any, List, Optional, Sequence, Tuple, Union

from ._ringtier import TransformPipeline
from .errors import InvalidInputError

_BILINEAR_NAMES = ("bilinear",)


class TransformError(InvalidInputError, TypeError):
    """A transform, or a chain of them, that ringtier cannot run (or a wrong argument type)."""


def _size(size: Any, what: str) -> Tuple[int, int]:
    """torchvision's size argument: an int, or a sequence of one or two ints, as (h, w)."""
    if isinstance(size, bool) or not isinstance(size, (numbers.Integral, Sequence)):
        raise TransformError(f"{what}: size must be an int or a sequence of one or two ints, not {size!r}")
    if isinstance(size, numbers.Integral):
        h = w = int(size)
    else:
        if len(size) not in (1, 2) or not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in size):
            raise TransformError(f"{what}: size must be an int or a sequence of one or two ints, not {size!r}")
        h, w = (int(size[0]), int(size[0])) if len(size) == 1 else (int(size[0]), int(size[1]))
    if h <= 0 or w <= 0:
        raise TransformError(f"{what}: size must be positive, got {size!r}")
    return h, w


def _check_bilinear(interpolation: Any, antialias: Any, what: str) -> None:
    name = getattr(interpolation, "value", interpolation)
    if not (name in _BILINEAR_NAMES or name == 2):  # 2: PIL's BILINEAR code, which torchvision accepts
        raise TransformError(f"{what}: only bilinear interpolation runs in ringtier, not {interpolation!r}")
    if antialias is False:
        raise TransformError(f"{what}: antialias=False is not supported (ringtier's resize is antialiased)")


def _pair(v: Any, what: str) -> Tuple[float, float]:
    try:
        a, b = (float(x) for x in v)
    except (TypeError, ValueError):
        raise TransformError(f"{what} must be a sequence of two numbers, not {v!r}") from None
    return a, b


class Transform:
    """The base of ringtier's transforms (torchvision's names and parameters)."""

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"


class RandomResizedCrop(Transform):
    """torchvision ``RandomResizedCrop``: a random region of ``scale`` of the area and aspect
    ratio (w/h) in ``ratio``, resized to ``size``."""

    def __init__(
        self,
        size: Union[int, Sequence[int]],
        scale: Tuple[float, float] = (0.08, 1.0),
        ratio: Tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0),
        interpolation: Any = "bilinear",
        antialias: Optional[bool] = True,
    ) -> None:
        self.size = _size(size, "RandomResizedCrop")
        self.scale = _pair(scale, "RandomResizedCrop scale")
        self.ratio = _pair(ratio, "RandomResizedCrop ratio")
        if not (0 < self.scale[0] <= self.scale[1] <= 1):
            raise TransformError(f"RandomResizedCrop: scale must satisfy 0 < min <= max <= 1, got {scale!r}")
        if not (0 < self.ratio[0] <= self.ratio[1]):
            raise TransformError(f"RandomResizedCrop: ratio must satisfy 0 < min <= max, got {ratio!r}")
        _check_bilinear(interpolation, antialias, "RandomResizedCrop")
        self.interpolation, self.antialias = interpolation, antialias


class CenterCrop(Transform):
    """torchvision ``CenterCrop``: the central ``size`` pixels (an image smaller than the crop
    is an error here; torchvision pads it with zeros)."""

    def __init__(self, size: Union[int, Sequence[int]]) -> None:
        self.size = _size(size, "CenterCrop")


class Resize(Transform):
    """torchvision ``Resize``: an int resizes the shorter side to ``size`` (aspect kept), a
    pair ``(h, w)`` resizes to exactly that."""

    def __init__(
        self,
        size: Union[int, Sequence[int]],
        interpolation: Any = "bilinear",
        max_size: Optional[int] = None,
        antialias: Optional[bool] = True,
    ) -> None:
        if max_size is not None:
            raise TransformError("Resize: max_size is not supported")
        self.exact = not isinstance(size, numbers.Integral) and len(size) == 2
        self.size = _size(size, "Resize")
        _check_bilinear(interpolation, antialias, "Resize")
        self.interpolation, self.antialias = interpolation, antialias


class RandomHorizontalFlip(Transform):
    """torchvision ``RandomHorizontalFlip``: a left-right flip with probability ``p``."""

    def __init__(self, p: float = 0.5) -> None:
        if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0.0 <= float(p) <= 1.0:
            raise TransformError(f"RandomHorizontalFlip: p must be a number in [0, 1], not {p!r}")
        self.p = float(p)


class Normalize(Transform):
    """torchvision ``Normalize``: ``(x - mean) / std`` per channel, on a float image."""

    def __init__(self, mean: Sequence[float], std: Sequence[float], inplace: bool = False) -> None:
        def three(v: Any, name: str) -> List[float]:
            try:
                vals = [float(x) for x in v]
            except (TypeError, ValueError):
                raise TransformError(f"Normalize: {name} must be a sequence of numbers, not {v!r}") from None
            if len(vals) == 1:
                vals = vals * 3
            if len(vals) != 3 or not all(math.isfinite(x) for x in vals):
                raise TransformError(f"Normalize: {name} needs 1 or 3 finite values (RGB), got {v!r}")
            return vals

        self.mean, self.std = three(mean, "mean"), three(std, "std")
        if any(s <= 0 for s in self.std):
            raise TransformError(f"Normalize: std must be positive, got {std!r}")
        self.inplace = inplace


def _dtype_name(dtype: Any) -> str:
    name = str(dtype).replace("torch.", "")
    if name not in ("uint8", "float32", "float"):
        raise TransformError(f"ToDtype: ringtier outputs torch.uint8 or torch.float32, not {dtype!r}")
    return "float32" if name == "float" else name


class ToDtype(Transform):
    """torchvision v2 ``ToDtype``: ``torch.float32`` (``scale=True`` maps 0..255 to 0..1) or
    ``torch.uint8``."""

    def __init__(self, dtype: Any, scale: bool = False) -> None:
        if isinstance(dtype, dict):
            raise TransformError("ToDtype: a dict of dtypes per input type is not supported; give one dtype")
        self.dtype = _dtype_name(dtype)
        self.scale = bool(scale)


class ToImage(Transform):
    """torchvision v2 ``ToImage``: a no-op here (images are decoded to tensors)."""


class PILToTensor(Transform):
    """torchvision ``PILToTensor``: a no-op here."""


class ToTensor(Transform):
    """torchvision ``ToTensor``: ``ToDtype(torch.float32, scale=True)`` here."""


class Compose(Transform):
    """torchvision ``Compose``: the transforms in order, compiled into one Rust pipeline."""

    def __init__(self, transforms: Sequence[Any]) -> None:
        if isinstance(transforms, (str, bytes)) or not isinstance(transforms, Sequence):
            raise TransformError(f"Compose takes a list of transforms, not {type(transforms).__name__}")
        self.transforms = [t if isinstance(t, Transform) else from_torchvision(t) for t in transforms]
        self.plan = _plan(self.transforms)

    def compile(self, seed: int = 0, threads: Optional[int] = None, dct_scaling: bool = True) -> TransformPipeline:
        """The Rust pipeline of this chain; random draws from ``seed`` (with epoch and index)."""
        return TransformPipeline(seed=seed, threads=threads, dct_scaling=dct_scaling, **self.plan)

    @property
    def size(self) -> int:
        """The output side in pixels."""
        return int(self.plan["size"])

    @property
    def dtype(self) -> str:
        """``"uint8"`` or ``"float32"``."""
        return str(self.plan["dtype"])

    def __call__(self, image: Any, *, index: int = 0, epoch: int = 0, seed: int = 0) -> Any:
        """Transforms one image already decoded: a ``(H, W, 3)`` uint8 numpy array, a
        ``(3, H, W)`` uint8 tensor (torchvision's layout), or a PIL image. Returns a
        ``(3, S, S)`` tensor. The random draws are those of sample ``index`` of ``epoch``."""
        import numpy as np
        import torch

        if isinstance(image, torch.Tensor):
            if image.dtype != torch.uint8 or image.dim() != 3 or image.shape[0] != 3:
                raise TransformError(f"expected a (3, H, W) uint8 tensor, got {tuple(image.shape)} {image.dtype}")
            hwc = image.permute(1, 2, 0).contiguous().numpy()
        elif isinstance(image, np.ndarray):
            if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
                raise TransformError(f"expected an (H, W, 3) uint8 array, got {image.shape} {image.dtype}")
            hwc = np.ascontiguousarray(image)
        elif hasattr(image, "convert") and hasattr(image, "size"):  # a PIL image
            hwc = np.asarray(image.convert("RGB"))
        else:
            raise TransformError(f"expected a uint8 tensor, numpy array or PIL image, not {type(image).__name__}")
        h, w = int(hwc.shape[0]), int(hwc.shape[1])
        pipe = self._pipeline(seed)
        out = pipe.apply_rgb(hwc, h, w, index=index, epoch=epoch)
        dtype = torch.float32 if out.dtype == "float32" else torch.uint8
        return torch.frombuffer(out, dtype=dtype).view(out.shape[1:])

    def _pipeline(self, seed: int) -> TransformPipeline:
        cached = getattr(self, "_one", None)
        import os

        if cached is None or cached[0] != (seed, os.getpid()):
            cached = ((seed, os.getpid()), self.compile(seed=seed, threads=1))
            self._one = cached
        return cached[1]

    def __getstate__(self) -> Any:
        state = dict(vars(self))
        state.pop("_one", None)  # threads stay in the process that made them
        return state

    def __repr__(self) -> str:
        inner = "".join(f"\n    {t!r}," for t in self.transforms)
        return f"Compose([{inner}\n])"


def _plan(transforms: Sequence[Transform]) -> dict:  # type: ignore[type-arg]
    """The TransformPipeline arguments of a chain, or a TransformError saying what is wrong."""
    geometry: List[Transform] = []
    flip: Optional[float] = None
    dtype = "uint8"
    # The value after the dtype ops is x * a + b per channel (x the uint8 level).
    a, b = [1.0] * 3, [0.0] * 3
    typed = False  # a ToDtype/Normalize seen: geometry after it would run on floats
    for t in transforms:
        if isinstance(t, Compose):
            raise TransformError("a Compose inside a Compose: list the transforms in one Compose")
        if isinstance(t, (ToImage, PILToTensor)):
            continue
        if isinstance(t, RandomHorizontalFlip):
            if flip is not None:
                raise TransformError("two RandomHorizontalFlip in one chain are not supported")
            flip = t.p
        elif isinstance(t, (RandomResizedCrop, CenterCrop, Resize)):
            if typed:
                raise TransformError(
                    f"{type(t).__name__} after ToDtype/Normalize: ringtier crops and resizes the uint8 image; "
                    "put ToDtype and Normalize last"
                )
            geometry.append(t)
        elif isinstance(t, (ToDtype, ToTensor)):
            typed = True
            target, scale = ("float32", True) if isinstance(t, ToTensor) else (t.dtype, t.scale)
            if target == "uint8":
                if dtype != "uint8":
                    raise TransformError("ToDtype(torch.uint8) after a float conversion is not supported")
                continue
            if dtype == "uint8":
                dtype = "float32"
                if scale:
                    a = [v / 255.0 for v in a]
                    b = [v / 255.0 for v in b]
        elif isinstance(t, Normalize):
            typed = True
            if dtype != "float32":
                raise TransformError(
                    "Normalize needs a float image (as in torchvision): put ToDtype(torch.float32, scale=True) first"
                )
            a = [ai / s for ai, s in zip(a, t.std)]
            b = [(bi - m) / s for bi, m, s in zip(b, t.mean, t.std)]
        else:
            raise TransformError(f"{type(t).__name__} is not a transform ringtier can run (see ringtier.transforms)")
    plan: dict = {"flip": flip, "dtype": dtype}  # type: ignore[type-arg]
    kinds = [type(g).__name__ for g in geometry]

    def square(hw: Tuple[int, int], what: str) -> int:
        if hw[0] != hw[1]:
            raise TransformError(f"{what} of {hw[0]}x{hw[1]}: ringtier's outputs are square (one shape per batch)")
        return hw[0]

    if kinds == ["RandomResizedCrop"]:
        g = geometry[0]
        assert isinstance(g, RandomResizedCrop)
        plan.update(size=square(g.size, "RandomResizedCrop"), crop="random_resized", scale=g.scale, ratio=g.ratio)
    elif kinds == ["Resize", "CenterCrop"] and not getattr(geometry[0], "exact"):
        r, c = geometry[0], geometry[1]
        size = square(c.size, "CenterCrop")  # type: ignore[attr-defined]
        resize = r.size[0]  # type: ignore[attr-defined]
        if resize < size:
            raise TransformError(f"Resize({resize}) then CenterCrop({size}): the crop is larger than the image")
        plan.update(size=size, crop="center", resize=resize)
    elif kinds == ["CenterCrop"]:
        plan.update(size=square(geometry[0].size, "CenterCrop"), crop="center_crop")  # type: ignore[attr-defined]
    elif kinds == ["Resize"] and getattr(geometry[0], "exact"):
        plan.update(size=square(geometry[0].size, "Resize"), crop="resize")  # type: ignore[attr-defined]
    elif kinds == ["Resize"]:
        raise TransformError(
            "Resize(int) alone keeps the aspect ratio, so images differ in shape and cannot be batched: add "
            "CenterCrop(size) after it, or give Resize((size, size))"
        )
    elif not kinds:
        raise TransformError(
            "the chain has no transform that fixes the output size: add RandomResizedCrop, Resize or CenterCrop"
        )
    else:
        raise TransformError(
            f"the geometry {' then '.join(kinds)} is not supported; ringtier runs RandomResizedCrop, Resize(r) then "
            "CenterCrop(s), CenterCrop(s), or Resize((s, s))"
        )
    if dtype == "float32":
        # x * a + b == (x / 255 - mean) / std with std = 1 / (255 a), mean = -b / (255 a).
        plan["std"] = [1.0 / (255.0 * ai) for ai in a]
        plan["mean"] = [-bi / (255.0 * ai) for ai, bi in zip(a, b)]
    return plan


def from_torchvision(t: Any) -> Transform:
    """The ringtier transform of a torchvision one (``torchvision.transforms`` or ``.v2``), or a
    :class:`TransformError` for one ringtier cannot run."""
    name = type(t).__name__
    mod = type(t).__module__ or ""
    if not mod.startswith("torchvision"):
        raise TransformError(
            f"{name} ({mod}) is not a transform ringtier can run: use ringtier.transforms or torchvision's "
            "RandomResizedCrop, Resize, CenterCrop, RandomHorizontalFlip, ToDtype, Normalize"
        )
    if name == "Compose":
        raise TransformError("a Compose inside a Compose: list the transforms in one Compose")
    if name == "RandomResizedCrop":
        return RandomResizedCrop(list(t.size), t.scale, t.ratio, t.interpolation, getattr(t, "antialias", True))
    if name == "Resize":
        size = t.size if isinstance(t.size, int) else list(t.size)
        if isinstance(size, list) and len(size) == 1:
            size = size[0]
        return Resize(size, t.interpolation, getattr(t, "max_size", None), getattr(t, "antialias", True))
    if name == "CenterCrop":
        return CenterCrop(list(t.size))
    if name == "RandomHorizontalFlip":
        return RandomHorizontalFlip(t.p)
    if name == "Normalize":
        if getattr(t, "inplace", False) not in (False, True):
            raise TransformError("Normalize: inplace must be a bool")
        return Normalize(list(t.mean), list(t.std))
    if name == "ToDtype":
        return ToDtype(t.dtype, getattr(t, "scale", False))
    if name == "ConvertImageDtype":
        return ToDtype(t.dtype, scale=True)
    if name in ("ToImage", "ToImageTensor"):
        return ToImage()
    if name == "PILToTensor":
        return PILToTensor()
    if name == "ToTensor":
        return ToTensor()
    raise TransformError(f"torchvision {name} is not a transform ringtier can run (see ringtier.transforms)")


def compile_transform(transform: Any, seed: int = 0, threads: Optional[int] = None) -> TransformPipeline:
    """The pipeline of ``transform``: a :class:`Compose`, one ringtier transform, a torchvision
    transform or Compose, or a ready :class:`TransformPipeline`."""
    if isinstance(transform, TransformPipeline):
        return transform
    if not isinstance(transform, Compose):
        if type(transform).__name__ == "Compose" and hasattr(transform, "transforms"):
            transform = Compose(list(transform.transforms))
        elif isinstance(transform, Transform) or (type(transform).__module__ or "").startswith("torchvision"):
            transform = Compose([transform])
        else:
            raise TransformError(
                f"transform= takes a ringtier.transforms.Compose (or torchvision transforms), not "
                f"{type(transform).__name__}"
            )
    return transform.compile(seed=seed, threads=threads)


__all__ = [
    "CenterCrop",
    "Compose",
    "Normalize",
    "PILToTensor",
    "RandomHorizontalFlip",
    "RandomResizedCrop",
    "Resize",
    "ToDtype",
    "ToImage",
    "ToTensor",
    "Transform",
    "TransformError",
    "compile_transform",
    "from_torchvision",
]
