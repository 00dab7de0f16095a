//! A safetensors file's header: the 8-byte length, the JSON, offsets, dtypes and shapes
//! checked against the file's size (see `ringtier_safetensors::fuzzing::header`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| ringtier_safetensors::fuzzing::header(data));
