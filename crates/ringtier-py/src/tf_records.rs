//! TFRecord and raw-file epochs for TensorFlow's batch op (`ringtier/_tf_op.cc`, built and
//! loaded by `ringtier._tf_op`): the op makes each batch's `tf.string` tensor itself, one copy
//! per record or file from the loader's memory into TensorFlow's strings, on tf.data's thread,
//! with no Python and no GIL between them, and an `int64` tensor of the samples' indices.
//!
//! Python starts an epoch with `RecordLoader._tf_epoch` or `Loader._tf_epoch` (a token into this
//! process's table);
//! the op, linked against this extension, calls [`ringtier_tf_next_records`] with the token
//! for each batch. An entry leaves the table at the end of its epoch, at its first error, or
//! by `_tf_release` (an iterator dropped before its end). Tokens are never reused, and a
//! token from another process (the table inherited through `fork`) is refused.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use pyo3::prelude::*;
use ringtier_core::error::{Error, ErrorKind};

use crate::engine::Engine;
use crate::records::RecordEpochState;

/// What an epoch in the table reads.
#[derive(Debug)]
enum EpochKind {
    /// TFRecord records (a batch: up to the op's `max_records`).
    Records(RecordEpochState),
    /// Raw files (a batch: the loader's own batch of `batch_size` files).
    Files { engine: Arc<Engine>, epoch: ringtier_loader::Epoch },
}

/// An epoch in the table: its state, used by one op call at a time, in the process that
/// made it.
#[derive(Debug)]
struct TfEpoch {
    pid: u32,
    state: Mutex<EpochKind>,
}

/// Tokens to epochs.
type Table = HashMap<u64, Arc<TfEpoch>>;

fn table() -> MutexGuard<'static, Table> {
    static TABLE: OnceLock<Mutex<Table>> = OnceLock::new();
    // A panic while the table's lock was held left a map that is still whole (each change is
    // one insert or remove): keep using it.
    TABLE.get_or_init(Default::default).lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Puts a record epoch in the table; its token.
pub(crate) fn register(state: RecordEpochState) -> u64 {
    insert(EpochKind::Records(state))
}

/// Puts a raw-file epoch (read on `engine`) in the table; its token.
pub(crate) fn register_files(engine: Arc<Engine>, epoch: ringtier_loader::Epoch) -> u64 {
    insert(EpochKind::Files { engine, epoch })
}

fn insert(kind: EpochKind) -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let token = NEXT.fetch_add(1, Ordering::Relaxed);
    let entry = Arc::new(TfEpoch { pid: std::process::id(), state: Mutex::new(kind) });
    table().insert(token, entry);
    token
}

/// Takes `token`'s epoch out of the table (its reads stop once an op call in progress, if
/// any, returns); whether it was there. An epoch inherited through `fork` is left alone:
/// dropping it would wait for the parent's threads.
fn release(token: u64) -> bool {
    let Some(entry) = table().remove(&token) else { return false };
    if entry.pid != std::process::id() {
        std::mem::forget(entry);
    }
    true
}

/// Ends the TensorFlow epoch `token` (an iterator dropped before the end of its epoch):
/// whether it was still open. Called by `ringtier._tf_op`.
#[pyfunction]
pub(crate) fn _tf_release(py: Python<'_>, token: u64) -> bool {
    // Dropping an epoch waits for its reads in flight: without the GIL.
    py.detach(|| release(token))
}

/// TensorFlow epochs open in this process (for tests and leaks).
#[pyfunction]
pub(crate) fn _tf_open_epochs() -> usize {
    let pid = std::process::id();
    table().values().filter(|e| e.pid == pid).count()
}

/// What the op's sink is given: `n` samples of `lens[i]` bytes and their indices (a file's
/// index in the dataset; a record's `shard << 40 | byte offset`); it makes the output tensors
/// and writes each sample's destination (`lens[i]` writable bytes that stay valid until the
/// call returns) to `out[i]`; 0 for success, anything else to stop (the op keeps its error).
pub(crate) type RecordSink = unsafe extern "C" fn(
    ctx: *mut c_void,
    n: usize,
    lens: *const usize,
    indices: *const i64,
    out: *mut *mut u8,
) -> c_int;

/// [`ringtier_tf_next_records`]: a batch of records was given to the sink.
const NEXT_RECORDS: c_int = 0;
/// The epoch is over (the sink was not called; the token is released).
const NEXT_END: c_int = 1;
/// The sink refused (its own error stands).
const NEXT_SINK_FAILED: c_int = 2;

