//! Writing safetensors files through a [`Tier`]'s staged writer: the bytes the `safetensors`
//! package writes for the same tensors, streamed through two aligned buffers (one filled while
//! the other is written), committed the tier's way (file tiers: data fsync, atomic rename,
//! directory fsync; S3: the multipart upload completed).

use std::collections::BTreeMap;

use ringtier_core::buf::align_up;
use ringtier_core::error::{Error, ErrorKind, Result};
use ringtier_core::{AlignedBuf, ObjectMeta, Tier};

use crate::dtype::Dtype;
use crate::header::{Layout, TensorSpec};
use crate::index::ShardIndex;

/// A tensor to save: name, dtype, shape and its bytes (little-endian, C order).
#[derive(Debug, Clone, Copy)]
pub struct TensorRef<'a> {
    /// Name, unique in the file.
    pub name: &'a str,
    /// Element type.
    pub dtype: Dtype,
    /// Shape (for [`Dtype::F4`], the last dimension counts elements, two per byte).
    pub shape: &'a [u64],
    /// The bytes: exactly what dtype and shape make.
    pub data: &'a [u8],
}

/// How a file is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SaveOptions {
    /// Bytes per write (rounded up to the tier's alignment; two buffers of it exist while a
    /// file is written). Default 16 MiB.
    pub chunk_bytes: usize,
}

impl Default for SaveOptions {
    fn default() -> Self {
        SaveOptions { chunk_bytes: 16 << 20 }
    }
}

impl SaveOptions {
    /// Sets [`SaveOptions::chunk_bytes`].
    pub fn with_chunk_bytes(mut self, chunk_bytes: usize) -> Self {
        self.chunk_bytes = chunk_bytes;
        self
    }
}

/// The bytes of a file in order: the header, then each tensor's data.
struct Source<'a> {
    pieces: Vec<&'a [u8]>,
    piece: usize,
    at: usize,
}

impl Source<'_> {
    /// Copies the next bytes into `buf` (at most its capacity), setting its window; the count.
    fn fill(&mut self, buf: &mut AlignedBuf, cap: usize) -> usize {
        let mut n = 0;
        let dest = buf.capacity_mut();
        while n < cap && self.piece < self.pieces.len() {
            let p = self.pieces[self.piece];
            let k = (p.len() - self.at).min(cap - n);
            dest[n..n + k].copy_from_slice(&p[self.at..self.at + k]);
            n += k;
            self.at += k;
            if self.at == p.len() {
                self.piece += 1;
                self.at = 0;
            }
        }
        // `n <= cap <= capacity`: cannot fail.
        let _ = buf.set_window(0, n);
        n
    }
}

/// Saves `tensors` (and the free-form `metadata`) as object `key` of `tier`: the same bytes
/// `safetensors.torch.save_file` writes for them (tensors sorted by dtype, widest first, then
/// name; the header padded with spaces to 8 bytes). Visible only once durable (see
/// [`ringtier_core::ObjectWriter::commit`]); on any error the staged object is discarded and
/// an earlier object under `key` stays as it was.
pub async fn save(
    tier: &dyn Tier,
    key: &str,
    tensors: &[TensorRef<'_>],
    metadata: Option<&BTreeMap<String, String>>,
    opts: &SaveOptions,
) -> Result<ObjectMeta> {
    let specs: Vec<TensorSpec> = tensors
        .iter()
        .map(|t| TensorSpec {
            name: t.name.to_string(),
            dtype: t.dtype,
            shape: t.shape.to_vec(),
            byte_len: t.data.len() as u64,
        })
        .collect();
    let layout = Layout::plan(&specs, metadata).map_err(|e| e.with_key(key.to_string()))?;
    let mut pieces = Vec::with_capacity(tensors.len() + 1);
    pieces.push(layout.prefix.as_slice());
    pieces.extend(layout.order.iter().map(|&i| tensors[i].data));
    let total: u64 = pieces.iter().map(|p| p.len() as u64).sum();
    let align = tier.capabilities().alignment.max(4096);
    let cap = align_up(opts.chunk_bytes.max(align) as u64, align as u64) as usize;
    let cap = cap.min(align_up(total.max(1), align as u64) as usize);
    let mut src = Source { pieces, piece: 0, at: 0 };
    let mut cur = AlignedBuf::new(cap, align)?;
    let mut next = AlignedBuf::new(cap, align)?;
    let mut writer = tier.create(key).await?;
    let mut offset = 0u64;
    let mut n = src.fill(&mut cur, cap);
    while n > 0 {
        // The next chunk is copied while this one is written.
        let (res, back) = {
            let write = writer.write_at(offset, cur);
            let fill = async { src.fill(&mut next, cap) };
            let ((res, back), filled) = futures_util::future::join(write, fill).await;
            offset += n as u64;
            n = filled;
            (res, back)
        };
        if let Err(e) = res {
            let _ = writer.abort().await;
            return Err(e);
        }
        cur = next;
        next = back;
    }
    if offset != total {
        let _ = writer.abort().await;
        return Err(Error::new(ErrorKind::Io, format!("wrote {offset} of {total} bytes")).with_key(key.to_string()));
    }
    writer.commit().await
}

/// The index file of a sharded model, as Hugging Face names it.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// What [`save_sharded`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardedSave {
    /// The shard keys, in order.
    pub files: Vec<String>,
    /// The index's key (`None` for a model that fit in one file, saved as
    /// `{prefix}.safetensors` without an index, as `huggingface_hub` does).
    pub index: Option<String>,
    /// Bytes of tensor data in all (the index's `metadata.total_size`).
    pub total_size: u64,
}

