//! `ringtier ckpt` end to end: a save larger than a physically full fast tier (one clear line,
//! nothing partial; written through on request), and a restore that streams parts, falls back
//! to a slower copy of a corrupt part and rejects bad input in one line.

use ringtier_testkit::SmallTmpfs;
use std::path::Path;
use std::process::Command;

fn ringtier() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ringtier"))
}

#[test]
fn ckpt_save_larger_than_a_physically_full_fast_tier() {
    // The 150 MB save onto a 100 MB fast tier, scaled down: 24 MB onto 16 MiB, no
    // --fast-capacity (the file system's own size and free space are the bound).
    let Some(fast) = SmallTmpfs::mount("16m", Path::new(env!("CARGO_TARGET_TMPDIR"))) else { return };
    let dir = tempfile::Builder::new().prefix("cli-full").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let model = dir.path().join("model.bin");
    let data: Vec<u8> = (0..24_000_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    std::fs::write(&model, &data).expect("write model");
    let tiers = format!("{},{}", fast.path().display(), dir.path().join("slow").display());
    let save = |extra: &[&str]| {
        ringtier()
            .args(["ckpt", "--tiers", &tiers])
            .args(extra)
            .args(["save", "--step", "1", "--part"])
            .arg(format!("model={}", model.display()))
            .env("RUST_BACKTRACE", "1")
            .output()
            .expect("run ringtier ckpt save")
    };
    let fast_files = || {
        let mut n = 0;
        let mut stack = vec![fast.path().to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).expect("read_dir").flatten() {
                if e.path().is_dir() {
                    stack.push(e.path());
                } else if !e.file_name().to_string_lossy().starts_with(".ringtier-lock") {
                    n += 1;
                }
            }
        }
        n
    };
    // Waiting cannot help: one clear line, nothing left behind.
    let out = save(&[]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.trim().lines().count() == 1 && err.contains("error: no_space"), "{err}");
    assert!(err.contains("larger than tier") && err.contains("write-through"), "{err}");
    assert_eq!(fast_files(), 0, "no partial checkpoint on the fast tier");
    // Write-through: saved on the slow tier, whole.
    let out = save(&["--on-full", "write-through"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("saved step 1 (24.0 MB) on slow") && stdout.contains("written through"), "{stdout}");
    assert_eq!(fast_files(), 0);
    let restored = dir.path().join("restored");
    let out =
        ringtier().args(["ckpt", "--tiers", &tiers, "restore", "--out"]).arg(&restored).output().expect("restore");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(std::fs::read(restored.join("model")).expect("restored") == data, "the bytes saved");
}

#[test]
fn ckpt_restore_streams_parts_falls_back_and_rejects_bad_input() {
    let dir = tempfile::Builder::new().prefix("cli-restore").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let tiers = format!("{},{}", dir.path().join("fast").display(), dir.path().join("slow").display());
    let a: Vec<u8> = (0..3_000_017u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let b: Vec<u8> = (0..1_000_003u32).map(|i| (i.wrapping_mul(40_503) >> 7) as u8).collect();
    std::fs::write(dir.path().join("a.bin"), &a).expect("write");
    std::fs::write(dir.path().join("b.bin"), &b).expect("write");
    let ckpt = |args: &[&str]| {
        let out = ringtier().args(["ckpt", "--tiers", &tiers]).args(args).output().expect("run ringtier ckpt");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let a_arg = format!("a={}", dir.path().join("a.bin").display());
    let b_arg = format!("b={}", dir.path().join("b.bin").display());
    let (code, _, err) = ckpt(&["save", "--step", "7", "--part", &a_arg, "--part", &b_arg]);
    assert_eq!(code, Some(0), "{err}");
    let out_dir = |name: &str| dir.path().join(name);
    let path = |p: &Path| p.display().to_string();

    // One part only, small reads: only that file, whole, and no staging directory left.
    let (code, stdout, err) =
        ckpt(&["restore", "--out", &path(&out_dir("one")), "--part", "b", "--chunk", "64K", "--depth", "3"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(stdout.contains("restored step 7 from fast (1 parts"), "{stdout}");
    let names: Vec<String> = std::fs::read_dir(out_dir("one"))
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["b"]);
    assert!(std::fs::read(out_dir("one").join("b")).expect("b") == b);

    // A corrupt fast copy of a: read again from the slow copy, with a warning that says so.
    let fast_a = dir.path().join("fast/ckpt/00000000000000000007/parts/a");
    let mut bad = std::fs::read(&fast_a).expect("read");
    bad[2_000_000] ^= 0x10;
    std::fs::write(&fast_a, &bad).expect("write");
    let (code, stdout, err) = ckpt(&["restore", "--out", &path(&out_dir("all"))]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("part \"a\" on tier \"fast\"") && err.contains("checksum mismatch"), "{err}");
    assert!(stdout.contains("from slow, fast (2 parts"), "{stdout}");
    assert!(std::fs::read(out_dir("all").join("a")).expect("a") == a);
    assert!(std::fs::read(out_dir("all").join("b")).expect("b") == b);

    // --no-sync: page-cache writes renamed into place, the same bytes, the same fallback and
    // no staging directory left; the report says the files were not fsynced.
    let (code, stdout, err) = ckpt(&["restore", "--out", &path(&out_dir("nosync")), "--no-sync"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("checksum mismatch") && stdout.contains("(not fsynced)"), "{stdout}{err}");
    let mut names: Vec<String> = std::fs::read_dir(out_dir("nosync"))
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["a", "b"]);
    assert!(std::fs::read(out_dir("nosync").join("a")).expect("a") == a);
    assert!(std::fs::read(out_dir("nosync").join("b")).expect("b") == b);

    // Bad input: one clear line each.
    std::fs::write(out_dir("a-file"), b"x").expect("write");
    for (args, want) in [
        (vec!["restore", "--out", &path(&out_dir("x")), "--step", "99"], "no committed copy of checkpoint 99"),
        (vec!["restore", "--out", &path(&out_dir("x")), "--part", "nope"], "no part \"nope\" (its parts: a, b)"),
        (vec!["restore", "--out", &path(&out_dir("a-file"))], "a-file"),
        (vec!["restore", "--out", &path(&out_dir("a-file")), "--no-sync"], "a-file"),
    ] {
        let (code, _, err) = ckpt(&args);
        assert_eq!(code, Some(1), "{args:?}: {err}");
        assert!(err.trim().lines().count() == 1 && err.starts_with("error: ") && err.contains(want), "{args:?}: {err}");
    }
    assert!(!out_dir("x").join("a").exists() && !out_dir("x").join("b").exists(), "nothing restored");
}