/// The op's error codes for a ringtier error (the message names the kind as well): TensorFlow's
/// `InvalidArgument`, `NotFound`, `DataLoss`, `PermissionDenied`, `ResourceExhausted`,
/// `Unavailable`, `Unknown`.
fn code_of(kind: ErrorKind) -> c_int {
    match kind {
        ErrorKind::InvalidInput | ErrorKind::InvalidKey | ErrorKind::Misaligned | ErrorKind::OutOfRange => -1,
        ErrorKind::NotFound => -2,
        ErrorKind::Corrupt => -3,
        ErrorKind::PermissionDenied => -4,
        ErrorKind::ResourceExhausted | ErrorKind::NoSpace => -5,
        ErrorKind::Shutdown | ErrorKind::Busy => -6,
        _ => -7,
    }
}

/// Writes `message` into the caller's `err` buffer of `cap` bytes, cut to fit, NUL-ended.
///
/// # Safety
/// `err` is NULL or points to `cap` writable bytes.
unsafe fn write_message(err: *mut c_char, cap: usize, message: &str) {
    if err.is_null() || cap == 0 {
        return;
    }
    let mut n = message.len().min(cap - 1);
    while !message.is_char_boundary(n) {
        n -= 1;
    }
    // SAFETY: the caller gives `cap` writable bytes at `err`; `n + 1 <= cap` are written, from
    // `message`, which does not overlap them (it is this function's own string).
    unsafe {
        std::ptr::copy_nonoverlapping(message.as_ptr(), err.cast::<u8>(), n);
        *err.add(n) = 0;
    }
}

/// The next batch of epoch `token` (records: up to `max_records`; files: the loader's batch),
/// for the op: the sink is called once with the samples' lengths and indices, and each
/// sample's bytes (a record's fields end to end) are copied to the destinations it gives. Blocks the calling thread until the records are
/// read (TensorFlow's thread; never a thread of the engine). Returns 0 (records given), 1
/// (the epoch is over: the token is released), 2 (the sink refused), or a negative error code
/// (see `code_of`) with its message in `err` (the epoch is released: it failed there).
///
/// # Safety
/// `sink` is a function as [`RecordSink`] describes, `ctx` what it expects; `err` is NULL or
/// points to `err_cap` writable bytes. Called by the op from `_tf_op.cc` only.
#[no_mangle]
pub(crate) unsafe extern "C" fn ringtier_tf_next_records(
    token: u64,
    max_records: usize,
    sink: RecordSink,
    ctx: *mut c_void,
    err: *mut c_char,
    err_cap: usize,
) -> c_int {
    let run = AssertUnwindSafe(|| {
        // SAFETY: the contract of this function, passed on.
        unsafe { next_records(token, max_records, sink, ctx) }
    });
    let failed = match catch_unwind(run) {
        Ok(Ok(code)) => return code,
        Ok(Err((code, message))) => (code, message),
        Err(_) => (-7, "ringtier: the batch op's read panicked (a bug; the epoch is ended)".to_string()),
    };
    release(token);
    // SAFETY: the caller's contract for `err` and `err_cap`.
    unsafe { write_message(err, err_cap, &failed.1) };
    failed.0
}

