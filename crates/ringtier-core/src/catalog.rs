//! The metric catalog: every metric the core emits, with its unit in the name and bounded
//! label values (tier name, operation, result; never a key or file name).

/// Help text and type of one metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricDef {
    /// Metric name, unit suffixed.
    pub name: &'static str,
    /// Prometheus type: `counter`, `gauge` or `histogram`.
    pub kind: &'static str,
    /// Help text.
    pub help: &'static str,
    /// Label names.
    pub labels: &'static [&'static str],
}

/// Bytes moved by tier operations.
pub const TIER_BYTES_TOTAL: &str = "ringtier_tier_bytes_total";
/// Tier operations by result.
pub const TIER_OPS_TOTAL: &str = "ringtier_tier_operations_total";
/// Latency of tier operations.
pub const TIER_OP_DURATION_SECONDS: &str = "ringtier_tier_operation_duration_seconds";
/// Time requests spent waiting in the throttled layer.
pub const THROTTLE_WAIT_SECONDS: &str = "ringtier_throttle_wait_seconds";
/// Faults injected by the fault-injecting layer.
pub const FAULTS_INJECTED_TOTAL: &str = "ringtier_faults_injected_total";
/// Files read with buffered I/O because direct I/O was not possible (policy `auto`).
pub const DIRECT_IO_FALLBACKS_TOTAL: &str = "ringtier_direct_io_fallbacks_total";
/// Requests in flight on io_uring rings.
pub const URING_IN_FLIGHT: &str = "ringtier_uring_in_flight";
/// `io_uring_enter` calls that submitted work.
pub const URING_SUBMITS_TOTAL: &str = "ringtier_uring_submits_total";
/// Submission queue entries handed to the kernel (over submits: the mean submission batch).
pub const URING_SQES_TOTAL: &str = "ringtier_uring_submitted_entries_total";
/// Buffers of buffer pools handed out.
pub const BUFFER_POOL_IN_USE: &str = "ringtier_buffer_pool_in_use_buffers";
/// Bytes of buffer pools allocated.
pub const BUFFER_POOL_BYTES: &str = "ringtier_buffer_pool_bytes";
/// Registered-buffer fallbacks (memlock too low, registration refused).
pub const URING_REGISTER_FALLBACKS_TOTAL: &str = "ringtier_uring_register_fallbacks_total";
/// Tiers opened with the thread-pool engine because io_uring was refused (engine `auto`), by
/// reason: `disabled` (sysctl `kernel.io_uring_disabled`), `refused` (EPERM: a seccomp filter
/// or LSM), `unsupported` (ENOSYS: not in this kernel), `no_memory` (ENOMEM at every ring size).
pub const ENGINE_FALLBACKS_TOTAL: &str = "ringtier_engine_fallbacks_total";

/// Time `save` kept the training loop waiting.
pub const CKPT_SAVE_BLOCKING_SECONDS: &str = "ringtier_checkpoint_save_blocking_seconds";
/// Checkpoints saved, by the tier they were written to and result.
pub const CKPT_SAVES_TOTAL: &str = "ringtier_checkpoint_saves_total";
/// Bytes of committed checkpoints not yet copied to the next tier.
pub const CKPT_DRAIN_BACKLOG_BYTES: &str = "ringtier_checkpoint_drain_backlog_bytes";
/// Checkpoints waiting for or in the drain.
pub const CKPT_PENDING: &str = "ringtier_checkpoint_drain_pending";
/// Time to drain one checkpoint to the next tier.
pub const CKPT_DRAIN_SECONDS: &str = "ringtier_checkpoint_drain_seconds";
/// Bytes copied by the drain.
pub const CKPT_DRAINED_BYTES_TOTAL: &str = "ringtier_checkpoint_drained_bytes_total";
/// Checkpoints evicted from a faster tier after their slower copy was committed.
pub const CKPT_EVICTIONS_TOTAL: &str = "ringtier_checkpoint_evictions_total";
/// Restores that fell back to a slower copy (checksum mismatch or unreadable fast copy).
pub const CKPT_RESTORE_FALLBACKS_TOTAL: &str = "ringtier_checkpoint_restore_fallbacks_total";
/// Counter: checkpoint copies quarantined (no intact copy: set aside with a reason), by tier.
pub const CKPT_QUARANTINED_TOTAL: &str = "ringtier_checkpoint_quarantined_total";
/// Counter: bad checkpoint copies replaced from an intact copy on another tier, by tier.
pub const CKPT_REPAIRS_TOTAL: &str = "ringtier_checkpoint_repairs_total";

