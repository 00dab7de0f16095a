//! Hostile shards and indexes through the `ringtier` binary (issue 24, "hostile input never
//! aborts"): a length field that claims more than the shard holds, a garbled index. Each is a
//! non-zero exit with one clear error line naming the shard (and the tar member), never a
//! signal or a panic; with `--on-error skip` the other shards are still read.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ringtier_loader::records::{masked_crc32c, write_tar_end, write_tar_member, write_tfrecord};

fn ringtier() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ringtier"))
}

fn tempdir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(prefix).tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir")
}

fn run(args: &[&str], dir: &Path) -> Output {
    ringtier().args(args).arg("--dir").arg(dir).output().expect("run ringtier")
}

fn bench_read(format: &str, dir: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["bench", "read", "--repeats", "1", "--depths", "4", "--read-size", "64k", "--format", format];
    args.extend_from_slice(extra);
    run(&args, dir)
}

/// The command failed by exiting (not by a signal, not by a panic) with exactly one `error:`
/// line, which holds every string of `want`.
fn assert_clean_failure(what: &str, out: &Output, want: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code().is_some_and(|c| c != 0),
        "{what}: expected a non-zero exit, got {:?} (a signal is an abort)\n{stderr}",
        out.status
    );
    assert!(!stderr.contains("panicked") && !stderr.contains("memory allocation"), "{what}: {stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{what}: one error line expected\n{stderr}");
    for w in want {
        assert!(errors[0].contains(w), "{what}: expected {w:?} in {:?}", errors[0]);
    }
}

/// A tar header block's checksum, recomputed after an edit.
fn fix_tar_checksum(h: &mut [u8]) {
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h[..512].iter().map(|&b| u32::from(b)).sum();
    h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
}

/// A WebDataset shard of three members (two samples) whose third member's header declares
/// `size` as its 12-byte size field (checksum valid), followed by a little real data.
fn wds_shard_with_size_field(size: [u8; 12]) -> Vec<u8> {
    let mut out = Vec::new();
    write_tar_member(&mut out, "s0000.jpg", &[1u8; 700]);
    write_tar_member(&mut out, "s0000.cls", b"3");
    let third = out.len();
    write_tar_member(&mut out, "s0001.jpg", &[2u8; 600]);
    write_tar_end(&mut out);
    let h = &mut out[third..third + 512];
    h[124..136].copy_from_slice(&size);
    fix_tar_checksum(h);
    out
}

/// The GNU base-256 form of a tar size field.
fn base256(v: u64) -> [u8; 12] {
    let mut f = [0u8; 12];
    f[4..].copy_from_slice(&v.to_be_bytes());
    f[0] = 0x80;
    f
}

/// A good WebDataset shard of `n` samples.
fn good_wds(n: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for i in 0..n {
        write_tar_member(&mut out, &format!("g{i:04}.jpg"), &vec![i as u8; 100 + i]);
        write_tar_member(&mut out, &format!("g{i:04}.cls"), b"1");
    }
    write_tar_end(&mut out);
    out
}

/// A good TFRecord shard of `n` records.
fn good_tfrecord(n: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for i in 0..n {
        write_tfrecord(&mut out, &vec![i as u8; 50 + i]);
    }
    out
}

/// Two good records, then a record header whose length field says `len` (its CRC valid),
/// followed by `tail` bytes.
fn tfrecord_with_length(len: u64, tail: usize) -> Vec<u8> {
    let mut out = good_tfrecord(2);
    let l = len.to_le_bytes();
    out.extend_from_slice(&l);
    out.extend_from_slice(&masked_crc32c(&l).to_le_bytes());
    out.extend(std::iter::repeat_n(7u8, tail));
    out
}

fn dataset(dir: &Path, name: &str, files: &[(&str, Vec<u8>)]) -> PathBuf {
    let ds = dir.join(name);
    std::fs::create_dir_all(&ds).expect("mkdir");
    for (key, bytes) in files {
        std::fs::write(ds.join(key), bytes).expect("write shard");
    }
    ds
}

