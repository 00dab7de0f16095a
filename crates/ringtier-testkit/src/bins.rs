//! The kit's binaries, for the tests of other crates: `ringtier-s3-server` (the s3s-fs server
//! as a process, which `ringtier bench s3 ...` runs) and `ringtier-crash-child`.
//!
//! `cargo test --workspace` builds every workspace binary, the kit's too, into
//! `target/<profile>/`, next to the binaries under test. A test of one crate
//! (`cargo test -p ringtier-cli`) builds only that crate's: [`path`] then builds the one it
//! needs with `cargo build -p ringtier-testkit --bin NAME` (same profile) before returning it.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The benchmarks' S3 server binary.
pub const S3_SERVER: &str = "ringtier-s3-server";
/// The SIGKILL test's child binary.
pub const CRASH_CHILD: &str = "ringtier-crash-child";
/// Runs a command with `io_uring_setup` refused by a seccomp filter
/// (`ringtier-no-uring [--errno eperm|enosys] -- COMMAND ...`).
pub const NO_URING: &str = "ringtier-no-uring";

/// The directory cargo puts the binaries of the running test's profile in: the test
/// executable's own directory, or its parent where that is `deps`.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    let dir = exe.parent().expect("the test executable's directory");
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent().unwrap_or(dir).to_path_buf()
    } else {
        dir.to_path_buf()
    }
}

/// The path of the kit's binary `name` in the running test's profile directory, built first
/// (`cargo build -p ringtier-testkit --bin NAME`) where it is missing. Panics, naming the
/// command, where it cannot be built.
pub fn path(name: &str) -> PathBuf {
    static BUILD: Mutex<()> = Mutex::new(());
    let dir = profile_dir();
    let bin = dir.join(name);
    if bin.is_file() {
        return bin;
    }
    // One build at a time from this process (tests run on several threads).
    let _one = BUILD.lock().unwrap_or_else(|p| p.into_inner());
    if bin.is_file() {
        return bin;
    }
    build(name, &dir);
    assert!(bin.is_file(), "{name}: built, yet not at {}", bin.display());
    bin
}

fn build(name: &str, dir: &Path) {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let mut cmd = std::process::Command::new(cargo);
    cmd.args(["build", "--quiet", "-p", "ringtier-testkit", "--bin", name, "--manifest-path"]).arg(&manifest);
    match dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => {}
        Some("release") => {
            cmd.arg("--release");
        }
        Some(profile) => {
            cmd.args(["--profile", profile]);
        }
    }
    let how = format!("{cmd:?}");
    let status = cmd.status().unwrap_or_else(|e| panic!("{name} is missing and `{how}` did not start: {e}"));
    assert!(status.success(), "{name} is missing and `{how}` failed ({status}): run it by hand to see why");
}
