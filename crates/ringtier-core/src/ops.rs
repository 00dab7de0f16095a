//! Whole-object helpers over any [`Tier`]: write a byte slice, read an object back.

use crate::buf::{direct_span, AlignedBuf};
use crate::error::{Error, ErrorKind, Operation, Result};
use crate::tier::{ObjectMeta, Tier};

/// Default chunk size of [`put`] and [`get`]: 1 MiB.
pub const DEFAULT_CHUNK: usize = 1 << 20;

/// Writes `data` as object `key` in chunks of `chunk` bytes and commits it.
/// On any error the staged object is aborted and nothing becomes visible.
pub async fn put(tier: &dyn Tier, key: &str, data: &[u8], chunk: usize) -> Result<ObjectMeta> {
    let align = tier.capabilities().alignment.max(1);
    let chunk = crate::buf::align_up(chunk.max(1) as u64, align as u64) as usize;
    let mut writer = tier.create(key).await?;
    let mut buf = AlignedBuf::new(chunk.min(data.len().max(1)), align)?;
    let mut offset = 0usize;
    while offset < data.len() {
        let n = chunk.min(data.len() - offset);
        buf.fill_from(&data[offset..offset + n])?;
        let (res, b) = writer.write_at(offset as u64, buf).await;
        buf = b;
        if let Err(e) = res {
            let _ = writer.abort().await;
            return Err(e);
        }
        offset += n;
    }
    writer.commit().await
}

/// Reads `[offset, offset + len)` of `key` completely, looping over short reads.
/// Stops early only at the end of the object.
pub async fn read_exact_at(tier: &dyn Tier, key: &str, offset: u64, len: usize) -> Result<Vec<u8>> {
    let align = tier.capabilities().alignment.max(1) as u64;
    let mut out = Vec::with_capacity(len);
    let chunk = DEFAULT_CHUNK.min(len.max(1));
    let (_, span, _) = direct_span(0, chunk, align);
    let mut buf = AlignedBuf::new(span + align as usize, align as usize)?;
    while out.len() < len {
        let pos = offset + out.len() as u64;
        let want = chunk.min(len - out.len());
        let (res, b) = tier.read_at(key, pos, want, buf).await;
        buf = b;
        let n = res?;
        if n == 0 {
            break;
        }
        out.extend_from_slice(buf.as_slice());
    }
    Ok(out)
}

/// Reads a whole object.
pub async fn get(tier: &dyn Tier, key: &str) -> Result<Vec<u8>> {
    let meta = tier.stat(key).await?;
    let size = usize::try_from(meta.size).map_err(|_| {
        Error::new(ErrorKind::InvalidInput, "object too large for memory").with_operation(Operation::Read)
    })?;
    let data = read_exact_at(tier, key, 0, size).await?;
    if data.len() != size {
        return Err(Error::new(
            ErrorKind::Corrupt,
            format!("object shrank while reading: {} of {size} bytes", data.len()),
        )
        .context(Operation::Read, key, tier.name()));
    }
    Ok(data)
}
