"""DataLoader workers that do not cost (issue 37): a transformed batch is decoded in a worker
straight into shared memory the worker reuses and reaches the main process as a plain tensor
without a copy; a slot is reused only once no view of its batch is left (batches held by the
training loop stay intact), and so is a record batch the record loader packs into a slot
itself; each worker's engine fits its share of the cores."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, List

import pytest
import torch
from torch.utils.data import DataLoader

import ringtier
import ringtier.torch as rt
from ringtier import transforms as T
from ringtier.torch import _packed
from ringtier.torch import images as images_mod
from ringtier.torch._packed import SLOTS_PER_WORKER
from test_transforms import write_jpegs

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def chain() -> T.Compose:
    return T.Compose(
        [T.RandomResizedCrop(32), T.RandomHorizontalFlip(), T.ToDtype(torch.float32, scale=True), T.Normalize(MEAN, STD)]
    )


def test_transformed_batches_from_workers_are_the_same_tensors_and_stay_intact_while_held(tmp_path: Path):
    write_jpegs(tmp_path / "img", {"a": 40, "b": 40})
    ds = rt.IterableDataset(tmp_path / "img", transform=chain(), batch_size=4, with_keys=True, seed=3, pin_memory=False)
    want: Dict[str, torch.Tensor] = {}
    for keys, images in DataLoader(ds, batch_size=None, num_workers=0):
        want.update({k: images[i].clone() for i, k in enumerate(keys)})
    # Every batch held until the end: more batches than a worker has slots, so the later ones
    # cannot reuse a slot a held batch is in (they fall back to fresh memory).
    held: List[torch.Tensor] = []
    got: Dict[str, torch.Tensor] = {}
    for keys, images in DataLoader(ds, batch_size=None, num_workers=2):
        assert type(images) is torch.Tensor and images.dtype == torch.float32 and images.shape[1:] == (3, 32, 32)
        held.append(images)
        got.update({k: images[i] for i, k in enumerate(keys)})
    assert len(held) > 2 * SLOTS_PER_WORKER
    assert got.keys() == want.keys()
    for k in want:
        assert torch.equal(got[k], want[k]), k
    # Batches dropped as they come: the slots are reused, and the images are right every time.
    for epoch in (0, 0):
        ds.set_epoch(epoch)
        n = 0
        for keys, images in DataLoader(ds, batch_size=None, num_workers=2):
            for i, k in enumerate(keys):
                assert torch.equal(images[i], want[k]), k
            n += len(keys)
        assert n == 80


def test_image_folder_batches_from_workers_match_no_workers(tmp_path: Path):
    write_jpegs(tmp_path / "img", {"a": 30, "b": 30})
    ds = rt.ImageFolder(tmp_path / "img", chain(), batch_size=8, seed=5, pin_memory=False, shuffle=False)
    ref = sorted((int(l), im.sum().item()) for images, labels in ds for im, l in zip(images, labels))
    out = []
    for images, labels in DataLoader(ds, batch_size=None, num_workers=2):
        assert type(images) is torch.Tensor
        out += [(int(l), im.sum().item()) for im, l in zip(images, labels)]
    assert sorted(out) == ref


def test_image_folder_slots_are_made_before_fork_and_reused_across_epochs(tmp_path: Path):
    """ImageFolder's decoding worker writes its batches into slots the main process made before
    forking: they cross as a slot index (no descriptor), the next epoch's worker reuses them,
    batches held past a slot's turn stay intact (the worker falls back to fresh memory), and
    two DataLoaders over one dataset at once never write into one slot."""
    write_jpegs(tmp_path / "img", {"a": 36, "b": 36})
    script = textwrap.dedent(
        f"""
        import torch
        from torch.utils.data import DataLoader
        import ringtier.torch as rt
        import ringtier.torch._packed as P
        from ringtier import transforms as T

        chain = T.Compose([T.RandomResizedCrop(32), T.ToDtype(torch.float32, scale=True)])
        ds = rt.ImageFolder({str(tmp_path / "img")!r}, chain, batch_size=4, seed=5, pin_memory=False, shuffle=False,
                            active_workers=1)
        assert ds._ring.token in P._PREMADE
        count = {{"premade": 0}}
        real = P._rebuild_premade
        def counted(*a):
            count["premade"] += 1
            return real(*a)
        P._rebuild_premade = counted
        ref = sorted((int(l), round(im.sum().item(), 3)) for images, labels in ds for im, l in zip(images, labels))

        def epoch(**kw):
            out = []
            for images, labels in DataLoader(ds, batch_size=None, num_workers=2, **kw):
                assert type(images) is torch.Tensor and type(labels) is torch.Tensor and labels.dtype == torch.int64
                out += [(int(l), round(im.sum().item(), 3)) for im, l in zip(images, labels)]
            return sorted(out)

        for e in range(2):  # the second epoch's worker finds the slots made and free
            before = count["premade"]
            assert epoch() == ref, e
            assert count["premade"] - before == 18, (e, count)
        # Held: every batch of the epoch kept, more than a worker's slots.
        held = [(images, labels) for images, labels in DataLoader(ds, batch_size=None, num_workers=2)]
        assert len(held) == 18 > P.SLOTS_PER_WORKER
        assert sorted((int(l), round(im.sum().item(), 3)) for images, labels in held for im, l in zip(images, labels)) == ref
        del held
        # Two DataLoaders at once, each with its worker 0 on the same slots.
        a, b = [], []
        for (ia, la), (ib, lb) in zip(DataLoader(ds, batch_size=None, num_workers=1),
                                      DataLoader(ds, batch_size=None, num_workers=1)):
            a += [(int(l), round(im.sum().item(), 3)) for im, l in zip(ia, la)]
            b += [(int(l), round(im.sum().item(), 3)) for im, l in zip(ib, lb)]
        assert sorted(a) == ref and sorted(b) == ref
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok", out.stdout


