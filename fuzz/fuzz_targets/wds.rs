//! WebDataset tar members and samples: a piece-size byte, then a shard (see
//! `ringtier_loader::records::fuzzing`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| ringtier_loader::records::fuzzing::wds(data));
