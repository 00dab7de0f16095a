//! Whether a large destination mapping asks the kernel for transparent huge pages
//! (`RINGTIER_HUGE_PAGES=on`; off by default).
//!
//! A fresh gigabyte of anonymous memory is faulted in page by page before a read can land in
//! it: with 4 KiB pages that is 262,144 faults (zeroing, page tables, memory-cgroup charge, LRU),
//! 0.28 to 0.35 CPU s per GiB on the development VM, most of a load's CPU. With 2 MiB pages it is
//! 512 faults and the zeroing: 0.09 CPU s per GiB there, when the memory handed out is memory
//! the machine has touched before. It often is not: a VM with free page reporting
//! (virtio-balloon, as on the development VM and many clouds) gives its free 2 MiB blocks back
//! to the host, and the first touch of each then faults on the host too, inside the guest's
//! zeroing: a 2 GiB safetensors load took 1.8 to 4.7 CPU s with huge pages against 0.7 to 0.8
//! without. And under the usual `defrag=madvise`, a huge-page fault in a region advised
//! `MADV_HUGEPAGE` compacts memory synchronously when no free 2 MiB block is left. So huge
//! pages are asked for only where the user says so (bare metal, or memory that stays with the
//! guest), and even then only where the free lists (`/proc/buddyinfo`) hold free blocks of
//! 2 MiB or more for the whole mapping twice over and THP is not switched off: no fault then
//! has to compact.

/// Size of a huge page on x86-64 and of the blocks counted (order 9 of 4 KiB pages).
pub(crate) const HUGE: usize = 2 << 20;

/// Mappings below this stay on small pages (a few faults either way).
const MIN_BYTES: usize = 64 << 20;

/// The largest `/proc` file read here (a few lines in practice).
const MAX_PROC_READ: u64 = 64 << 10;

/// What `RINGTIER_HUGE_PAGES` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Policy {
    /// Advise where the free lists can serve the mapping (`on`, `1`, `yes`, `auto`).
    Auto,
    /// Never advise (the default, and any other value).
    Off,
}

impl Policy {
    /// From the environment.
    pub(crate) fn from_env() -> Self {
        match std::env::var("RINGTIER_HUGE_PAGES").map(|v| v.trim().to_ascii_lowercase()).as_deref() {
            Ok("on" | "1" | "yes" | "auto") => Policy::Auto,
            _ => Policy::Off,
        }
    }
}

fn read_small(path: &str) -> Option<String> {
    use std::io::Read;
    let mut s = String::new();
    std::fs::File::open(path).ok()?.take(MAX_PROC_READ).read_to_string(&mut s).ok()?;
    Some(s)
}

/// Free blocks of at least 2 MiB, counted in 2 MiB blocks, over every zone of `buddyinfo`
/// (lines `Node 0, zone Normal c0 c1 ... c10`: `ck` free blocks of 2^k pages of 4 KiB).
/// `None` when the text has no zone line.
pub(crate) fn free_huge_blocks(buddyinfo: &str) -> Option<u64> {
    let mut total: u64 = 0;
    let mut seen = false;
    for line in buddyinfo.lines() {
        let Some((_, counts)) = line.split_once("zone") else { continue };
        let mut fields = counts.split_whitespace();
        fields.next(); // the zone's name
        seen = true;
        for (order, c) in fields.enumerate() {
            let Ok(c) = c.parse::<u64>() else { break };
            if let Some(shift) = order.checked_sub(9) {
                let blocks = 1u64
                    .checked_shl(u32::try_from(shift).unwrap_or(u32::MAX))
                    .and_then(|m| c.checked_mul(m))
                    .unwrap_or(u64::MAX);
                total = total.saturating_add(blocks);
            }
        }
    }
    seen.then_some(total)
}

/// Whether THP is switched on for advised regions (`[always]` or `[madvise]` selected).
pub(crate) fn thp_enabled(setting: &str) -> bool {
    setting.contains("[always]") || setting.contains("[madvise]")
}

/// Whether a mapping of `bytes` should be advised `MADV_HUGEPAGE` under `policy`, given the
/// THP setting and the buddy allocator's free lists (the texts of their `/proc` and `/sys`
/// files; `None` where unreadable, which means no).
pub(crate) fn decide(policy: Policy, bytes: usize, enabled: Option<&str>, buddyinfo: Option<&str>) -> bool {
    match policy {
        Policy::Off => false,
        Policy::Auto => {
            if bytes < MIN_BYTES || !enabled.is_some_and(thp_enabled) {
                return false;
            }
            let need = (bytes / HUGE) as u64;
            buddyinfo.and_then(free_huge_blocks).is_some_and(|free| free >= need.saturating_mul(2))
        }
    }
}

/// [`decide`] on this machine now.
pub(crate) fn want_huge_pages(bytes: usize) -> bool {
    let policy = Policy::from_env();
    if policy == Policy::Off || bytes < MIN_BYTES {
        return false;
    }
    let enabled = read_small("/sys/kernel/mm/transparent_hugepage/enabled");
    let buddy = read_small("/proc/buddyinfo");
    decide(policy, bytes, enabled.as_deref(), buddy.as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUDDY: &str =
        "Node 0, zone      DMA      0      0      0      0      0      0      0      0      1      1      3 \n\
Node 0, zone    DMA32     19     17     23     22     20     21     20     23     23     21    733 \n\
Node 0, zone   Normal   8560  15217   5623   4443   3109   2013   2498    648   1688    999   3311 \n";

    #[test]
    fn counts_blocks_of_two_mib_and_up() {
        // order 9 counts once, order 10 twice: DMA 1+6, DMA32 21+1466, Normal 999+6622.
        assert_eq!(free_huge_blocks(BUDDY), Some(1 + 6 + 21 + 1466 + 999 + 6622));
        assert_eq!(free_huge_blocks(""), None);
        assert_eq!(free_huge_blocks("garbage\n"), None);
        // A zone line cut short counts what it has; a bad number ends that line.
        assert_eq!(free_huge_blocks("Node 0, zone Normal 1 2 3 4 5 6 7 8 9 2 x 5\n"), Some(2));
        // Absurd counts saturate instead of overflowing.
        let huge = format!("Node 0, zone Normal 0 0 0 0 0 0 0 0 0 0 {}\n", u64::MAX);
        assert_eq!(free_huge_blocks(&huge), Some(u64::MAX));
    }

    #[test]
    fn advises_only_when_the_free_lists_can_serve_twice_over() {
        let on = Some("always [madvise] never");
        let gib = 1 << 30;
        // 9,115 free 2 MiB blocks: 8 GiB (4,096 blocks, twice 8,192) yes, 9 GiB (twice
        // 9,216) no.
        assert!(decide(Policy::Auto, 8 * gib, on, Some(BUDDY)));
        assert!(!decide(Policy::Auto, 9 * gib, on, Some(BUDDY)));
        assert!(!decide(Policy::Auto, gib, Some("always madvise [never]"), Some(BUDDY)));
        assert!(!decide(Policy::Auto, gib, None, Some(BUDDY)));
        assert!(!decide(Policy::Auto, gib, on, None));
        assert!(!decide(Policy::Auto, 1 << 20, on, Some(BUDDY)), "small mappings stay on small pages");
        assert!(!decide(Policy::Off, gib, on, Some(BUDDY)));
        assert!(thp_enabled("[always] madvise never"));
    }
}