/// [`ringtier_tf_next_records`] without the panic guard: `Err((code, message))` on failure.
///
/// # Safety
/// As for [`ringtier_tf_next_records`].
unsafe fn next_records(
    token: u64,
    max_records: usize,
    sink: RecordSink,
    ctx: *mut c_void,
) -> Result<c_int, (c_int, String)> {
    if max_records == 0 {
        return Err((-1, "ringtier: max_records must be at least 1".into()));
    }
    let entry = table().get(&token).cloned().ok_or_else(|| {
        (
            -1,
            format!(
                "ringtier: TensorFlow epoch {token} is not open in this process (it ended, was released by its \
                 dataset when a newer iteration of it began or by Source.close(), or was opened in another \
                 process); to iterate one dataset twice at once, make a second dataset from the same path"
            ),
        )
    })?;
    if entry.pid != std::process::id() {
        return Err((-1, format!("ringtier: TensorFlow epoch {token} was opened in another process")));
    }
    let mut st = entry.state.lock().map_err(|_| (-7, "ringtier: the epoch failed in an earlier call".into()))?;
    let failed = |e: Error| (code_of(e.kind()), format!("ringtier: {e}"));
    // Each sample as (its index, its pieces end to end).
    let (indices, pieces): (Vec<i64>, Vec<Vec<&[u8]>>);
    let records;
    let files;
    match &mut *st {
        EpochKind::Records(state) => {
            records = state.next_batch_blocking(max_records).map_err(failed)?;
            indices = records.records().iter().map(|r| ((r.shard as i64) << 40) | r.offset as i64).collect();
            pieces = records.records().iter().map(|r| r.fields.iter().map(|f| f.data.as_slice()).collect()).collect();
        }
        EpochKind::Files { engine, epoch } => {
            // A batch whose samples were all skipped (on_bad="skip") is passed over: an empty
            // tensor ends the epoch.
            files = loop {
                match engine.handle().block_on(epoch.next()) {
                    None => break None,
                    Some(Err(e)) => return Err(failed(e)),
                    Some(Ok(b)) if b.samples.is_empty() => continue,
                    Some(Ok(b)) => break Some(b),
                }
            };
            let Some(batch) = &files else {
                drop(st);
                release(token);
                return Ok(NEXT_END);
            };
            indices = batch.indices.iter().map(|&i| i64::from(i)).collect();
            pieces = batch.samples.iter().map(|s| vec![s.as_slice()]).collect();
        }
    }
    if pieces.is_empty() {
        drop(st);
        release(token);
        return Ok(NEXT_END);
    }
    let lens: Vec<usize> = pieces.iter().map(|p| p.iter().map(|d| d.len()).sum()).collect();
    let mut out: Vec<*mut u8> = vec![std::ptr::null_mut(); pieces.len()];
    // SAFETY: `lens`, `indices` and `out` hold `pieces.len()` entries each and live across the
    // call; the sink's contract is the caller's.
    if unsafe { sink(ctx, pieces.len(), lens.as_ptr(), indices.as_ptr(), out.as_mut_ptr()) } != 0 {
        return Ok(NEXT_SINK_FAILED);
    }
    for ((parts, &len), &dest) in pieces.iter().zip(&lens).zip(&out) {
        if len == 0 {
            continue;
        }
        if dest.is_null() {
            return Err((-7, "ringtier: the op gave no destination for a sample".into()));
        }
        // SAFETY: the sink gave `dest` as `len` writable bytes, valid until this call returns
        // and written by nothing else meanwhile (RecordSink's contract).
        let to = unsafe { std::slice::from_raw_parts_mut(dest, len) };
        let mut at = 0;
        for d in parts {
            to[at..at + d.len()].copy_from_slice(d);
            at += d.len();
        }
    }
    Ok(NEXT_RECORDS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_cut_at_a_character_and_ended() {
        let mut buf = [0x55 as c_char; 6];
        // SAFETY: `buf` holds 6 writable bytes.
        unsafe { write_message(buf.as_mut_ptr(), buf.len(), "ab\u{e9}cd") };
        let got: Vec<u8> = buf.iter().map(|&c| c as u8).collect();
        assert_eq!(&got[..5], "ab\u{e9}c".as_bytes());
        assert_eq!(got[5], 0);
        let mut small = [0x55 as c_char; 3];
        // SAFETY: `small` holds 3 writable bytes.
        unsafe { write_message(small.as_mut_ptr(), small.len(), "\u{e9}\u{e9}") };
        assert_eq!(small[0] as u8, 0xc3);
        assert_eq!(small[1] as u8, 0xa9);
        assert_eq!(small[2], 0);
    }

    #[test]
    fn unknown_tokens_are_refused_with_a_message() {
        unsafe extern "C" fn never(_: *mut c_void, _: usize, _: *const usize, _: *const i64, _: *mut *mut u8) -> c_int {
            panic!("the sink must not be called for an unknown token")
        }
        let mut err = [0 as c_char; 256];
        // SAFETY: `err` holds 256 writable bytes; the sink is never called.
        let code = unsafe { ringtier_tf_next_records(u64::MAX, 8, never, std::ptr::null_mut(), err.as_mut_ptr(), 256) };
        assert_eq!(code, -1);
        let message: Vec<u8> = err.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
        assert!(String::from_utf8_lossy(&message).contains("not open in this process"));
        assert!(!release(u64::MAX));
    }
}
