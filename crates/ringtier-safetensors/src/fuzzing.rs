//! The fuzz target's entry point (`fuzz/fuzz_targets/safetensors_header.rs`) and its checks,
//! here so that the short stable-toolchain run (`tests/fuzz_corpus.rs`) runs the same code.

use crate::header::{Header, Layout, TensorSpec, LEN_BYTES};

/// Parses `data` as a whole safetensors file; where it parses, checks the header's
/// invariants (tensors contiguous from 0 to the end of the file, each one's byte count that of
/// its dtype and shape, names found again) and that writing the same tensors back gives a
/// header that parses to the same tensors. Panics on a broken invariant.
pub fn header(data: &[u8]) {
    let Ok(h) = Header::parse(data, data.len() as u64) else { return };
    assert_eq!(h.file_size(), data.len() as u64);
    assert!(h.json_len() <= crate::MAX_HEADER_BYTES);
    let mut at = 0;
    for t in h.tensors() {
        assert_eq!(t.data_offsets.0, at);
        assert_eq!(t.dtype.byte_len(&t.shape), Some(t.byte_len()));
        assert_eq!(h.get(&t.name), Some(t));
        at = t.data_offsets.1;
    }
    assert_eq!(at, h.data_len());
    assert!(h.data_start() >= LEN_BYTES);
    let specs: Vec<TensorSpec> = h
        .tensors()
        .iter()
        .map(|t| TensorSpec { name: t.name.clone(), dtype: t.dtype, shape: t.shape.clone(), byte_len: t.byte_len() })
        .collect();
    let Ok(layout) = Layout::plan(&specs, h.metadata()) else {
        // Only a header too large once re-encoded (escapes grow) may fail.
        return;
    };
    let mut file = layout.prefix.clone();
    file.resize(file.len() + h.data_len() as usize, 0);
    let again = Header::parse(&file, file.len() as u64).expect("a header we wrote parses");
    assert_eq!(again.len(), h.len());
    assert_eq!(again.metadata(), h.metadata());
    for t in h.tensors() {
        let u = again.get(&t.name).expect("every tensor written back");
        assert_eq!((u.dtype, &u.shape, u.byte_len()), (t.dtype, &t.shape, t.byte_len()));
    }
}