/// Time the training loop waited for its next batch.
pub const LOADER_STALL_SECONDS: &str = "ringtier_loader_stall_seconds";
/// Batches delivered by loaders.
pub const LOADER_BATCHES_TOTAL: &str = "ringtier_loader_batches_total";
/// Samples loaders left out (unreadable, wrong size, bad checksum, undecodable).
pub const LOADER_SKIPPED_TOTAL: &str = "ringtier_loader_samples_skipped_total";
/// Time to read one batch.
pub const LOADER_READ_SECONDS: &str = "ringtier_loader_batch_read_seconds";
/// Time to decode one batch.
pub const LOADER_DECODE_SECONDS: &str = "ringtier_loader_batch_decode_seconds";

/// Reads served by a cache level in front of a slow tier.
pub const CACHE_HITS_TOTAL: &str = "ringtier_cache_hits_total";
/// Reads a cache sent to its slow tier.
pub const CACHE_MISSES_TOTAL: &str = "ringtier_cache_misses_total";
/// Bytes a cache level holds.
pub const CACHE_BYTES: &str = "ringtier_cache_bytes";
/// Copies a cache dropped (room, or a changed placement).
pub const CACHE_EVICTIONS_TOTAL: &str = "ringtier_cache_evictions_total";
/// Bytes a cache's prefetcher fetched from the slow tier.
pub const CACHE_PREFETCHED_BYTES_TOTAL: &str = "ringtier_cache_prefetched_bytes_total";
/// Bytes prefetched but evicted before anyone read them.
pub const CACHE_PREFETCH_UNUSED_BYTES_TOTAL: &str = "ringtier_cache_prefetch_unused_bytes_total";
/// How long prefetched copies waited in the cache before their first read.
pub const CACHE_PREFETCH_LEAD_SECONDS: &str = "ringtier_cache_prefetch_lead_seconds";

