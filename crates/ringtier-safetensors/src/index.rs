//! `model.safetensors.index.json`: which shard holds each tensor of a sharded model, in the
//! layout `transformers` and `huggingface_hub` write (`metadata.total_size`, `weight_map`).

use std::collections::BTreeMap;

use ringtier_core::error::{Error, ErrorKind, Result};
use serde::{Deserialize, Serialize};

/// Largest index file read, in bytes (64 MiB: a million tensors with long names). Checked
/// against the object's size before it is read.
pub const MAX_INDEX_BYTES: u64 = 64 << 20;

/// A sharded model's index.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShardIndex {
    /// `metadata.total_size`: bytes of tensor data in all shards, where given.
    pub total_size: Option<u64>,
    /// Tensor name -> shard file name (relative to the index's directory).
    pub weight_map: BTreeMap<String, String>,
}

#[derive(Serialize, Deserialize, Default)]
struct IndexMeta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    total_size: Option<serde_json::Value>,
}

#[derive(Serialize, Deserialize)]
struct IndexJson {
    #[serde(default)]
    metadata: Option<IndexMeta>,
    weight_map: BTreeMap<String, String>,
}

impl ShardIndex {
    /// Parses an index (as hostile input: a [`ErrorKind::Corrupt`] error for anything but an
    /// object with a `weight_map` of strings).
    pub fn parse(bytes: &[u8]) -> Result<ShardIndex> {
        let corrupt = |m: String| Error::new(ErrorKind::Corrupt, m);
        if bytes.len() as u64 > MAX_INDEX_BYTES {
            return Err(corrupt(format!("a shard index of {} bytes, more than {MAX_INDEX_BYTES}", bytes.len())));
        }
        let raw: IndexJson =
            serde_json::from_slice(bytes).map_err(|e| corrupt(format!("not a safetensors shard index: {e}")))?;
        // `total_size` is an integer; some writers put a float (`1.5e9`) or a string there.
        let total_size = raw.metadata.and_then(|m| m.total_size).and_then(|v| match v {
            serde_json::Value::Number(n) => n.as_u64().or_else(|| n.as_f64().map(|f| f as u64)),
            serde_json::Value::String(s) => s.parse().ok(),
            _ => None,
        });
        Ok(ShardIndex { total_size, weight_map: raw.weight_map })
    }

    /// The shard files, each once, sorted.
    pub fn files(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.weight_map.values().map(String::as_str).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// The index as `huggingface_hub` writes it: JSON indented by two spaces, keys sorted,
    /// ending in a newline.
    pub fn to_json(&self) -> Vec<u8> {
        let raw = IndexJson {
            metadata: Some(IndexMeta { total_size: self.total_size.map(serde_json::Value::from) }),
            weight_map: self.weight_map.clone(),
        };
        let mut out = serde_json::to_vec_pretty(&raw).unwrap_or_default();
        out.push(b'\n');
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_hostile_input() {
        let idx = ShardIndex {
            total_size: Some(30),
            weight_map: [("a".to_string(), "m-1.safetensors".to_string()), ("b".into(), "m-2.safetensors".into())]
                .into(),
        };
        let json = idx.to_json();
        assert!(std::str::from_utf8(&json)
            .expect("utf8")
            .starts_with("{\n  \"metadata\": {\n    \"total_size\": 30\n  },"));
        assert_eq!(ShardIndex::parse(&json).expect("parse"), idx);
        assert_eq!(idx.files(), ["m-1.safetensors", "m-2.safetensors"]);
        let float = br#"{"metadata": {"total_size": 1.5e3}, "weight_map": {}}"#;
        assert_eq!(ShardIndex::parse(float).expect("float").total_size, Some(1500));
        for bad in [&b"[]"[..], b"{}", br#"{"weight_map": {"a": 1}}"#, b"\xff"] {
            assert_eq!(ShardIndex::parse(bad).expect_err("bad").kind(), ErrorKind::Corrupt);
        }
    }
}