/// Groups tensors (indexes into `sizes`, in the given order) into shards of at most
/// `max_shard_bytes` of data each, as `huggingface_hub`'s `split_state_dict_into_shards` does: a
/// tensor that does not fit in the current shard starts the next; a tensor larger than the
/// limit gets a shard of its own.
pub fn plan_shards(sizes: &[u64], max_shard_bytes: u64) -> Vec<Vec<usize>> {
    let mut shards: Vec<Vec<usize>> = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    let mut bytes = 0u64;
    for (i, &n) in sizes.iter().enumerate() {
        if n > max_shard_bytes {
            shards.push(vec![i]);
            continue;
        }
        if !current.is_empty() && bytes + n > max_shard_bytes {
            shards.push(std::mem::take(&mut current));
            bytes = 0;
        }
        current.push(i);
        bytes += n;
    }
    if !current.is_empty() || shards.is_empty() {
        shards.push(current);
    }
    shards
}

/// Saves `tensors` as a sharded model under `dir` (a key prefix: `""` for the tier's root, else
/// ending in `/`): shards `{prefix}-00001-of-0000N.safetensors` of at most `max_shard_bytes` of
/// data each (see [`plan_shards`]), each durable before the next, then the index
/// [`INDEX_FILE`] (`weight_map`, `metadata.total_size`) last, so that an index never names a
/// shard that is not there. A model that fits in one shard is saved as `{prefix}.safetensors`
/// alone. `metadata` goes into every shard's header.
pub async fn save_sharded(
    tier: &dyn Tier,
    dir: &str,
    prefix: &str,
    tensors: &[TensorRef<'_>],
    metadata: Option<&BTreeMap<String, String>>,
    max_shard_bytes: u64,
    opts: &SaveOptions,
) -> Result<ShardedSave> {
    let sizes: Vec<u64> = tensors.iter().map(|t| t.data.len() as u64).collect();
    let total_size = sizes.iter().sum();
    let shards = plan_shards(&sizes, max_shard_bytes.max(1));
    let count = shards.len();
    let mut files = Vec::with_capacity(count);
    let mut weight_map = BTreeMap::new();
    for (s, members) in shards.iter().enumerate() {
        let name = if count == 1 {
            format!("{prefix}.safetensors")
        } else {
            format!("{prefix}-{:05}-of-{count:05}.safetensors", s + 1)
        };
        let part: Vec<TensorRef<'_>> = members.iter().map(|&i| tensors[i]).collect();
        let key = format!("{dir}{name}");
        save(tier, &key, &part, metadata, opts).await?;
        for t in &part {
            weight_map.insert(t.name.to_string(), name.clone());
        }
        files.push(key);
    }
    let index = if count > 1 {
        let idx = ShardIndex { total_size: Some(total_size), weight_map };
        let key = format!("{dir}{INDEX_FILE}");
        ringtier_core::ops::put(tier, &key, &idx.to_json(), ringtier_core::ops::DEFAULT_CHUNK).await?;
        Some(key)
    } else {
        None
    };
    Ok(ShardedSave { files, index, total_size })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_follow_the_hub_rule() {
        assert_eq!(plan_shards(&[4, 4, 4], 8), vec![vec![0, 1], vec![2]]);
        assert_eq!(plan_shards(&[4, 20, 4], 8), vec![vec![1], vec![0, 2]]);
        assert_eq!(plan_shards(&[], 8), vec![Vec::<usize>::new()]);
        assert_eq!(plan_shards(&[8, 1], 8), vec![vec![0], vec![1]]);
    }
}
