#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| ringtier_s3::fuzzing::xml(data));
