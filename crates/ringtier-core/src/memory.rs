//! The memory tier: objects in a sorted map, optionally bounded in bytes.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use async_trait::async_trait;

use crate::buf::AlignedBuf;
use crate::error::{Error, ErrorKind, Operation, Result};
use crate::key::{validate_key, validate_prefix};
use crate::tier::{Adopted, Capabilities, ObjectMeta, ObjectWriter, Space, Tier};

struct Object {
    data: Arc<[u8]>,
    modified: SystemTime,
}

#[derive(Default)]
struct Inner {
    objects: RwLock<BTreeMap<String, Object>>,
}

/// Objects kept in memory. Not durable; a capacity bound makes commits past it fail with
/// [`ErrorKind::NoSpace`].
#[derive(Clone)]
pub struct MemoryTier {
    name: String,
    capacity: Option<u64>,
    inner: Arc<Inner>,
}

impl fmt::Debug for MemoryTier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryTier").field("name", &self.name).field("capacity", &self.capacity).finish()
    }
}

impl Default for MemoryTier {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryTier {
    /// An unbounded memory tier named `memory`.
    pub fn new() -> Self {
        MemoryTier { name: "memory".into(), capacity: None, inner: Arc::default() }
    }

    /// A memory tier holding at most `bytes` bytes of committed objects.
    pub fn with_capacity(bytes: u64) -> Self {
        MemoryTier { capacity: Some(bytes), ..Self::new() }
    }

    /// Renames the tier (for metrics and errors).
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Bytes held by committed objects.
    pub fn used_bytes(&self) -> u64 {
        let map = self.inner.objects.read().unwrap_or_else(|p| p.into_inner());
        map.values().map(|o| o.data.len() as u64).sum()
    }

    fn err(&self, e: Error, op: Operation, key: &str) -> Error {
        e.context(op, key, &self.name)
    }
}

#[async_trait]
impl Tier for MemoryTier {
    fn name(&self) -> &str {
        &self.name
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities { capacity_bytes: self.capacity, locks: false, ..Capabilities::default() }
    }

    async fn space(&self) -> Result<Option<Space>> {
        Ok(self.capacity.map(|cap| Space { free_bytes: cap.saturating_sub(self.used_bytes()), total_bytes: cap }))
    }

    async fn stat(&self, key: &str) -> Result<ObjectMeta> {
        validate_key(key).map_err(|e| self.err(e, Operation::Stat, key))?;
        let map = self.inner.objects.read().unwrap_or_else(|p| p.into_inner());
        match map.get(key) {
            Some(o) => Ok(ObjectMeta { key: key.to_string(), size: o.data.len() as u64, modified: Some(o.modified) }),
            None => Err(self.err(Error::new(ErrorKind::NotFound, "no such object"), Operation::Stat, key)),
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>> {
        validate_prefix(prefix).map_err(|e| self.err(e, Operation::List, prefix))?;
        let map = self.inner.objects.read().unwrap_or_else(|p| p.into_inner());
        Ok(map
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, o)| ObjectMeta { key: k.clone(), size: o.data.len() as u64, modified: Some(o.modified) })
            .collect())
    }

    async fn delete(&self, key: &str) -> Result<()> {
        validate_key(key).map_err(|e| self.err(e, Operation::Delete, key))?;
        let mut map = self.inner.objects.write().unwrap_or_else(|p| p.into_inner());
        match map.remove(key) {
            Some(_) => Ok(()),
            None => Err(self.err(Error::new(ErrorKind::NotFound, "no such object"), Operation::Delete, key)),
        }
    }

    async fn read_at(&self, key: &str, offset: u64, len: usize, mut buf: AlignedBuf) -> (Result<usize>, AlignedBuf) {
        if let Err(e) = validate_key(key) {
            return (Err(self.err(e, Operation::Read, key)), buf);
        }
        let data = {
            let map = self.inner.objects.read().unwrap_or_else(|p| p.into_inner());
            match map.get(key) {
                Some(o) => Arc::clone(&o.data),
                None => {
                    return (
                        Err(self.err(Error::new(ErrorKind::NotFound, "no such object"), Operation::Read, key)),
                        buf,
                    )
                }
            }
        };
        let res = copy_range(&data, offset, len, &mut buf).map_err(|e| self.err(e, Operation::Read, key));
        (res, buf)
    }

