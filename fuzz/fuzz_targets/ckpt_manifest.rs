//! The checkpoint manifest (`MANIFEST.json`): a parsed manifest's bytes parse back to it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringtier_migrate::CheckpointManifest;

fuzz_target!(|data: &[u8]| {
    // The step the store expects is part of the input: its first byte.
    let (step, bytes) = match data.split_first() {
        Some((&s, rest)) => (u64::from(s), rest),
        None => (0, data),
    };
    if let Ok(m) = CheckpointManifest::parse(bytes, step, "fuzz/MANIFEST.json") {
        let again = CheckpointManifest::parse(&m.to_bytes(), step, "fuzz/MANIFEST.json");
        assert_eq!(again.ok().as_ref(), Some(&m), "the manifest's bytes parse back to it");
    }
});