def test_premade_slots_go_with_their_dataset_and_batches_keep_their_memory():
    import gc

    from ringtier.torch import _packed as P

    ring = P.SlotRing()
    ring.premake(1 << 20, 2)
    token = ring.token
    slot, index = ring.take(1, 4096)
    assert index == P.SLOTS_PER_WORKER and token in P._PREMADE
    slot[:4] = torch.tensor([1, 2, 3, 4], dtype=torch.uint8)
    view = P._rebuild_premade(token, index, 4, "uint8", (4,))
    del ring, slot
    gc.collect()
    assert token not in P._PREMADE  # the ring's segment is no longer the module's
    assert view.tolist() == [1, 2, 3, 4]  # the batch still views its memory


def test_without_memfd_workers_make_their_own_slots(monkeypatch):
    """Where memfd_create is refused (a seccomp filter), premake makes nothing and a worker's
    slots are its own segments, as before."""
    import errno

    from ringtier.torch import _packed as P

    def refused(*args, **kwargs):
        raise OSError(errno.EPERM, "memfd_create refused")

    monkeypatch.setattr(os, "memfd_create", refused)
    ring = P.SlotRing()
    ring.premake(1 << 20, 1)
    assert ring._premade is None and ring.token not in P._PREMADE
    slot, index = ring.take(0, 4096)
    assert index == 0 and slot.numel() >= 4096
    assert P._premade_slot(ring.token, index, 4096) is None  # crosses the torch way


def test_inline_tensors_cross_as_their_bytes():
    import pickle

    from ringtier.torch._packed import InlineTensor

    for t in (torch.arange(7, dtype=torch.int64), torch.zeros((2, 3), dtype=torch.float32) + 1.5,
              torch.empty(0, dtype=torch.int64), torch.arange(12, dtype=torch.int32).view(3, 4).t()):
        got = pickle.loads(pickle.dumps(InlineTensor(t)))
        assert type(got) is torch.Tensor and got.dtype == t.dtype and got.shape == t.shape and torch.equal(got, t)
        got += 1  # writable, its own memory
        assert not torch.equal(got, t) or t.numel() == 0