    /// Moves the object `from` to `key` (replacing what is there) without copying its bytes.
    async fn adopt(&self, from: &str, key: &str) -> Result<Option<Adopted>> {
        validate_key(from).map_err(|e| self.err(e, Operation::Commit, from))?;
        validate_key(key).map_err(|e| self.err(e, Operation::Commit, key))?;
        if from == key {
            let e = Error::new(ErrorKind::InvalidInput, "an object cannot be adopted under its own key");
            return Err(self.err(e, Operation::Commit, key));
        }
        let mut map = self.inner.objects.write().unwrap_or_else(|p| p.into_inner());
        let Some(obj) = map.remove(from) else {
            return Err(self.err(Error::new(ErrorKind::NotFound, "no such object"), Operation::Commit, from));
        };
        let crc32c = crc32c::crc32c(&obj.data);
        let meta = ObjectMeta { key: key.to_string(), size: obj.data.len() as u64, modified: Some(obj.modified) };
        map.insert(key.to_string(), obj);
        Ok(Some(Adopted { meta, crc32c }))
    }

    async fn create(&self, key: &str) -> Result<Box<dyn ObjectWriter>> {
        validate_key(key).map_err(|e| self.err(e, Operation::Create, key))?;
        Ok(Box::new(MemoryWriter { tier: self.clone(), key: key.to_string(), data: Vec::new() }))
    }
}

/// Copies `[offset, offset+len)` of `data`, clipped at its end, into `buf`.
pub(crate) fn copy_range(data: &[u8], offset: u64, len: usize, buf: &mut AlignedBuf) -> Result<usize> {
    let size = data.len() as u64;
    if offset > size {
        return Err(Error::new(ErrorKind::OutOfRange, format!("offset {offset} is past the end ({size} bytes)")));
    }
    if len > buf.capacity() {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!("buffer of {} bytes is too small for a {len}-byte read", buf.capacity()),
        ));
    }
    let n = len.min((size - offset) as usize);
    let start = offset as usize;
    buf.capacity_mut()[..n].copy_from_slice(&data[start..start + n]);
    buf.set_window(0, n)?;
    Ok(n)
}

struct MemoryWriter {
    tier: MemoryTier,
    key: String,
    data: Vec<u8>,
}

impl fmt::Debug for MemoryWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryWriter").field("key", &self.key).field("len", &self.data.len()).finish()
    }
}

#[async_trait]
impl ObjectWriter for MemoryWriter {
    fn key(&self) -> &str {
        &self.key
    }

    async fn write_at(&mut self, offset: u64, buf: AlignedBuf) -> (Result<()>, AlignedBuf) {
        let src = buf.as_slice();
        let end = offset as usize + src.len();
        if let Some(cap) = self.tier.capacity {
            if end as u64 > cap {
                let e =
                    Error::from_errno(libc::ENOSPC, format!("object would exceed the tier capacity of {cap} bytes"));
                return (Err(self.tier.err(e, Operation::Write, &self.key)), buf);
            }
        }
        if self.data.len() < end {
            self.data.resize(end, 0);
        }
        self.data[offset as usize..end].copy_from_slice(src);
        (Ok(()), buf)
    }

    async fn commit(self: Box<Self>) -> Result<ObjectMeta> {
        let MemoryWriter { tier, key, data } = *self;
        let mut map = tier.inner.objects.write().unwrap_or_else(|p| p.into_inner());
        if let Some(cap) = tier.capacity {
            let used: u64 = map.iter().filter(|(k, _)| **k != key).map(|(_, o)| o.data.len() as u64).sum();
            if used + data.len() as u64 > cap {
                let e = Error::from_errno(libc::ENOSPC, format!("tier capacity of {cap} bytes is full"));
                return Err(tier.err(e, Operation::Commit, &key));
            }
        }
        let modified = SystemTime::now();
        let size = data.len() as u64;
        map.insert(key.clone(), Object { data: data.into(), modified });
        Ok(ObjectMeta { key, size, modified: Some(modified) })
    }

    async fn abort(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}
