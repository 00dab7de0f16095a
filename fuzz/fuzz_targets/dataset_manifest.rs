//! The dataset manifest (`.ringtier-manifest.tsv`): a parsed manifest's text parses back to it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringtier_loader::manifest::Manifest;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(m) = Manifest::parse(&text, "fuzz.tsv") {
        let again = Manifest::parse(&m.to_text(), "fuzz.tsv").expect("a manifest's own text parses");
        assert_eq!(again, m, "the manifest's text parses back to it");
    }
});