def test_image_folder_decodes_on_one_worker_per_64_cores_every_sample_once(tmp_path: Path, monkeypatch):
    """Several DataLoader workers: one per 64 cores of the rank decodes (the others yield
    nothing, one warning says so), every sample still once; active_workers= sets how many; no
    transform: every worker reads."""
    write_jpegs(tmp_path / "img", {"a": 21, "b": 20})
    cores = _packed.rank_cores()
    ds = rt.ImageFolder(tmp_path / "img", chain(), batch_size=4, seed=5, pin_memory=False, shuffle=False)
    ref = sorted((int(l), round(im.sum().item(), 3)) for images, labels in ds for im, l in zip(images, labels))
    workers = cores + 2
    assert images_mod.CORES_PER_DECODING_WORKER == 64
    assert ds.decoding_workers(workers) == min(workers, -(-cores // 64)) and ds.decoding_workers(1) == 1
    for rank_cores, n, want in ((2, 8, 1), (64, 8, 1), (65, 8, 2), (256, 8, 4), (256, 2, 2), (1000, 8, 8)):
        monkeypatch.setattr(images_mod, "rank_cores", lambda c=rank_cores: c)
        assert ds.decoding_workers(n) == want, (rank_cores, n)
    monkeypatch.undo()
    out = [
        (int(l), round(im.sum().item(), 3))
        for images, labels in DataLoader(ds, batch_size=None, num_workers=workers)
        for im, l in zip(images, labels)
    ]
    assert sorted(out) == ref  # every sample once, the same pixels (the warning: next test)
    two = rt.ImageFolder(tmp_path / "img", chain(), batch_size=4, seed=5, pin_memory=False, shuffle=False,
                         active_workers=workers)
    assert two.decoding_workers(workers) == workers
    out = [(int(l), round(im.sum().item(), 3)) for images, labels in DataLoader(two, batch_size=None, num_workers=workers)
           for im, l in zip(images, labels)]
    assert sorted(out) == ref
    raw = rt.ImageFolder(tmp_path / "img", None, batch_size=4)
    assert raw.decoding_workers(workers) == workers
    for bad in (0, -1, 2.5, True, "2"):
        try:
            rt.ImageFolder(tmp_path / "img", chain(), active_workers=bad)
        except Exception as e:  # InvalidInputError
            assert "active_workers" in str(e)
        else:
            raise AssertionError(f"active_workers={bad!r} accepted")


def test_file_and_record_transforms_decode_on_one_worker_every_sample_once(tmp_path: Path):
    """IterableDataset(transform=) and RecordDataset(transform=) under more workers than decode:
    one worker per 64 cores decodes, the rest stay idle (one warning per dataset), every sample
    once with the pixels of 0 workers; active_workers= makes them all decode."""
    import io
    import tarfile

    write_jpegs(tmp_path / "img", {"a": 14, "b": 13})
    shards = tmp_path / "wds"
    shards.mkdir()
    files = sorted(p for p in (tmp_path / "img").rglob("*.jpg"))
    for s in range(3):
        with tarfile.open(shards / f"shard-{s}.tar", "w") as tar:
            for i, f in enumerate(files[s::3]):
                key = f"{f.parent.name}-{f.stem}"
                for name, data in ((f"{key}.jpg", f.read_bytes()), (f"{key}.cls", f"{i % 4}\n".encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    script = textwrap.dedent(
        f"""
        import sys, torch
        from torch.utils.data import DataLoader
        import ringtier.torch as rt
        from ringtier import transforms as T
        from ringtier.torch._packed import rank_cores

        chain = T.Compose([T.RandomResizedCrop(24), T.ToDtype(torch.float32, scale=True)])
        workers = rank_cores() + 2
        def files(**kw):
            return rt.IterableDataset({str(tmp_path / "img")!r}, transform=chain, batch_size=4, with_keys=True,
                                      seed=2, pin_memory=False, **kw)
        def records(**kw):
            return rt.RecordDataset({str(shards)!r}, format="wds", transform=chain, batch_size=4, with_keys=True,
                                    seed=2, pin_memory=False, **kw)
        def items(ds, n):
            out = []
            for b in DataLoader(ds, batch_size=None, num_workers=n):
                keys, images = b[0], b[1]
                out += [(k, round(im.sum().item(), 3)) for k, im in zip(keys, images)]
            return sorted(out)
        for make in (files, records):
            ref = items(make(), 0)
            assert len(ref) == 27 and len(set(k for k, _ in ref)) == 27, ref
            assert items(make(), workers) == ref, make.__name__
            assert items(make(active_workers=workers), workers) == ref, make.__name__
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
    assert out.stderr.count("ringtier.torch.IterableDataset:") == 1, out.stderr
    assert out.stderr.count("ringtier.torch.RecordDataset:") == 1, out.stderr
    assert out.stderr.count("stay idle") == 2, out.stderr
    for bad in (0, -1, 2.5, True, "2"):
        with pytest.raises(ringtier.InvalidInputError, match="active_workers"):
            rt.IterableDataset(tmp_path / "img", transform=chain(), batch_size=4, active_workers=bad)
        with pytest.raises(ringtier.InvalidInputError, match="active_workers"):
            rt.RecordDataset(shards, format="wds", transform=chain(), batch_size=4, active_workers=bad)


def test_datasets_used_in_this_process_go_to_spawned_workers(tmp_path: Path):
    """A dataset iterated in the main process first (its loader made) still pickles for a
    DataLoader whose workers are spawned (multiprocessing_context="spawn"): each process makes
    its own loader, and the batches are those of the main process."""
    write_jpegs(tmp_path / "img", {"a": 6, "b": 6})
    script = textwrap.dedent(
        f"""
        import torch
        from torch.utils.data import DataLoader
        import ringtier.torch as rt
        from ringtier import transforms as T

        if __name__ == "__main__":
            chain = T.Compose([T.RandomResizedCrop(16), T.ToDtype(torch.float32, scale=True)])
            images = rt.ImageFolder({str(tmp_path / "img")!r}, chain, batch_size=4, seed=1, shuffle=False,
                                    pin_memory=False)
            raw = rt.IterableDataset({str(tmp_path / "img")!r}, batch_size=4, shuffle=False, with_keys=True)
            def pairs(loader):
                return sorted((int(l), round(im.sum().item(), 3)) for x, y in loader for im, l in zip(x, y))
            def keys(loader):
                return sorted(k for b in loader for k, _ in b)
            ref, ref_keys = pairs(images), keys(raw)
            assert len(ref) == 12 and len(ref_keys) == 12
            assert pairs(DataLoader(images, batch_size=None, num_workers=1, multiprocessing_context="spawn")) == ref
            assert keys(DataLoader(raw, batch_size=None, num_workers=1, multiprocessing_context="spawn")) == ref_keys
            print("ok")
        """
    )
    path = tmp_path / "spawned.py"
    path.write_text(script)
    out = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok", out.stdout


def test_idle_workers_are_named_in_one_warning(tmp_path: Path):
    write_jpegs(tmp_path / "img", {"a": 12})
    script = textwrap.dedent(
        f"""
        import torch
        from torch.utils.data import DataLoader
        import ringtier.torch as rt
        from ringtier import transforms as T
        from ringtier.torch._packed import rank_cores

        ds = rt.ImageFolder({str(tmp_path / "img")!r}, T.Compose([T.RandomResizedCrop(16)]), batch_size=4, pin_memory=False)
        n = sum(len(l) for _, l in DataLoader(ds, batch_size=None, num_workers=rank_cores() + 3))
        print(n)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "12"
    assert out.stderr.count("stay idle") == 1, out.stderr


def test_a_workers_engine_fits_its_share_of_the_cores(tmp_path: Path):
    write_jpegs(tmp_path / "img", {"a": 8})
    script = textwrap.dedent(
        f"""
        import os, torch
        from torch.utils.data import DataLoader, IterableDataset
        import ringtier.torch as rt

        class Probe(rt.IterableDataset):
            def __iter__(self):
                self.loader()
                yield torch.tensor([int(os.environ.get("RINGTIER_ENGINE_THREADS", "0"))])

        ds = Probe({str(tmp_path / "img")!r}, batch_size=4)
        print(sorted(int(t) for t in DataLoader(ds, batch_size=None, num_workers=4)))
        print(os.environ.get("RINGTIER_ENGINE_THREADS"))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    cores = len(os.sched_getaffinity(0))
    share = max(1, min(2, cores // 4))
    assert out.stdout.split("\n")[0] == str([share] * 4), out.stdout
    assert out.stdout.split("\n")[1] == "None", "the main process's engine is left as it is"


def test_a_ranks_engine_fits_its_share_of_the_node(tmp_path: Path):
    """Ranks on one machine (torchrun sets LOCAL_WORLD_SIZE) share its cores: each rank's engine
    and its workers' fit the rank's share, unless the launcher pinned the rank to cores of its
    own (then its affinity is its share already)."""
    write_jpegs(tmp_path / "img", {"a": 8})
    script = textwrap.dedent(
        f"""
        import os, sys, torch
        from torch.utils.data import DataLoader
        import ringtier.torch as rt
        from ringtier.torch._packed import worker_cores

        if sys.argv[1] == "pinned":
            os.sched_setaffinity(0, {{min(os.sched_getaffinity(0))}})

        class Probe(rt.IterableDataset):
            def __iter__(self):
                self.loader()
                yield torch.tensor([int(os.environ.get("RINGTIER_ENGINE_THREADS", "0"))])

        ds = Probe({str(tmp_path / "img")!r}, batch_size=4, rank=0, world_size=1)
        workers = sorted(int(t) for t in DataLoader(ds, batch_size=None, num_workers=2))
        main = [int(t) for t in DataLoader(ds, batch_size=None, num_workers=0)]
        print(workers, main, worker_cores())
        """
    )
    cores = os.cpu_count() or 1
    for local, mode in [("4", "shared"), ("4", "pinned"), ("1", "shared")]:
        env = {k: v for k, v in os.environ.items() if k != "RINGTIER_ENGINE_THREADS"}
        env["LOCAL_WORLD_SIZE"] = local
        out = subprocess.run([sys.executable, "-c", script, mode], capture_output=True, text=True, env=env, timeout=300)
        assert out.returncode == 0, out.stderr
        if len(os.sched_getaffinity(0)) < cores and mode == "shared":
            continue  # this test process is pinned itself: nothing to tell apart
        rank_cores = 1 if mode == "pinned" else max(1, cores // int(local))
        worker = max(1, min(2, rank_cores // 2))
        main = min(2, rank_cores) if local != "1" else 0  # one rank alone: the engine is left as it is
        assert out.stdout.split() == [f"[{worker},", f"{worker}]", f"[{main}]", str(rank_cores)], (local, mode, out.stdout)


def test_record_batches_packed_by_the_loader_stay_intact_while_held(tmp_path: Path):
    from test_records import write_tfrecords

    where = write_tfrecords(tmp_path / "tf", shards=4, per_shard=60)
    ds = rt.RecordDataset(tmp_path / "tf", rank=0, world_size=1, batched=True, batch_size=4, with_keys=True, seed=1)
    # Every batch held to the end: more than the workers' slots, so later batches cannot reuse
    # a slot a held batch is in (they fall back to fresh shared memory).
    held = list(DataLoader(ds, batch_size=None, num_workers=2))
    assert len(held) > 2 * SLOTS_PER_WORKER
    got = [(k, bytes(t.numpy())) for b in held for k, t in b]
    assert sorted(d for _, d in got) == sorted(where)
    assert all(where[d] == (k.rsplit(":", 1)[0], int(k.rsplit(":", 1)[1])) for k, d in got)
    assert ds._ring.by_reference.value == 1, "the slots crossed by reference after the first batch"
    del held
    # Batches dropped as they come: the slots are reused, the records right every time.
    for epoch in (1, 1):
        ds.set_epoch(epoch)
        n = 0
        for b in DataLoader(ds, batch_size=None, num_workers=2):
            for k, t in b:
                assert where[bytes(t.numpy())] == (k.rsplit(":", 1)[0], int(k.rsplit(":", 1)[1]))
            n += len(b)
        assert n == len(where)


def test_slots_cross_the_torch_way_where_the_main_process_cannot_open_them(tmp_path: Path, monkeypatch):
    from test_records import write_tfrecords

    def refused(ref):
        raise PermissionError("no /proc here")

    monkeypatch.setattr(_packed, "_open_segment", refused)
    where = write_tfrecords(tmp_path / "tf", shards=2, per_shard=40)
    ds = rt.RecordDataset(tmp_path / "tf", rank=0, world_size=1, batched=True, batch_size=4, seed=1)
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        got = [bytes(t.numpy()) for b in DataLoader(ds, batch_size=None, num_workers=2) for t in b]
        assert sorted(got) == sorted(where)
    assert ds._ring.by_reference.value == 0, "never by reference"
