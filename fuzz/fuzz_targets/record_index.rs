//! Record indexes (DALI `tfrecord2idx`, `wds2idx`): two bytes of shard size, then the text
//! (see `ringtier_loader::records::fuzzing`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| ringtier_loader::records::fuzzing::index(data));
