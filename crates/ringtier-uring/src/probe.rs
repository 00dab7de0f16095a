//! What the running kernel's io_uring offers: the features `io_uring_setup` reports, the
//! set-up flags the engine's knobs use (each tried on a small ring of its own), and the
//! opcodes the engine submits (`IORING_REGISTER_PROBE`). Reports record it, so a result
//! names the kernel facilities it ran with.

use io_uring::{opcode, IoUring, Probe};

/// io_uring as offered by the running kernel.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct KernelFeatures {
    /// `IORING_FEAT_*` flags reported by `io_uring_setup`, by name (`NODROP`, `EXT_ARG`, ...).
    pub features: Vec<&'static str>,
    /// Set-up flags a ring was created with when tried: `SQPOLL`, `COOP_TASKRUN`,
    /// `TASKRUN_FLAG`, `SINGLE_ISSUER`, `DEFER_TASKRUN`.
    pub setup_flags: Vec<&'static str>,
    /// The opcodes this engine submits that the kernel supports.
    pub opcodes: Vec<&'static str>,
    /// The opcodes this engine submits that the kernel does not support.
    pub missing_opcodes: Vec<&'static str>,
}

/// Sets one set-up flag on a ring builder.
type SetFlag = fn(&mut io_uring::Builder);

/// Probes the running kernel. An error when io_uring itself is unavailable (an old kernel,
/// or `io_uring_disabled` set by the administrator).
pub fn probe_kernel() -> std::io::Result<KernelFeatures> {
    let ring: IoUring = IoUring::new(4)?;
    let p = ring.params();
    let features: Vec<&'static str> = [
        ("SINGLE_MMAP", p.is_feature_single_mmap()),
        ("NODROP", p.is_feature_nodrop()),
        ("SUBMIT_STABLE", p.is_feature_submit_stable()),
        ("RW_CUR_POS", p.is_feature_rw_cur_pos()),
        ("CUR_PERSONALITY", p.is_feature_cur_personality()),
        ("FAST_POLL", p.is_feature_fast_poll()),
        ("POLL_32BITS", p.is_feature_poll_32bits()),
        ("SQPOLL_NONFIXED", p.is_feature_sqpoll_nonfixed()),
        ("EXT_ARG", p.is_feature_ext_arg()),
        ("NATIVE_WORKERS", p.is_feature_native_workers()),
        ("RSRC_TAGS", p.is_feature_resource_tagging()),
        ("CQE_SKIP", p.is_feature_skip_cqe_on_success()),
        ("LINKED_FILE", p.is_feature_linked_file()),
        ("RECVSEND_BUNDLE", p.is_feature_recvsend_bundle()),
        ("MIN_TIMEOUT", p.is_feature_min_timeout()),
        ("NO_IOWAIT", p.is_feature_no_iowait()),
    ]
    .into_iter()
    .filter_map(|(n, on)| on.then_some(n))
    .collect();

    let mut setup_flags = Vec::new();
    let tries: [(&'static str, SetFlag); 5] = [
        ("SQPOLL", |b| {
            b.setup_sqpoll(10);
        }),
        ("COOP_TASKRUN", |b| {
            b.setup_coop_taskrun();
        }),
        ("TASKRUN_FLAG", |b| {
            b.setup_coop_taskrun().setup_taskrun_flag();
        }),
        ("SINGLE_ISSUER", |b| {
            b.setup_single_issuer();
        }),
        ("DEFER_TASKRUN", |b| {
            b.setup_single_issuer().setup_defer_taskrun();
        }),
    ];
    for (name, set) in tries {
        let mut b = IoUring::builder();
        set(&mut b);
        if b.build(4).is_ok() {
            setup_flags.push(name);
        }
    }

    let mut probe = Probe::new();
    let (mut opcodes, mut missing_opcodes) = (Vec::new(), Vec::new());
    if ring.submitter().register_probe(&mut probe).is_ok() {
        for (name, code) in [
            ("READ", opcode::Read::CODE),
            ("READ_FIXED", opcode::ReadFixed::CODE),
            ("WRITE", opcode::Write::CODE),
            ("WRITE_FIXED", opcode::WriteFixed::CODE),
            ("OPENAT2", opcode::OpenAt2::CODE),
            ("STATX", opcode::Statx::CODE),
            ("CLOSE", opcode::Close::CODE),
            ("FSYNC", opcode::Fsync::CODE),
            ("ASYNC_CANCEL", opcode::AsyncCancel::CODE),
        ] {
            if probe.is_supported(code) {
                opcodes.push(name);
            } else {
                missing_opcodes.push(name);
            }
        }
    }
    Ok(KernelFeatures { features, setup_flags, opcodes, missing_opcodes })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_kernel_offers_what_the_engine_uses() {
        let f = probe_kernel().expect("io_uring");
        // The engine's reads need these (Linux 5.6+): the probe must see them.
        for op in ["READ", "OPENAT2", "STATX", "CLOSE"] {
            assert!(f.opcodes.contains(&op), "{op} missing from {f:?}");
        }
        assert!(f.features.contains(&"NODROP"), "{f:?}");
        // DEFER_TASKRUN is only offered with SINGLE_ISSUER.
        if f.setup_flags.contains(&"DEFER_TASKRUN") {
            assert!(f.setup_flags.contains(&"SINGLE_ISSUER"));
        }
    }
}
