//! [`FileBody`]: a GetObject body read from the object's file in large blocks.
//!
//! s3s-fs 0.14 streams a GetObject body through tokio's file in 4 KiB reads, each one a hop
//! to tokio's blocking pool and back: about 10 CPU-seconds per GiB on the server, which then
//! bounds every client on a machine it shares (0.1 GB/s on 2 cores). This body reads the same
//! bytes with positioned reads of [`FileBody::BLOCK`] bytes, one blocking-pool hop each.

use std::fs::File;
use std::future::Future;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::Stream;
use hyper::body::Bytes;
use s3s::stream::{ByteStream, RemainingLength};
use s3s::StdError;

/// The bytes `offset..offset + len` of an open file, as a stream of blocks of at most
/// [`FileBody::BLOCK`] bytes, each read on tokio's blocking pool. A file that ends early
/// (replaced or truncated while it is served) ends the stream with an error, never with
/// fewer bytes than announced.
pub(crate) struct FileBody {
    file: Arc<File>,
    offset: u64,
    remaining: u64,
    pending: Option<tokio::task::JoinHandle<std::io::Result<Bytes>>>,
}

impl FileBody {
    /// Bytes per read (and per body frame): 1 MiB.
    pub(crate) const BLOCK: u64 = 1 << 20;

    /// The body of `len` bytes of `file` from `offset`.
    pub(crate) fn new(file: File, offset: u64, len: u64) -> Self {
        FileBody { file: Arc::new(file), offset, remaining: len, pending: None }
    }
}

/// The file s3s-fs keeps `bucket`/`key` in under `root`, or None where the key is one this
/// shortcut does not resolve the way s3s-fs does (a `..`, `.` or absolute component): the
/// caller then serves s3s-fs's own body.
pub(crate) fn object_file(root: &Path, bucket: &str, key: &str) -> Option<PathBuf> {
    let plain = |s: &str| s.split('/').all(|seg| !matches!(seg, "" | "." | ".."));
    (plain(bucket) && !bucket.contains('/') && plain(key)).then(|| root.join(bucket).join(key))
}

impl Stream for FileBody {
    type Item = Result<Bytes, StdError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.remaining == 0 {
            return Poll::Ready(None);
        }
        let task = this.pending.get_or_insert_with(|| {
            let (file, offset, n) = (Arc::clone(&this.file), this.offset, this.remaining.min(Self::BLOCK));
            tokio::task::spawn_blocking(move || {
                // Bounded by BLOCK: at most 1 MiB allocated per read.
                let mut buf = vec![0u8; n as usize];
                let mut got = 0;
                while got < buf.len() {
                    match file.read_at(&mut buf[got..], offset + got as u64) {
                        Ok(0) => break,
                        Ok(k) => got += k,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e),
                    }
                }
                buf.truncate(got);
                Ok(Bytes::from(buf))
            })
        });
        let res = match Pin::new(task).poll(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(r) => r,
        };
        this.pending = None;
        let block = match res {
            Ok(Ok(b)) => b,
            Ok(Err(e)) => return Poll::Ready(Some(Err(Box::new(e)))),
            Err(e) => return Poll::Ready(Some(Err(Box::new(std::io::Error::other(e))))),
        };
        if block.is_empty() {
            this.remaining = 0;
            let e = std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the object's file ended early");
            return Poll::Ready(Some(Err(Box::new(e))));
        }
        this.offset += block.len() as u64;
        this.remaining -= block.len() as u64;
        Poll::Ready(Some(Ok(block)))
    }
}

impl ByteStream for FileBody {
    fn remaining_length(&self) -> RemainingLength {
        RemainingLength::new_exact(usize::try_from(self.remaining).unwrap_or(usize::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    #[test]
    fn object_file_refuses_what_s3s_fs_would_resolve_otherwise() {
        let root = Path::new("/srv");
        assert_eq!(object_file(root, "b", "a/c.bin"), Some(PathBuf::from("/srv/b/a/c.bin")));
        for (b, k) in [
            ("b", "../x"),
            ("b", "a/./c"),
            ("b", "/abs"),
            ("", "k"),
            ("b", ""),
            ("..", "k"),
            ("b", "d/"),
            ("b", "a//c"),
            ("b/c", "k"),
        ] {
            assert_eq!(object_file(root, b, k), None, "{b:?} {k:?}");
        }
    }

    #[test]
    fn reads_the_range_in_blocks_and_fails_on_a_short_file() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("o");
        let data: Vec<u8> = (0..(3 * FileBody::BLOCK as usize + 123)).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&path, &data).expect("write");
        rt.block_on(async {
            let body = FileBody::new(File::open(&path).expect("open"), 5, data.len() as u64 - 10);
            assert_eq!(body.remaining_length().exact(), Some(data.len() - 10));
            let frames: Vec<Bytes> = body.map(|r| r.expect("frame")).collect().await;
            assert_eq!(frames.len(), 4);
            assert!(frames.iter().all(|f| f.len() as u64 <= FileBody::BLOCK));
            assert_eq!(frames.concat(), &data[5..data.len() - 5]);
            // Announced past the end: an error after the bytes there are.
            let mut body = FileBody::new(File::open(&path).expect("open"), 0, data.len() as u64 + 1);
            let mut got = 0;
            let err = loop {
                match body.next().await {
                    Some(Ok(b)) => got += b.len(),
                    Some(Err(e)) => break e,
                    None => panic!("a short file ended the body without an error"),
                }
            };
            assert_eq!(got, data.len());
            assert!(err.to_string().contains("ended early"), "{err}");
            assert!(body.next().await.is_none());
        });
    }
}
