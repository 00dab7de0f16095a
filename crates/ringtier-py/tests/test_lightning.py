"""ringtier.torch.lightning: Lightning's Trainer checkpoints through RingtierCheckpointIO
(CPU): top-k pruning deletes from every tier, last.ckpt saved again is its next step, a fit
resumes from it, nothing is written under the checkpoint directory itself."""

from __future__ import annotations

import os
import warnings

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("lightning.pytorch")

from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402

from ringtier.torch.lightning import RingtierCheckpointIO  # noqa: E402


class Regression(pl.LightningModule):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(width, 1)

    def training_step(self, batch, _i):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01)


def data():
    g = torch.Generator().manual_seed(0)
    ds = torch.utils.data.TensorDataset(torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g))
    return torch.utils.data.DataLoader(ds, batch_size=16)


def trainer(tiers, epochs, **kw):
    return pl.Trainer(
        max_epochs=epochs, plugins=[RingtierCheckpointIO(tiers)], logger=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu", **kw,
    )


def test_trainer_saves_prunes_and_resumes(tmp_path):
    warnings.filterwarnings("ignore")
    tiers = [tmp_path / "fast", tmp_path / "slow"]
    ckpts = tmp_path / "ckpts"
    ck = ModelCheckpoint(dirpath=ckpts, save_last=True, save_top_k=1, monitor="step", mode="max")
    model = Regression()
    trainer(tiers, 2, callbacks=[ck]).fit(model, data())
    assert ck.last_model_path.endswith("last.ckpt") and "step=8" in ck.best_model_path
    assert not ckpts.exists(), "the checkpoints are in the stores, not files"

    io = RingtierCheckpointIO(tiers)
    assert io.exists(ck.last_model_path) and io.exists(ck.best_model_path)
    assert not io.exists(str(ckpts / "epoch=0-step=4.ckpt")), "top-k pruned the first epoch's"
    for tier in tiers:
        names = {p.name.rsplit("-", 1)[0] for p in (tier / "lightning").iterdir() if any(f.is_file() for f in p.rglob("*"))}
        assert names == {"last", "epoch_1-step_8"}, (tier, names)
    saved = io.load_checkpoint(ck.last_model_path)
    assert saved["global_step"] == 8 and saved["hyper_parameters"]["width"] == 8
    assert torch.equal(saved["state_dict"]["layer.weight"], model.layer.weight.detach())
    assert len(saved["optimizer_states"][0]["state"]) == 2  # Adam's state, keyed by int
    with pytest.raises(FileNotFoundError):
        io.load_checkpoint(str(ckpts / "never.ckpt"))
    io.teardown()

    resumed = trainer(tiers, 3, enable_checkpointing=False)
    resumed.fit(Regression(), data(), ckpt_path=ck.last_model_path)
    assert resumed.global_step == 12  # 8 restored + one more epoch of 4


def test_tiers_must_be_a_list(tmp_path):
    with pytest.raises(TypeError):
        RingtierCheckpointIO(str(tmp_path))
    with pytest.raises(TypeError, match="storage_options"):
        RingtierCheckpointIO([tmp_path]).save_checkpoint({}, tmp_path / "x.ckpt", storage_options={"a": 1})