/// Every metric above, with its type, help and labels.
pub const CATALOG: &[MetricDef] = &[
    MetricDef {
        name: TIER_BYTES_TOTAL,
        kind: "counter",
        help: "Bytes moved by tier operations.",
        labels: &["tier", "op"],
    },
    MetricDef {
        name: TIER_OPS_TOTAL,
        kind: "counter",
        help: "Tier operations completed, by result.",
        labels: &["tier", "op", "result"],
    },
    MetricDef {
        name: TIER_OP_DURATION_SECONDS,
        kind: "histogram",
        help: "Latency of tier operations in seconds.",
        labels: &["tier", "op"],
    },
    MetricDef {
        name: THROTTLE_WAIT_SECONDS,
        kind: "histogram",
        help: "Seconds requests waited in the throttled layer.",
        labels: &["tier"],
    },
    MetricDef {
        name: FAULTS_INJECTED_TOTAL,
        kind: "counter",
        help: "Faults injected by the fault-injecting layer.",
        labels: &["tier", "fault"],
    },
    MetricDef {
        name: DIRECT_IO_FALLBACKS_TOTAL,
        kind: "counter",
        help: "Files read with buffered I/O because direct I/O was not possible.",
        labels: &["tier"],
    },
    MetricDef {
        name: URING_IN_FLIGHT,
        kind: "gauge",
        help: "Requests in flight on the io_uring rings.",
        labels: &["tier"],
    },
    MetricDef {
        name: URING_SUBMITS_TOTAL,
        kind: "counter",
        help: "io_uring_enter calls that submitted work.",
        labels: &["tier"],
    },
    MetricDef {
        name: URING_SQES_TOTAL,
        kind: "counter",
        help: "Submission queue entries handed to the kernel; over submits, the mean submission batch size.",
        labels: &["tier"],
    },
    MetricDef {
        name: BUFFER_POOL_IN_USE,
        kind: "gauge",
        help: "Buffers of the buffer pools currently handed out.",
        labels: &[],
    },
    MetricDef { name: BUFFER_POOL_BYTES, kind: "gauge", help: "Bytes allocated by buffer pools.", labels: &[] },
    MetricDef {
        name: CKPT_SAVE_BLOCKING_SECONDS,
        kind: "histogram",
        help: "Seconds a checkpoint save kept the training loop waiting.",
        labels: &["tier"],
    },
    MetricDef {
        name: CKPT_SAVES_TOTAL,
        kind: "counter",
        help: "Checkpoint saves, by the tier written to and result.",
        labels: &["tier", "result"],
    },
    MetricDef {
        name: CKPT_DRAIN_BACKLOG_BYTES,
        kind: "gauge",
        help: "Bytes of committed checkpoints not yet copied to the next tier.",
        labels: &[],
    },
    MetricDef { name: CKPT_PENDING, kind: "gauge", help: "Checkpoints waiting for or in the drain.", labels: &[] },
    MetricDef {
        name: CKPT_DRAIN_SECONDS,
        kind: "histogram",
        help: "Seconds to copy, verify and commit one checkpoint on the next tier.",
        labels: &["tier"],
    },
    MetricDef {
        name: CKPT_DRAINED_BYTES_TOTAL,
        kind: "counter",
        help: "Bytes copied to a slower tier by the drain.",
        labels: &["tier"],
    },
    MetricDef {
        name: CKPT_EVICTIONS_TOTAL,
        kind: "counter",
        help: "Checkpoints evicted from a faster tier after their slower copy was committed.",
        labels: &["tier"],
    },
    MetricDef {
        name: CKPT_RESTORE_FALLBACKS_TOTAL,
        kind: "counter",
        help: "Restores that used a slower copy because the faster one failed verification.",
        labels: &["tier"],
    },
    MetricDef {
        name: CKPT_QUARANTINED_TOTAL,
        kind: "counter",
        help: "Checkpoint copies quarantined: no intact copy anywhere, set aside with their reason.",
        labels: &["tier"],
    },
    MetricDef {
        name: CKPT_REPAIRS_TOTAL,
        kind: "counter",
        help: "Bad checkpoint copies removed and replaced from an intact copy on another tier.",
        labels: &["tier"],
    },
    MetricDef {
        name: LOADER_STALL_SECONDS,
        kind: "histogram",
        help: "Seconds the training loop waited for its next batch.",
        labels: &[],
    },
    MetricDef { name: LOADER_BATCHES_TOTAL, kind: "counter", help: "Batches delivered by loaders.", labels: &[] },
    MetricDef {
        name: LOADER_SKIPPED_TOTAL,
        kind: "counter",
        help: "Samples left out: unreadable, wrong size, bad checksum or undecodable.",
        labels: &[],
    },
    MetricDef { name: LOADER_READ_SECONDS, kind: "histogram", help: "Seconds to read one batch.", labels: &[] },
    MetricDef { name: LOADER_DECODE_SECONDS, kind: "histogram", help: "Seconds to decode one batch.", labels: &[] },
    MetricDef {
        name: CACHE_HITS_TOTAL,
        kind: "counter",
        help: "Sample reads served by a cache level (tier: ram or dir; kind: reuse, or prefetch for the first read of a prefetched copy).",
        labels: &["tier", "kind"],
    },
    MetricDef {
        name: CACHE_MISSES_TOTAL,
        kind: "counter",
        help: "Sample reads a cache sent to its slow tier.",
        labels: &["policy"],
    },
    MetricDef { name: CACHE_BYTES, kind: "gauge", help: "Bytes a cache level holds or has reserved.", labels: &["tier"] },
    MetricDef {
        name: CACHE_EVICTIONS_TOTAL,
        kind: "counter",
        help: "Cached copies dropped to make room or because the placement changed.",
        labels: &["policy"],
    },
    MetricDef {
        name: CACHE_PREFETCHED_BYTES_TOTAL,
        kind: "counter",
        help: "Bytes the clairvoyant prefetcher fetched from the slow tier.",
        labels: &[],
    },
    MetricDef {
        name: CACHE_PREFETCH_UNUSED_BYTES_TOTAL,
        kind: "counter",
        help: "Bytes prefetched but evicted before anyone read them.",
        labels: &[],
    },
    MetricDef {
        name: CACHE_PREFETCH_LEAD_SECONDS,
        kind: "histogram",
        help: "Seconds prefetched copies waited in the cache before their first read (mean per report).",
        labels: &[],
    },
    MetricDef {
        name: URING_REGISTER_FALLBACKS_TOTAL,
        kind: "counter",
        help: "Times registered buffers or files could not be used and plain ones were.",
        labels: &["tier", "what"],
    },
    MetricDef {
        name: ENGINE_FALLBACKS_TOTAL,
        kind: "counter",
        help: "Tiers opened with the thread-pool engine because io_uring was refused.",
        labels: &["reason"],
    },
];

/// Operation label values.
pub const OPS: &[&str] =
    &["stat", "list", "delete", "read", "write", "create", "commit", "abort", "read_batch", "open"];

/// Result label values.
pub const RESULTS: &[&str] = &["ok", "error"];
