use super::*;

fn parse_all(p: &mut dyn Parser, bytes: &[u8], piece: usize) -> Vec<std::result::Result<Record, RecordError>> {
    let mut out = Vec::new();
    for c in bytes.chunks(piece.max(1)) {
        p.feed(c, &mut out);
    }
    p.finish(&mut out);
    out
}

fn payloads(n: usize) -> Vec<Vec<u8>> {
    (0..n).map(|i| (0..(i * 37) % 3000).map(|j| (i * 7 + j) as u8).collect()).collect()
}

#[test]
fn masked_crc_matches_tensorflow() {
    // From TensorFlow's crc32c tests: Mask(Value("foo")) and the record of an empty payload.
    assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
    let mut rec = Vec::new();
    write_tfrecord(&mut rec, b"");
    // length 0, masked crc of eight zero bytes, no data, masked crc of nothing.
    assert_eq!(&rec[..8], &[0u8; 8]);
    assert_eq!(u32::from_le_bytes(rec[12..16].try_into().expect("4")), 0xa282_ead8);
}

#[test]
fn tfrecords_parse_from_pieces_of_any_size() {
    let data = payloads(50);
    let mut shard = Vec::new();
    let mut offsets = Vec::new();
    for d in &data {
        offsets.push(shard.len() as u64);
        write_tfrecord(&mut shard, d);
    }
    for piece in [1, 3, 12, 13, 4096, shard.len()] {
        let mut p = tfrecord::TfRecordParser::new(3, shard.len() as u64);
        let out = parse_all(&mut p, &shard, piece);
        let got: Vec<_> = out.into_iter().map(|r| r.expect("record")).collect();
        assert_eq!(got.len(), data.len(), "piece {piece}");
        for ((r, d), off) in got.iter().zip(&data).zip(&offsets) {
            assert_eq!((r.shard, r.offset, r.fields[0].data.as_slice()), (3, *off, d.as_slice()));
        }
    }
}

#[test]
fn bad_tfrecords_name_the_offset() {
    let data = payloads(5);
    let mut shard = Vec::new();
    for d in &data {
        write_tfrecord(&mut shard, d);
    }
    let second = 16 + data[0].len();
    // A flipped data byte: that record alone is bad; the rest parse.
    let mut bad = shard.clone();
    bad[second + 12] ^= 1;
    let out = parse_all(&mut tfrecord::TfRecordParser::new(0, bad.len() as u64), &bad, 100);
    let errs: Vec<_> = out.iter().filter_map(|r| r.as_ref().err()).collect();
    assert_eq!(errs.len(), 1);
    assert_eq!((errs[0].offset, errs[0].fatal), (second as u64, false));
    assert!(errs[0].why.contains("CRC mismatch of the record data"));
    assert_eq!(out.iter().filter(|r| r.is_ok()).count(), 4);
    // A flipped length byte: the framing is lost, fatal.
    let mut bad = shard.clone();
    bad[second] ^= 0x40;
    let out = parse_all(&mut tfrecord::TfRecordParser::new(0, bad.len() as u64), &bad, 7);
    let e = out.last().expect("one").as_ref().expect_err("length crc");
    assert!(e.fatal && e.offset == second as u64 && e.why.contains("record length"), "{e:?}");
    // Truncated: the last record cut short.
    let cut = &shard[..shard.len() - 3];
    let out = parse_all(&mut tfrecord::TfRecordParser::new(0, cut.len() as u64), cut, 64);
    let e = out.last().expect("one").as_ref().expect_err("truncated");
    assert!(e.why.contains("truncated"), "{e:?}");
    assert_eq!(out.iter().filter(|r| r.is_ok()).count(), 4);
}

/// (key, jpg, cls) of each sample.
type Samples = Vec<(String, Vec<u8>, Vec<u8>)>;

