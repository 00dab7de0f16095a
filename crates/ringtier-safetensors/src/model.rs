//! A model: one safetensors file, or the shards a `model.safetensors.index.json` names.

use std::collections::HashMap;
use std::sync::Arc;

use futures_util::future::try_join_all;
use ringtier_core::error::{Error, ErrorKind, Operation, Result};
use ringtier_core::Tier;

use crate::header::TensorInfo;
use crate::index::{ShardIndex, MAX_INDEX_BYTES};
use crate::read::SafetensorsFile;

/// The files of a model, their headers read and checked.
#[derive(Debug, Clone)]
pub struct Model {
    /// Its files: the one file, or the shards in the index's (sorted) order.
    pub files: Vec<SafetensorsFile>,
    /// The index, for a sharded model.
    pub index: Option<ShardIndex>,
    by_name: HashMap<String, usize>,
}

impl Model {
    /// Opens `key` on `tier`: a safetensors file, or (a key ending in `.json`) a shard index,
    /// whose shards, in its directory, are opened at once. Every tensor the index names must be
    /// in the shard it names, and no tensor may be in two shards (a [`ErrorKind::Corrupt`]
    /// error otherwise).
    pub async fn open(tier: Arc<dyn Tier>, key: &str) -> Result<Model> {
        if !key.ends_with(".json") {
            let file = SafetensorsFile::open(tier, key).await?;
            let by_name = file.header().tensors().iter().map(|t| (t.name.clone(), 0)).collect();
            return Ok(Model { files: vec![file], index: None, by_name });
        }
        let size = tier.stat(key).await?.size;
        if size > MAX_INDEX_BYTES {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!("a shard index of {size} bytes, more than {MAX_INDEX_BYTES}"),
            )
            .context(Operation::Read, key, tier.name()));
        }
        let bytes = ringtier_core::ops::get(tier.as_ref(), key).await?;
        let index = ShardIndex::parse(&bytes).map_err(|e| e.context(Operation::Read, key, tier.name()))?;
        let dir = key.rfind('/').map_or("", |i| &key[..=i]);
        let keys: Vec<String> = index.files().iter().map(|f| format!("{dir}{f}")).collect();
        let files = try_join_all(keys.iter().map(|k| SafetensorsFile::open(Arc::clone(&tier), k))).await?;
        let mut by_name = HashMap::new();
        for (i, f) in files.iter().enumerate() {
            for t in f.header().tensors() {
                if by_name.insert(t.name.clone(), i).is_some() {
                    return Err(Error::new(
                        ErrorKind::Corrupt,
                        format!("tensor {:?} is in two shards (one of them {})", t.name, f.key()),
                    )
                    .context(Operation::Read, key, tier.name()));
                }
            }
        }
        for (name, shard) in &index.weight_map {
            let found = by_name.get(name).map(|&i| files[i].key());
            if found != Some(&format!("{dir}{shard}")) {
                return Err(Error::new(
                    ErrorKind::Corrupt,
                    format!("the index puts tensor {name:?} in {shard}, which does not hold it"),
                )
                .context(Operation::Read, key, tier.name()));
            }
        }
        Ok(Model { files, index: Some(index), by_name })
    }

    /// The file holding tensor `name` (an index into [`Model::files`]) and its header entry.
    pub fn find(&self, name: &str) -> Option<(usize, &TensorInfo)> {
        let &i = self.by_name.get(name)?;
        Some((i, self.files[i].header().get(name)?))
    }

    /// Every tensor as (file index, entry): file by file, each in data order.
    pub fn tensors(&self) -> impl Iterator<Item = (usize, &TensorInfo)> {
        self.files.iter().enumerate().flat_map(|(i, f)| f.header().tensors().iter().map(move |t| (i, t)))
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    /// True for a model without tensors.
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// Bytes of tensor data in all files.
    pub fn data_len(&self) -> u64 {
        self.files.iter().map(|f| f.header().data_len()).sum()
    }
}
