//! A path's findings: its file system, O_DIRECT and its alignment, durability, free space,
//! and whether it is writable; a missing path is looked at where it would be created.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use ringtier_core::fs::{dio_align_of_fd, fs_type_name, is_durable_fs, space_of_fd};
use ringtier_core::Space;
use serde_json::{json, Value};

use super::{format_bytes, Finding, Status};

/// `path`: one path's file system, O_DIRECT, durability, free space and writability.
pub(super) fn path(p: &Path) -> (Finding, Value) {
    let shown = p.display().to_string();
    let mut fact = json!({ "path": shown });
    let finding = |status, text: String| Finding { topic: "path", status, text, path: Some(p.to_path_buf()) };

    let meta = match std::fs::metadata(p) {
        Ok(m) => Some(m),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => {
            fact["exists"] = Value::Null;
            return (finding(Status::Warn, format!("{shown}: cannot be examined: {e}")), fact);
        }
    };
    fact["exists"] = json!(meta.is_some());
    // A missing path is created on first use (a checkpoint tier): look at where it would be.
    let (probed, mut text, mut status) = match &meta {
        Some(_) => (p.to_path_buf(), format!("{shown}: "), Status::Ok),
        None => {
            let Some(anc) = nearest_existing_ancestor(p) else {
                return (finding(Status::Warn, format!("{shown}: does not exist, nor does any parent")), fact);
            };
            fact["probed"] = json!(anc.display().to_string());
            let text = format!("{shown}: does not exist (a tier creates it), on {}: ", anc.display());
            (anc, text, Status::Note)
        }
    };
    let is_dir = meta.as_ref().is_none_or(|m| m.is_dir());
    fact["kind"] = json!(match &meta {
        None => "missing",
        Some(m) if m.is_dir() => "directory",
        Some(m) if m.is_file() => "file",
        Some(_) => "other",
    });

    let fs_type = fs_type_name(&probed);
    let durable = is_durable_fs(&probed);
    fact["fs_type"] = json!(fs_type);
    fact["durable"] = json!(durable);
    text += fs_type;
    if durable {
        text += ", durable";
    } else {
        text += ", not durable (held in memory: checkpoints there are lost at reboot)";
        status = status.max(Status::Note);
    }

    // Writability and the O_DIRECT alignment of a file there.
    let probe = if is_dir { probe_dir(&probed) } else { probe_file(&probed) };
    fact["writable"] = json!(probe.writable.is_ok());
    match probe.dio {
        Some((mem, off)) if mem > 0 && off > 0 => {
            fact["direct_io"] = json!({ "mem_align": mem, "offset_align": off });
            text += &format!(", O_DIRECT (alignment: memory {mem} B, offset {off} B{})", probe.dio_from);
        }
        Some(_) => {
            fact["direct_io"] = Value::Null;
            text += &format!(
                ", no O_DIRECT alignment reported (statx DIOALIGN{}): reads and writes go through the page cache",
                probe.dio_from
            );
            status = status.max(Status::Note);
        }
        None => {
            fact["direct_io"] = Value::Null;
            text += ", O_DIRECT not probed (no file to ask)";
        }
    }
    match &probe.writable {
        Ok(()) => text += ", writable",
        Err(e) => {
            text += &format!(", not writable ({e})");
            // A dataset may be read-only; a tier that must be created cannot be.
            status = status.max(if meta.is_none() { Status::Warn } else { Status::Note });
        }
    }

    // Free space.
    match File::open(&probed).map_err(ringtier_core::Error::from).and_then(|f| space_of_fd(f.as_raw_fd())) {
        Ok(Space { total_bytes: 0, .. }) => {
            fact["free_bytes"] = Value::Null;
            fact["total_bytes"] = Value::Null;
            text += ", no free space reported (a pseudo file system)";
        }
        Ok(Space { free_bytes, total_bytes }) => {
            fact["free_bytes"] = json!(free_bytes);
            fact["total_bytes"] = json!(total_bytes);
            text += &format!(", {} free of {}", format_bytes(free_bytes), format_bytes(total_bytes));
            if free_bytes < LOW_SPACE_BYTES {
                text += ": nearly full";
                status = Status::Warn;
            }
        }
        Err(e) => {
            fact["free_bytes"] = Value::Null;
            fact["total_bytes"] = Value::Null;
            text += &format!(", free space unknown ({e})");
        }
    }
    (finding(status, text), fact)
}

