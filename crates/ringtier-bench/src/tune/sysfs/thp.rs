//! The kernel's transparent huge page mode, set to `always` while fio runs (so that fio's
//! buffers are on huge pages, as ringtier's are) and put back after, through the journal of
//! originals ([`super`]).

use std::path::Path;

use super::{set_recorded, RestoreGuard};
use crate::harness::blockdev::{active_choice, read_value};

/// The kernel's transparent huge page mode.
pub(crate) const THP_ENABLED: &str = "/sys/kernel/mm/transparent_hugepage/enabled";

/// Gives fio's I/O buffers huge pages, as ringtier's have, for as long as the returned guard
/// lives; returns what the report says of fio's memory.
///
/// ringtier's buffers of 2 MiB and more are on transparent huge pages (it asks with
/// `madvise`); fio's (`iomem=malloc`) are on 4 KiB pages unless the kernel's mode is
/// `always`. A direct read into 4 KiB pages is one segment per page (32 for 128 KiB) for the
/// driver and the host; on the project's virtio disk that made fio 1.2 to 1.3x slower at
/// depth 128 with nothing else different (fio with the mode `always` read as fast as
/// ringtier; `bench/results/tune-fio/huge-pages.md`). So when the mode is `madvise`, it is set to
/// `always` while the comparison runs and put back after (by the guard, and by tune's panic
/// and signal restorers, as block settings are); where it cannot be written (not root) the
/// report says the memory differs.
/// With `change` false the mode is left as it is (the report says what it is).
pub(crate) fn huge_pages_for_fio(path: &Path, change: bool) -> (RestoreGuard, String) {
    let guard = RestoreGuard::new();
    let mode = read_value(path).and_then(|v| active_choice(&v));
    let note = match mode.as_deref() {
        Some("always") => "fio's buffers on huge pages as ringtier's (transparent huge pages: always)".to_string(),
        Some("never") => {
            "neither side's buffers on huge pages (transparent huge pages: never; ringtier's madvise is ignored)"
                .to_string()
        }
        Some("madvise") if !change => "fio's buffers on 4 KiB pages, ringtier's on 2 MiB huge pages (transparent \
                                       huge pages: madvise, left so by --fio-small-pages)"
            .to_string(),
        Some("madvise") => match set_recorded(path, "madvise", "always") {
            Ok(()) => "fio's buffers on huge pages as ringtier's (transparent huge pages set to always for the \
                       comparison, madvise again after)"
                .to_string(),
            Err(e) => format!(
                "fio's buffers on 4 KiB pages, ringtier's on 2 MiB huge pages: not the same memory ({e}; run as root \
                 to compare at equal memory)"
            ),
        },
        _ => format!(
            "transparent huge pages unknown ({} unreadable): fio's buffers may be on 4 KiB pages",
            path.display()
        ),
    };
    (guard, note)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fio_gets_huge_pages_while_the_guard_lives_and_the_mode_comes_back() {
        let _l = super::super::tests::LOCK.lock().unwrap_or_else(|p| p.into_inner());
        let dir = tempfile::tempdir().expect("tempdir");
        let thp = dir.path().join("enabled");
        std::fs::write(&thp, "always [madvise] never\n").expect("write");
        {
            let (_g, note) = huge_pages_for_fio(&thp, true);
            assert!(note.contains("set to always"), "{note}");
            assert_eq!(std::fs::read_to_string(&thp).expect("read"), "always");
        }
        assert_eq!(std::fs::read_to_string(&thp).expect("read"), "madvise", "put back at the guard's end");
        for (mode, says) in [("[always] madvise never", "always)"), ("always madvise [never]", "never")] {
            std::fs::write(&thp, mode).expect("write");
            let (_g, note) = huge_pages_for_fio(&thp, true);
            assert!(note.contains(says), "{mode}: {note}");
            assert_eq!(std::fs::read_to_string(&thp).expect("read"), mode, "left alone");
        }
        std::fs::write(&thp, "always [madvise] never").expect("write");
        let (_g, note) = huge_pages_for_fio(&thp, false);
        assert!(note.contains("--fio-small-pages"), "{note}");
        assert_eq!(std::fs::read_to_string(&thp).expect("read"), "always [madvise] never", "left alone");
        let (_g, note) = huge_pages_for_fio(&dir.path().join("missing"), true);
        assert!(note.contains("unknown"), "{note}");
    }
}
