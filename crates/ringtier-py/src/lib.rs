#![doc = include_str!("../README.md")]

mod buffer;
mod cache;
mod direct;
mod doctor;
mod engine;
mod errors;
mod filemap;
mod group;
mod lazy_pool;
mod loader;
mod materialize;
mod metrics;
mod reader;
mod records;
mod safetensors;
mod store;
mod tf_records;
mod thp;
mod tiers;
mod transforms;

use pyo3::prelude::*;

/// The extension module `ringtier._ringtier`; the package `ringtier` wraps it.
#[pymodule]
fn _ringtier(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<loader::Loader>()?;
    m.add_class::<loader::Epoch>()?;
    m.add_class::<loader::Batch>()?;
    m.add_class::<loader::Sample>()?;
    m.add_class::<cache::Cache>()?;
    m.add_class::<records::RecordLoader>()?;
    m.add_class::<records::RecordEpoch>()?;
    m.add_class::<records::RecordBatch>()?;
    m.add_class::<records::Record>()?;
    m.add_class::<records::Field>()?;
    m.add_class::<reader::FileReader>()?;
    m.add_class::<reader::FileBuffer>()?;
    m.add_class::<store::CheckpointStore>()?;
    m.add_class::<store::SaveFuture>()?;
    m.add_class::<store::PartBuffer>()?;
    m.add_class::<transforms::TransformPipeline>()?;
    m.add_class::<transforms::PendingBatch>()?;
    m.add_class::<transforms::TransformedBatch>()?;
    safetensors::register(m)?;
    group::register(m)?;
    m.add_function(wrap_pyfunction!(loader::_engine_pid, m)?)?;
    m.add_function(wrap_pyfunction!(tiers::_is_s3_url, m)?)?;
    m.add_function(wrap_pyfunction!(tf_records::_tf_release, m)?)?;
    m.add_function(wrap_pyfunction!(tf_records::_tf_open_epochs, m)?)?;
    m.add_function(wrap_pyfunction!(doctor::doctor, m)?)?;
    m.add_function(wrap_pyfunction!(metrics::serve_metrics, m)?)?;
    m.add_function(wrap_pyfunction!(metrics::metrics_text, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // The JPEG decoder this build runs: "zune-jpeg", or "libjpeg-turbo" (feature turbojpeg).
    m.add("JPEG_DECODER", ringtier_decode::JPEG_DECODER)?;
    // Whether tiers may be `s3://` URLs (feature s3, on by default).
    m.add("HAS_S3", cfg!(feature = "s3"))?;
    Ok(())
}