/// Free space below which a path warns.
const LOW_SPACE_BYTES: u64 = 1 << 30;

/// What creating (or opening) a file at a path told.
struct FileProbe {
    /// Whether a file could be created there (or, for a file, opened for writing).
    writable: Result<(), String>,
    /// `statx(STATX_DIOALIGN)` of that file: `(mem_align, offset_align)`, zeros where not
    /// reported; `None` where there was no file to ask.
    dio: Option<(u32, u32)>,
    /// Where the alignment was read from, where not from a new file (`", of FILE"`).
    dio_from: String,
}

/// A directory: an unnamed temporary file there (`O_TMPFILE`, as the io_uring tier probes),
/// else a named one removed at once, else (read-only) the first regular file in it.
fn probe_dir(dir: &Path) -> FileProbe {
    let tmpfile = OpenOptions::new().read(true).write(true).mode(0o600).custom_flags(libc::O_TMPFILE).open(dir);
    let created = match tmpfile {
        Ok(f) => Ok(f),
        // Refused for this user or this mount: a named file would be too.
        Err(e) if matches!(e.raw_os_error(), Some(libc::EROFS | libc::EACCES | libc::EPERM)) => Err(e),
        // No O_TMPFILE on this file system (EOPNOTSUPP, EISDIR, ...): a named file.
        Err(_) => {
            let name = dir.join(format!(".ringtier-doctor-{}", std::process::id()));
            let f = OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(&name);
            let _ = std::fs::remove_file(&name);
            f
        }
    };
    match created {
        Ok(f) => FileProbe { writable: Ok(()), dio: dio_of(&f), dio_from: String::new() },
        Err(e) => {
            let existing = std::fs::read_dir(dir).ok().and_then(|entries| {
                entries
                    .take(256)
                    .filter_map(|e| e.ok())
                    .find(|e| e.file_type().is_ok_and(|t| t.is_file()))
                    .map(|e| e.path())
            });
            let (dio, dio_from) = match existing.and_then(|p| File::open(&p).ok().map(|f| (p, f))) {
                Some((p, f)) => (dio_of(&f), format!(", of {}", p.display())),
                None => (None, String::new()),
            };
            FileProbe { writable: Err(describe(&e)), dio, dio_from }
        }
    }
}

/// A file: opened for writing (nothing is written) and read.
fn probe_file(file: &Path) -> FileProbe {
    let writable = OpenOptions::new().write(true).open(file).map(|_| ()).map_err(|e| describe(&e));
    let dio = File::open(file).ok().and_then(|f| dio_of(&f));
    FileProbe { writable, dio, dio_from: String::new() }
}

fn dio_of(f: &File) -> Option<(u32, u32)> {
    dio_align_of_fd(f.as_raw_fd()).ok()
}

fn describe(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::EROFS) => "read-only file system".to_string(),
        Some(libc::EACCES) | Some(libc::EPERM) => "permission denied".to_string(),
        _ => e.to_string(),
    }
}

/// The nearest ancestor of `p` that exists (`.` for a relative path with none).
fn nearest_existing_ancestor(p: &Path) -> Option<PathBuf> {
    p.ancestors()
        .skip(1)
        .map(|a| if a.as_os_str().is_empty() { Path::new(".") } else { a })
        .find(|a| a.exists())
        .map(Path::to_path_buf)
}