fn wds_shard(samples: usize) -> (Vec<u8>, Samples) {
    let mut tar = Vec::new();
    let mut want = Vec::new();
    for i in 0..samples {
        let key = format!("class{:02}/img{i:05}", i % 3);
        let jpg: Vec<u8> = (0..(i * 611) % 5000).map(|j| (i + j) as u8).collect();
        let cls = format!("{}", i % 3).into_bytes();
        write_tar_member(&mut tar, &format!("{key}.jpg"), &jpg);
        write_tar_member(&mut tar, &format!("{key}.cls"), &cls);
        want.push((key, jpg, cls));
    }
    write_tar_end(&mut tar);
    (tar, want)
}

#[test]
fn webdataset_samples_group_fields_by_key() {
    assert_eq!(split_key("a/b/img01.seg.png"), ("a/b/img01", "seg.png"));
    assert_eq!(split_key("noext"), ("noext", ""));
    let (tar, want) = wds_shard(20);
    for piece in [1, 511, 512, 513, 4096, tar.len()] {
        let out = parse_all(&mut wds::WdsParser::new(1, tar.len() as u64), &tar, piece);
        let got: Vec<_> = out.into_iter().map(|r| r.expect("sample")).collect();
        assert_eq!(got.len(), want.len(), "piece {piece}");
        for (r, (key, jpg, cls)) in got.iter().zip(&want) {
            assert_eq!(&r.key, key);
            assert_eq!(r.field("jpg"), Some(jpg.as_slice()));
            assert_eq!(r.field("cls"), Some(cls.as_slice()));
        }
    }
}

#[test]
fn python_tarfile_shards_parse_too() {
    // A long name (GNU or pax, as Python's tarfile writes) for a member.
    let mut tar = Vec::new();
    let long = format!("{}/x.txt", "d".repeat(180));
    let mut pax = Vec::new();
    let rec = format!(" path={long}\n");
    let len = rec.len() + 3;
    pax.extend_from_slice(format!("{len}{rec}").as_bytes());
    // A pax header member ('x').
    let mut h = Vec::new();
    write_tar_member(&mut h, "PaxHeader", &pax);
    h[156] = b'x';
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h[..512].iter().map(|&b| u32::from(b)).sum();
    h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
    tar.extend_from_slice(&h);
    write_tar_member(&mut tar, "short-name-ignored.txt", b"hello");
    write_tar_end(&mut tar);
    let out = parse_all(&mut wds::WdsParser::new(0, tar.len() as u64), &tar, 100);
    let r = out[0].as_ref().expect("sample");
    assert_eq!((r.key.as_str(), r.field("txt")), (long.trim_end_matches(".txt"), Some(&b"hello"[..])));
}

#[test]
fn corrupt_tar_headers_and_truncation_name_the_offset() {
    let (tar, _) = wds_shard(6);
    // Corrupt the header of the fifth member (the third sample's first): the first sample
    // came through; the second, whose fields may not all have been seen, is not delivered.
    let mut third = 0;
    for _ in 0..4 {
        let size = usize::from_str_radix(std::str::from_utf8(&tar[third + 124..third + 135]).expect("utf8"), 8)
            .expect("octal");
        third += 512 + size.next_multiple_of(512);
    }
    let mut bad = tar.clone();
    bad[third + 10] ^= 0x20;
    let out = parse_all(&mut wds::WdsParser::new(0, bad.len() as u64), &bad, 1000);
    let e = out.last().expect("one").as_ref().expect_err("corrupt");
    assert!(e.fatal && e.offset == third as u64 && e.why.contains("corrupt tar header"), "{e:?}");
    assert_eq!(out.iter().filter(|r| r.is_ok()).count(), 1, "the first sample came through");
    assert_eq!(out[0].as_ref().expect("first").key, "class00/img00000");
    let cut = &tar[..tar.len() - 1024 - 100];
    let out = parse_all(&mut wds::WdsParser::new(0, cut.len() as u64), cut, 1000);
    assert!(out.last().expect("one").as_ref().expect_err("cut").why.contains("truncated"));
}

/// A tar header block's checksum, recomputed after an edit.
fn fix_tar_checksum(h: &mut [u8]) {
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h[..512].iter().map(|&b| u32::from(b)).sum();
    h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
}

