"""Prometheus metrics from Python: the exporter serves the loader's and the store's metrics."""

from __future__ import annotations

import urllib.request

import pytest

import ringtier


def test_serve_metrics_scrape(dataset, tiers):
    with pytest.raises(ValueError, match="HOST:PORT"):
        ringtier.serve_metrics("nowhere")
    addr = ringtier.serve_metrics("127.0.0.1:0")
    root, files = dataset
    loader = ringtier.Loader(root, batch_size=32)
    assert sum(len(b) for b in loader.epoch(0)) == len(files)
    with ringtier.CheckpointStore(tiers) as store:
        store.save(1, {"x": b"12345"})
        store.drain()
    body = urllib.request.urlopen(f"http://{addr}/metrics", timeout=10).read().decode()
    assert "ringtier_loader_batches_total" in body
    assert "ringtier_checkpoint_saves_total" in body
    assert "ringtier_loader_batches_total" in ringtier.metrics_text()