/// Case 4 of issue 24: a tar member declaring 2^40 bytes (base-256, valid checksum) aborted
/// `ringtier index` and `ringtier bench read` with an allocation failure.
#[test]
fn giant_tar_member_is_an_error_naming_shard_and_member() {
    let dir = tempdir("hostile-wds");
    let cases: [(&str, [u8; 12]); 4] = [
        ("size 2^40, base-256", base256(1 << 40)),
        ("size 2^63-1, base-256", base256(i64::MAX as u64)),
        ("negative base-256", [0xff; 12]),
        ("base-256 past 64 bits", {
            let mut f = [0x80; 12];
            f[1] = 0x7f;
            f
        }),
    ];
    for (i, (what, field)) in cases.into_iter().enumerate() {
        let ds = dataset(
            dir.path(),
            &format!("ds{i}"),
            &[("a-good.tar", good_wds(20)), ("b-bad.tar", wds_shard_with_size_field(field))],
        );
        let want: &[&str] = &["b-bad.tar", "s0001.jpg"];
        assert_clean_failure(&format!("index, {what}"), &run(&["index", "--format", "wds"], &ds), want);
        assert_clean_failure(&format!("bench read, {what}"), &bench_read("wds", &ds, &[]), want);
        let global = bench_read("wds", &ds, &["--record-order", "global"]);
        assert_clean_failure(&format!("bench read global, {what}"), &global, want);
        // Skipping bad input: the good shard and the bad shard's first sample are read.
        let json = ds.join("skip.json");
        let out = bench_read("wds", &ds, &["--on-error", "skip", "--json", json.to_str().expect("utf8")]);
        assert!(out.status.success(), "{what}: {}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parse json");
        let run = &v["ringtier"]["runs"][0];
        assert_eq!((run["records"].as_u64(), run["skipped"].as_u64()), (Some(21), Some(1)), "{what}: {run}");
    }
}

#[test]
fn tfrecord_lengths_past_the_shard_are_errors() {
    let dir = tempdir("hostile-tfr");
    for (what, shard) in [
        ("length 2^60", tfrecord_with_length(1 << 60, 64)),
        // 100 bytes of data follow the header; the record needs 101 plus its 4-byte CRC.
        ("length just past the end", tfrecord_with_length(101, 100)),
        ("length u64::MAX", tfrecord_with_length(u64::MAX, 8)),
    ] {
        let ds = dataset(
            dir.path(),
            &what.replace(' ', "-"),
            &[("a-good.tfrecord", good_tfrecord(10)), ("b-bad.tfrecord", shard)],
        );
        let want: &[&str] = &["b-bad.tfrecord", "byte offset"];
        assert_clean_failure(&format!("index, {what}"), &run(&["index", "--format", "tfrecord"], &ds), want);
        assert_clean_failure(&format!("bench read, {what}"), &bench_read("tfrecord", &ds, &[]), want);
        let global = bench_read("tfrecord", &ds, &["--record-order", "global"]);
        assert_clean_failure(&format!("bench read global, {what}"), &global, want);
        let json = ds.join("skip.json");
        let out = bench_read("tfrecord", &ds, &["--on-error", "skip", "--json", json.to_str().expect("utf8")]);
        assert!(out.status.success(), "{what}: {}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parse json");
        let run = &v["ringtier"]["runs"][0];
        assert_eq!((run["records"].as_u64(), run["skipped"].as_u64()), (Some(12), Some(1)), "{what}: {run}");
    }
}

#[test]
fn garbled_index_lines_are_errors_naming_the_index() {
    let dir = tempdir("hostile-idx");
    for (format, ext, shard) in [("tfrecord", "tfrecord", good_tfrecord(10)), ("wds", "tar", good_wds(10))] {
        let key = format!("s.{ext}");
        let ds = dataset(dir.path(), format, &[(&key, shard)]);
        let out = run(&["index", "--format", format], &ds);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let idx_path = ds.join(format!("{key}.idx"));
        let good = std::fs::read_to_string(&idx_path).expect("index written");
        let line2 = good.lines().nth(1).expect("two lines").to_string();
        let (off2, _) = line2.split_once(' ').expect("two columns");
        let garbled: Vec<(&str, Vec<u8>)> = vec![
            // Cut in the middle of its second line: the size no longer matches the record.
            ("truncated line", good.as_bytes()[..good.find(&line2).expect("line 2") + line2.len() - 1].to_vec()),
            ("not a number", good.replacen(&line2, &format!("{off2} 12x"), 1).into_bytes()),
            ("size past the shard", good.replacen(&line2, &format!("{off2} 18446744073709551615"), 1).into_bytes()),
            ("number past 64 bits", good.replacen(&line2, &format!("{off2} 99999999999999999999999"), 1).into_bytes()),
            ("one column", good.replacen(&line2, off2, 1).into_bytes()),
            ("binary garbage", {
                let mut b = good.clone().into_bytes();
                b[3] = 0xff;
                b[4] = 0xfe;
                b
            }),
        ];
        for (what, bytes) in garbled {
            std::fs::write(&idx_path, &bytes).expect("write index");
            let out = bench_read(format, &ds, &["--record-order", "global"]);
            // The error names the index file or its shard.
            assert_clean_failure(&format!("{format}, {what}"), &out, &[&key]);
        }
    }
}