/// The GNU base-256 form of a tar size field.
fn base256(v: u64) -> [u8; 12] {
    let mut f = [0u8; 12];
    f[4..].copy_from_slice(&v.to_be_bytes());
    f[0] = 0x80;
    f
}

#[test]
fn hostile_tar_size_fields_are_errors_before_any_allocation() {
    // Two samples; the third member's size field is replaced (its checksum kept valid).
    let mut tar = Vec::new();
    write_tar_member(&mut tar, "a.jpg", &[1; 700]);
    write_tar_member(&mut tar, "a.cls", b"1");
    let third = tar.len();
    write_tar_member(&mut tar, "b.jpg", &[2; 600]);
    write_tar_end(&mut tar);
    let mut past_64_bits = [0x80u8; 12];
    past_64_bits[1] = 0x7f;
    let cases: Vec<([u8; 12], &str)> = vec![
        (base256(1 << 40), "declares 1099511627776 bytes"),
        (base256(i64::MAX as u64), "declares 9223372036854775807 bytes"),
        (base256(u64::MAX), "declares 18446744073709551615 bytes"),
        ([0xff; 12], "corrupt size field"),
        (past_64_bits, "corrupt size field"),
        (*b"77777777777\0", "declares 8589934591 bytes"),
        (*b"+0000000010\0", "corrupt size field"),
        (*b"12x4\0\0\0\0\0\0\0\0", "corrupt size field"),
    ];
    for (field, want) in cases {
        let mut bad = tar.clone();
        bad[third + 124..third + 136].copy_from_slice(&field);
        fix_tar_checksum(&mut bad[third..third + 512]);
        for piece in [1, 512, 4096] {
            let out = parse_all(&mut wds::WdsParser::new(0, bad.len() as u64), &bad, piece);
            let e = out.last().expect("one").as_ref().expect_err(want);
            assert!(e.fatal && e.offset == third as u64, "{field:?}: {e:?}");
            assert!(e.why.contains(want) && e.why.contains("\"b.jpg\""), "{field:?}: {e:?}");
            let keys: Vec<_> = out.iter().flatten().map(|r| r.key.as_str()).collect();
            assert_eq!(keys, ["a"], "the sample before came through");
        }
        // Read through an index: the member may not claim past the indexed span either.
        let mut p = wds::WdsParser::new(0, bad.len() as u64).at(third as u64, third as u64 + 1536);
        let out = parse_all(&mut p, &bad[third..third + 1536], 1536);
        assert!(out.last().expect("one").as_ref().is_err(), "{field:?}: {out:?}");
    }
    // A base-256 size that fits is read: 600 bytes.
    let mut ok = tar.clone();
    ok[third + 124..third + 136].copy_from_slice(&base256(600));
    fix_tar_checksum(&mut ok[third..third + 512]);
    let out = parse_all(&mut wds::WdsParser::new(0, ok.len() as u64), &ok, 4096);
    assert_eq!(out.iter().flatten().count(), 2, "{out:?}");
}

#[test]
fn oversized_pax_and_long_name_headers_are_errors() {
    for flag in [b'x', b'L'] {
        let mut tar = Vec::new();
        let meta = vec![b'a'; wds::MAX_META_BYTES as usize + 1];
        write_tar_member(&mut tar, "././@LongLink", &meta);
        tar[156] = flag;
        fix_tar_checksum(&mut tar[..512]);
        write_tar_member(&mut tar, "x.txt", b"hello");
        write_tar_end(&mut tar);
        let out = parse_all(&mut wds::WdsParser::new(0, tar.len() as u64), &tar, 1 << 16);
        let e = out.last().expect("one").as_ref().expect_err("too large");
        assert!(e.fatal && e.offset == 0 && e.why.contains("long-name or pax header"), "{e:?}");
    }
}

