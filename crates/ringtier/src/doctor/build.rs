//! What this build has: CUDA staging (and whether the driver loads), the JPEG decoder.

use serde_json::{json, Map, Value};

use super::{Finding, Status};

/// `cuda`: whether this build stages to CUDA devices and the driver loads.
pub(super) fn cuda(facts: &mut Map<String, Value>) -> Finding {
    let present = ringtier_stage::cuda_driver_present();
    facts.insert("cuda".into(), json!({ "built": present.is_some(), "driver": present }));
    match present {
        Some(true) => Finding::new(
            "cuda",
            Status::Ok,
            "CUDA driver (libcuda) found: batches are staged to the GPU (cuda:N) through pinned host memory",
        ),
        Some(false) => Finding::new(
            "cuda",
            Status::Note,
            "built with CUDA staging, but no CUDA driver (libcuda) loads: staging to cuda:N fails; the host target \
             (pinned host memory) works",
        ),
        None => Finding::new(
            "cuda",
            Status::Note,
            "built without CUDA staging (feature `cuda`): batches are staged into pinned host memory",
        ),
    }
}

/// `decoder`: the JPEG decoder this build runs.
pub(super) fn decoder(facts: &mut Map<String, Value>) -> Finding {
    let name = ringtier_decode::JPEG_DECODER;
    facts.insert("jpeg_decoder".into(), json!(name));
    if name == "libjpeg-turbo" {
        Finding::new("decoder", Status::Ok, "libjpeg-turbo (SIMD, DCT-domain downscaling)")
    } else {
        Finding::new(
            "decoder",
            Status::Note,
            format!(
                "{name} (pure Rust); libjpeg-turbo (feature `turbojpeg`, about 1.5x the images per core) is not in \
                 this build"
            ),
        )
    }
}
