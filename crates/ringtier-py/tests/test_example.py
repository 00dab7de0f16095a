"""examples/python/train_imagenet.py: its hand-written ResNet-18 (used where torchvision is not
installed) is torchvision's network, and the optimizer state survives the store's string keys.
CI runs the example itself end to end (.ci/run)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch


def example_path() -> Path:
    """examples/python/train_imagenet.py: from ``$RINGTIER_EXAMPLES`` (the folder) where the tests
    run from a copy outside the source tree, against an installed wheel (as CI does), else from
    the source tree they sit in."""
    folder = os.environ.get("RINGTIER_EXAMPLES")
    if folder:
        path = Path(folder) / "train_imagenet.py"
        assert path.is_file(), f"RINGTIER_EXAMPLES={folder} has no train_imagenet.py"
        return path
    here = Path(__file__).resolve()
    path = here.parents[3] / "examples" / "python" / "train_imagenet.py" if len(here.parents) > 3 else None
    if path is None or not path.is_file():
        pytest.skip("examples/python is not beside these tests: set RINGTIER_EXAMPLES")
    return path


def load_example():
    spec = importlib.util.spec_from_file_location("train_imagenet", example_path())
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_hand_written_resnet18_is_resnet18():
    ex = load_example()
    model = ex.ResNet18(1000)
    assert sum(p.numel() for p in model.parameters()) == 11_689_512  # torchvision's resnet18
    out = model(torch.randn(2, 3, 64, 64))
    assert out.shape == (2, 1000)


def test_torchvision_counts_the_same_where_installed():
    models = pytest.importorskip("torchvision.models")
    ex = load_example()
    assert sum(p.numel() for p in models.resnet18(num_classes=10).parameters()) == sum(
        p.numel() for p in ex.ResNet18(10).parameters()
    )


def test_optimizer_state_round_trips_through_the_checkpoint_store(tmp_path):
    import ringtier

    ex = load_example()
    model = ex.ResNet18(4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    opt.step()
    tiers = [str(tmp_path / "fast"), str(tmp_path / "slow")]
    store = ringtier.CheckpointStore(tiers, create=True)
    store.save(1, {"optimizer": ex.optimizer_state(opt)})
    state = store.load()
    store.close()
    opt2 = torch.optim.SGD(ex.ResNet18(4).parameters(), lr=0.1, momentum=0.9)
    ex.load_optimizer_state(opt2, state["optimizer"])
    a, b = opt.state_dict(), opt2.state_dict()
    assert a["state"].keys() == b["state"].keys()
    for k in a["state"]:
        assert torch.equal(a["state"][k]["momentum_buffer"], b["state"][k]["momentum_buffer"])