#[test]
fn tfrecord_lengths_past_the_shard_are_errors() {
    let mut good = Vec::new();
    write_tfrecord(&mut good, b"first");
    for (len, tail) in [(1u64 << 60, 64usize), (u64::MAX, 8), (101, 100), (97, 100)] {
        let mut shard = good.clone();
        let l = len.to_le_bytes();
        shard.extend_from_slice(&l);
        shard.extend_from_slice(&masked_crc32c(&l).to_le_bytes());
        shard.extend(std::iter::repeat_n(0u8, tail));
        for piece in [1, 13, 4096] {
            let out = parse_all(&mut tfrecord::TfRecordParser::new(0, shard.len() as u64), &shard, piece);
            assert_eq!(out.iter().flatten().count(), 1, "the record before came through");
            let e = out.last().expect("one").as_ref().expect_err("truncated");
            assert!(e.fatal && e.offset == good.len() as u64 && e.why.contains("truncated"), "{len}: {e:?}");
        }
    }
}

#[test]
fn a_long_name_belongs_to_the_next_member_whatever_its_type() {
    // A GNU long name for a directory, then a file: the file keeps its own name.
    let mut tar = Vec::new();
    let long = format!("{}/", "d".repeat(150));
    write_tar_member(&mut tar, "././@LongLink", long.as_bytes());
    tar[156] = b'L';
    fix_tar_checksum(&mut tar[..512]);
    let dir = tar.len();
    write_tar_member(&mut tar, "ddd/", b"");
    tar[dir + 156] = b'5';
    fix_tar_checksum(&mut tar[dir..dir + 512]);
    let file = tar.len();
    write_tar_member(&mut tar, "x.txt", b"hello");
    write_tar_end(&mut tar);
    let out = parse_all(&mut wds::WdsParser::new(0, tar.len() as u64), &tar, 100);
    let r = out[0].as_ref().expect("sample");
    assert_eq!((r.key.as_str(), r.offset, r.field("txt")), ("x", file as u64, Some(&b"hello"[..])));
    fuzzing::wds(&[0].iter().chain(&tar).copied().collect::<Vec<u8>>());
}

#[test]
fn fuzz_entry_points_accept_valid_and_hostile_input() {
    let (tar, _) = wds_shard(5);
    let mut tfr = Vec::new();
    for d in payloads(5) {
        write_tfrecord(&mut tfr, &d);
    }
    for piece in [0u8, 1, 7, 255] {
        let with = |b: &[u8]| [piece].iter().chain(b).copied().collect::<Vec<u8>>();
        fuzzing::wds(&with(&tar));
        fuzzing::wds(&with(&tar[..tar.len() / 2]));
        fuzzing::tfrecord(&with(&tfr));
        fuzzing::tfrecord(&with(&tfr[..tfr.len() - 5]));
        fuzzing::tfrecord(&with(&tar));
        fuzzing::wds(&with(&tfr));
    }
    fuzzing::index(b"");
    fuzzing::index(b"\xff\x00v1.2 1\njpg 512 3 a.jpg cls 1536 1 a.cls\n");
    fuzzing::index(b"\x00\x01 0 16\n16 20\n\xff");
}

#[test]
fn errors_show_a_long_member_path_cut_short() {
    // A pax path of 100,000 bytes, then a member whose size claims more than the shard holds.
    let mut tar = Vec::new();
    let long = "p".repeat(100_000);
    let rec = format!(" path={long}\n");
    let len = rec.len() + 6;
    write_tar_member(&mut tar, "PaxHeader", format!("{len}{rec}").as_bytes());
    tar[156] = b'x';
    fix_tar_checksum(&mut tar[..512]);
    let member = tar.len();
    write_tar_member(&mut tar, "x.txt", b"hello");
    tar[member + 124..member + 136].copy_from_slice(&base256(1 << 40));
    fix_tar_checksum(&mut tar[member..member + 512]);
    let out = parse_all(&mut wds::WdsParser::new(0, tar.len() as u64), &tar, 4096);
    let e = out.last().expect("one").as_ref().expect_err("too large");
    assert!(e.why.contains("declares 1099511627776 bytes") && e.why.contains("ppp..."), "{e:?}");
    assert!(e.why.len() < 400, "{} bytes", e.why.len());
}
