//! The header: an 8-byte little-endian length, then that many bytes of JSON (padded with
//! spaces to a multiple of 8), then the tensors' bytes. Parsed as hostile input: every length
//! is bounded before anything is allocated for it, and every inconsistency is an
//! [`ErrorKind::Corrupt`] error.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use ringtier_core::error::{Error, ErrorKind, Result};
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};

use crate::dtype::Dtype;

/// Bytes of the length field at the start of a file.
pub const LEN_BYTES: u64 = 8;

/// Largest JSON header accepted, in bytes: 100,000,000, the `safetensors` package's own
/// limit. Checked against the length field (and against the file's size) before the header
/// is read or anything is allocated for it. Parsing a header of `n` bytes allocates at most a
/// few times `n`.
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// The key of the free-form string map in the header.
pub const METADATA_KEY: &str = "__metadata__";

fn corrupt(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::Corrupt, msg)
}

/// One tensor as the header describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Its name (any UTF-8 string but `__metadata__`).
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Shape, outermost first (C order); empty for a scalar. For [`Dtype::F4`] the last
    /// dimension counts elements, two per byte.
    pub shape: Vec<u64>,
    /// Its bytes, `[begin, end)`, counted from the start of the data region (see
    /// [`Header::data_start`]).
    pub data_offsets: (u64, u64),
}

impl TensorInfo {
    /// Bytes of data.
    pub fn byte_len(&self) -> u64 {
        self.data_offsets.1 - self.data_offsets.0
    }
}

/// A parsed, validated header: tensors in data order, contiguous from the start of the data
/// region to the end of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    json_len: u64,
    metadata: Option<BTreeMap<String, String>>,
    tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
}

/// A tensor entry as JSON has it (unknown fields ignored, as the `safetensors` package does).
#[derive(Deserialize)]
struct RawTensor {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: (u64, u64),
}

/// The JSON object, in file order, duplicates kept (refused later).
struct RawHeader {
    metadata: Option<BTreeMap<String, String>>,
    metadata_twice: bool,
    tensors: Vec<(String, RawTensor)>,
}

impl<'de> Deserialize<'de> for RawHeader {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawHeader;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object of tensors")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<RawHeader, A::Error> {
                let mut out = RawHeader { metadata: None, metadata_twice: false, tensors: Vec::new() };
                while let Some(key) = map.next_key::<String>()? {
                    if key == METADATA_KEY {
                        let m: BTreeMap<String, String> = map.next_value()?;
                        out.metadata_twice |= out.metadata.is_some();
                        out.metadata = Some(m);
                    } else {
                        let t: RawTensor = map.next_value()?;
                        out.tensors.push((key, t));
                    }
                }
                Ok(out)
            }
        }
        d.deserialize_map(V).map_err(de::Error::custom)
    }
}

impl Header {
    /// The JSON header's length from the first 8 bytes of a file of `file_size` bytes,
    /// checked: at most [`MAX_HEADER_BYTES`] and at most what the file holds past the field.
    pub fn json_len_from(first: &[u8], file_size: u64) -> Result<u64> {
        if file_size < LEN_BYTES || first.len() < LEN_BYTES as usize {
            return Err(corrupt(format!(
                "not a safetensors file: {file_size} bytes, shorter than the 8-byte header length"
            )));
        }
        let mut raw = [0u8; 8];
        raw.copy_from_slice(&first[..8]);
        let n = u64::from_le_bytes(raw);
        if n > MAX_HEADER_BYTES {
            return Err(corrupt(format!(
                "the header claims {n} bytes of JSON, more than the limit of {MAX_HEADER_BYTES}"
            )));
        }
        if n > file_size - LEN_BYTES {
            return Err(corrupt(format!(
                "the header claims {n} bytes of JSON, past the end of the {file_size}-byte file"
            )));
        }
        Ok(n)
    }

    /// Parses the header of a file of `file_size` bytes from `prefix`, its first bytes (at
    /// least the 8-byte length and the JSON it announces; more is ignored).
    pub fn parse(prefix: &[u8], file_size: u64) -> Result<Header> {
        let n = Self::json_len_from(prefix, file_size)?;
        let end = (LEN_BYTES + n) as usize;
        let json = prefix.get(LEN_BYTES as usize..end).ok_or_else(|| {
            Error::new(ErrorKind::InvalidInput, format!("{} bytes given of a header that needs {end}", prefix.len()))
        })?;
        let text = std::str::from_utf8(json).map_err(|e| corrupt(format!("the header is not valid UTF-8 ({e})")))?;
        let raw: RawHeader =
            serde_json::from_str(text).map_err(|e| corrupt(format!("the header is not valid JSON: {e}")))?;
        if raw.metadata_twice {
            return Err(corrupt(format!("the header has {METADATA_KEY} twice")));
        }
        let mut tensors = Vec::with_capacity(raw.tensors.len());
        for (name, t) in raw.tensors {
            let dtype: Dtype = t.dtype.parse().map_err(|e| corrupt(format!("tensor {name:?}: {e}")))?;
            tensors.push(TensorInfo { name, dtype, shape: t.shape, data_offsets: t.data_offsets });
        }
        // Data order; writers other than the `safetensors` package may list them otherwise.
        tensors.sort_by_key(|t| t.data_offsets);
        let header = Header::from_parts(n, raw.metadata, tensors)?;
        let expected = LEN_BYTES + n + header.data_len();
        if expected != file_size {
            return Err(corrupt(format!(
                "the tensors end at byte {expected} but the file has {file_size} bytes{}",
                if expected > file_size { " (truncated, or offsets past the end)" } else { " (trailing bytes)" }
            )));
        }
        Ok(header)
    }

    /// Checks tensors in data order: contiguous from offset 0, each one's byte count that of
    /// its dtype and shape, names unique.
    fn from_parts(
        json_len: u64,
        metadata: Option<BTreeMap<String, String>>,
        tensors: Vec<TensorInfo>,
    ) -> Result<Header> {
        let mut at = 0u64;
        let mut by_name = HashMap::with_capacity(tensors.len());
        for (i, t) in tensors.iter().enumerate() {
            let (begin, end) = t.data_offsets;
            if end < begin {
                return Err(corrupt(format!("tensor {:?}: data_offsets [{begin}, {end}] run backwards", t.name)));
            }
            if begin != at {
                let what = if begin < at {
                    "overlaps the tensor before it"
                } else {
                    "leaves a gap after the tensor before it"
                };
                return Err(corrupt(format!(
                    "tensor {:?}: data_offsets [{begin}, {end}] {what} (which ends at {at})",
                    t.name
                )));
            }
            let want = t.dtype.byte_len(&t.shape).ok_or_else(|| {
                corrupt(format!(
                    "tensor {:?}: shape {:?} of {} does not make a whole number of bytes that fits 64 bits",
                    t.name, t.shape, t.dtype
                ))
            })?;
            if want != end - begin {
                return Err(corrupt(format!(
                    "tensor {:?}: {} of shape {:?} takes {want} bytes, but its data_offsets [{begin}, {end}] hold {}",
                    t.name,
                    t.dtype,
                    t.shape,
                    end - begin
                )));
            }
            if by_name.insert(t.name.clone(), i).is_some() {
                return Err(corrupt(format!("tensor {:?} appears twice in the header", t.name)));
            }
            at = end;
        }
        Ok(Header { json_len, metadata, tensors, by_name })
    }

    /// Bytes of JSON (with its padding) after the length field.
    pub fn json_len(&self) -> u64 {
        self.json_len
    }

    /// Where the data region starts in the file: `8 + json_len`.
    pub fn data_start(&self) -> u64 {
        LEN_BYTES + self.json_len
    }

    /// Bytes of the data region (every tensor's bytes).
    pub fn data_len(&self) -> u64 {
        self.tensors.last().map_or(0, |t| t.data_offsets.1)
    }

    /// The file's size: header and data.
    pub fn file_size(&self) -> u64 {
        self.data_start() + self.data_len()
    }

    /// The free-form `__metadata__` map, where the file has one.
    pub fn metadata(&self) -> Option<&BTreeMap<String, String>> {
        self.metadata.as_ref()
    }

    /// The tensors, in data order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor `name`.
    pub fn get(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// True for a file without tensors.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// The file's first bytes: the length field and the JSON, padded with spaces to a multiple
    /// of 8, exactly as the `safetensors` package writes them for the same header (tensor
    /// entries in data order, `__metadata__` first with its keys sorted).
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        encode(self.metadata.as_ref(), &self.tensors)
    }
}

/// A tensor entry as written: fields in the `safetensors` package's order.
#[derive(Serialize)]
struct EntryOut<'a> {
    dtype: &'a str,
    shape: &'a [u64],
    data_offsets: (u64, u64),
}

fn encode(metadata: Option<&BTreeMap<String, String>>, tensors: &[TensorInfo]) -> Result<Vec<u8>> {
    let mut out = vec![0u8; LEN_BYTES as usize];
    {
        let mut ser = serde_json::Serializer::new(&mut out);
        let json = |e: serde_json::Error| Error::new(ErrorKind::InvalidInput, format!("encoding the header: {e}"));
        let mut map = ser.serialize_map(Some(tensors.len() + usize::from(metadata.is_some()))).map_err(json)?;
        if let Some(m) = metadata {
            map.serialize_entry(METADATA_KEY, m).map_err(json)?;
        }
        for t in tensors {
            let entry = EntryOut { dtype: t.dtype.as_str(), shape: &t.shape, data_offsets: t.data_offsets };
            map.serialize_entry(&t.name, &entry).map_err(json)?;
        }
        map.end().map_err(json)?;
    }
    let padded = (out.len() as u64 - LEN_BYTES).next_multiple_of(LEN_BYTES);
    if padded > MAX_HEADER_BYTES {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!("the header would take {padded} bytes, more than the format's limit of {MAX_HEADER_BYTES}"),
        ));
    }
    out.resize((LEN_BYTES + padded) as usize, b' ');
    out[..8].copy_from_slice(&padded.to_le_bytes());
    Ok(out)
}

/// A tensor to write: its name, dtype, shape and byte count (the bytes come separately).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    /// Name (unique in the file; not `__metadata__`).
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Shape (for [`Dtype::F4`], the last dimension counts elements, two per byte).
    pub shape: Vec<u64>,
    /// Bytes of data the caller has for it; must be what dtype and shape make.
    pub byte_len: u64,
}

/// Where each tensor goes in a file about to be written (see [`Layout::plan`]).
#[derive(Debug, Clone)]
pub struct Layout {
    /// The header in data order.
    pub header: Header,
    /// The file's first bytes ([`Header::to_bytes`]).
    pub prefix: Vec<u8>,
    /// `order[i]` is the index, in the caller's list, of the `i`-th tensor in the file.
    pub order: Vec<usize>,
}

impl Layout {
    /// Lays out `tensors` as the `safetensors` package does: sorted by dtype, widest first
    /// (in [`Dtype`]'s order, descending), then by name; packed from offset 0. Errors
    /// ([`ErrorKind::InvalidInput`]) for a duplicate or reserved name, or a byte count that is
    /// not what the dtype and shape make.
    pub fn plan(tensors: &[TensorSpec], metadata: Option<&BTreeMap<String, String>>) -> Result<Layout> {
        let bad = |m: String| Error::new(ErrorKind::InvalidInput, m);
        let mut order: Vec<usize> = (0..tensors.len()).collect();
        order.sort_by(|&a, &b| {
            let (x, y) = (&tensors[a], &tensors[b]);
            y.dtype.cmp(&x.dtype).then_with(|| x.name.cmp(&y.name))
        });
        let mut infos = Vec::with_capacity(tensors.len());
        let mut at = 0u64;
        for &i in &order {
            let t = &tensors[i];
            if t.name == METADATA_KEY {
                return Err(bad(format!("a tensor may not be named {METADATA_KEY:?}")));
            }
            match t.dtype.byte_len(&t.shape) {
                Some(n) if n == t.byte_len => {}
                Some(n) => {
                    return Err(bad(format!(
                        "tensor {:?}: {} of shape {:?} takes {n} bytes, {} given",
                        t.name, t.dtype, t.shape, t.byte_len
                    )))
                }
                None => {
                    return Err(bad(format!(
                        "tensor {:?}: shape {:?} of {} is too large or not a whole number of bytes",
                        t.name, t.shape, t.dtype
                    )))
                }
            }
            let end = at.checked_add(t.byte_len).ok_or_else(|| bad("tensors larger than 2^64 bytes".into()))?;
            infos.push(TensorInfo {
                name: t.name.clone(),
                dtype: t.dtype,
                shape: t.shape.clone(),
                data_offsets: (at, end),
            });
            at = end;
        }
        let prefix = encode(metadata, &infos)?;
        let json_len = prefix.len() as u64 - LEN_BYTES;
        let header = Header::from_parts(json_len, metadata.cloned(), infos)
            .map_err(|e| bad(e.message().replace("appears twice in the header", "is given twice")))?;
        Ok(Layout { header, prefix, order })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(json: &str, data: usize) -> Vec<u8> {
        let mut v = (json.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(json.as_bytes());
        v.resize(v.len() + data, 0);
        v
    }

    fn parse(bytes: &[u8]) -> Result<Header> {
        Header::parse(bytes, bytes.len() as u64)
    }

    fn corrupt_msg(bytes: &[u8]) -> String {
        let e = parse(bytes).expect_err("corrupt");
        assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
        e.message().to_string()
    }

    #[test]
    fn a_file_the_package_writes_parses() {
        // `safetensors.torch.save_file({"a": torch.zeros(2, 2), "b": torch.zeros(3, dtype=torch.uint8)})`
        let json = r#"{"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"b":{"dtype":"U8","shape":[3],"data_offsets":[16,19]}}"#;
        let mut padded = json.to_string();
        while padded.len() % 8 != 0 {
            padded.push(' ');
        }
        let bytes = file(&padded, 19);
        let h = parse(&bytes).expect("parse");
        assert_eq!(h.len(), 2);
        assert_eq!(h.data_start(), 8 + padded.len() as u64);
        assert_eq!(h.get("b").map(|t| (t.dtype, t.data_offsets)), Some((Dtype::U8, (16, 19))));
        assert_eq!(h.to_bytes().expect("encode"), bytes[..h.data_start() as usize].to_vec());
    }

    #[test]
    fn hostile_lengths_are_refused_before_reading() {
        assert!(corrupt_msg(&[1, 2, 3]).contains("shorter than the 8-byte"));
        // A length past the file.
        let mut b = file("{}", 0);
        b[..8].copy_from_slice(&1000u64.to_le_bytes());
        assert!(corrupt_msg(&b).contains("past the end"));
        // A 100 MB claim (more than the limit), and u64::MAX.
        for n in [MAX_HEADER_BYTES + 1, u64::MAX] {
            let e = Header::json_len_from(&n.to_le_bytes(), u64::MAX).expect_err("too large");
            assert!(e.message().contains("more than the limit"), "{e}");
        }
        // A claim at the limit in a small file: past its end.
        let e = Header::json_len_from(&MAX_HEADER_BYTES.to_le_bytes(), 4096).expect_err("past end");
        assert!(e.message().contains("past the end"), "{e}");
    }

    #[test]
    fn offsets_must_be_contiguous_in_order_and_within_the_file() {
        let overlap = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}"#;
        assert!(corrupt_msg(&file(overlap, 6)).contains("overlaps"));
        let gap = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[8,12]}}"#;
        assert!(corrupt_msg(&file(gap, 12)).contains("gap"));
        let backwards = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[4,0]}}"#;
        assert!(corrupt_msg(&file(backwards, 4)).contains("backwards"));
        let past_end = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}"#;
        assert!(corrupt_msg(&file(past_end, 3)).contains("truncated"));
        assert!(corrupt_msg(&file(past_end, 5)).contains("trailing"));
        // Listed out of data order: fine (sorted by offset, as the package does).
        let swapped = r#"{"b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]},"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}"#;
        let h = parse(&file(swapped, 8)).expect("out of order in the JSON is fine");
        assert_eq!(h.tensors()[0].name, "a");
    }

    #[test]
    fn dtype_and_shape_must_make_the_byte_count() {
        let short = r#"{"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,15]}}"#;
        assert!(corrupt_msg(&file(short, 15)).contains("takes 16 bytes"));
        let overflow = r#"{"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,0]}}"#;
        assert!(corrupt_msg(&file(overflow, 0)).contains("fits 64 bits"));
        let odd_f4 = r#"{"a":{"dtype":"F4","shape":[3],"data_offsets":[0,1]}}"#;
        assert!(corrupt_msg(&file(odd_f4, 1)).contains("whole number of bytes"));
        let unknown = r#"{"a":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}}"#;
        assert!(corrupt_msg(&file(unknown, 16)).contains("unknown dtype"));
        let negative = r#"{"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}}"#;
        assert!(corrupt_msg(&file(negative, 1)).contains("not valid JSON"));
    }

    #[test]
    fn names_must_be_utf8_and_unique() {
        let mut b = file(r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#, 1);
        b[10] = 0xff; // the name's byte
        assert!(corrupt_msg(&b).contains("UTF-8"));
        let twice = r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#;
        assert!(corrupt_msg(&file(twice, 2)).contains("twice"));
        let meta_twice = r#"{"__metadata__":{},"__metadata__":{}}"#;
        assert!(corrupt_msg(&file(meta_twice, 0)).contains("twice"));
        let meta_not_strings = r#"{"__metadata__":{"a":1}}"#;
        assert!(corrupt_msg(&file(meta_not_strings, 0)).contains("JSON"));
        assert!(corrupt_msg(&file("[]", 0)).contains("JSON"));
    }

    #[test]
    fn a_100_mb_header_is_read_no_further_than_its_claim() {
        // A claim of 100 MB (at the limit) in a file that holds it: the parser checks the JSON
        // it was given, and refuses it as JSON, not by allocating a structure per byte.
        let n = 100_000_000u64;
        let mut b = vec![b' '; 8 + n as usize];
        b[..8].copy_from_slice(&n.to_le_bytes());
        b[8] = b'{';
        assert!(corrupt_msg(&b).contains("JSON"));
    }

    #[test]
    fn plan_sorts_as_the_package_does_and_checks_sizes() {
        let spec = |name: &str, dtype, shape: &[u64]| TensorSpec {
            name: name.into(),
            dtype,
            shape: shape.to_vec(),
            byte_len: dtype.byte_len(shape).expect("size"),
        };
        let tensors = vec![
            spec("z", Dtype::U8, &[3]),
            spec("b", Dtype::F32, &[2]),
            spec("a", Dtype::F32, &[1]),
            spec("c", Dtype::I64, &[]),
        ];
        let meta: BTreeMap<String, String> = [("format".to_string(), "pt".to_string())].into();
        let l = Layout::plan(&tensors, Some(&meta)).expect("plan");
        let names: Vec<&str> = l.header.tensors().iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["c", "a", "b", "z"]);
        assert_eq!(l.order, [3, 2, 1, 0]);
        let json = std::str::from_utf8(&l.prefix[8..]).expect("utf8");
        assert!(
            json.starts_with(r#"{"__metadata__":{"format":"pt"},"c":{"dtype":"I64","shape":[],"data_offsets":[0,8]}"#),
            "{json}"
        );
        assert_eq!(l.prefix.len() % 8, 0);
        let again =
            Header::parse(&[l.prefix.clone(), vec![0; 23]].concat(), l.prefix.len() as u64 + 23).expect("parse");
        assert_eq!(again, l.header);
        let mut wrong = tensors.clone();
        wrong[0].byte_len = 4;
        assert_eq!(Layout::plan(&wrong, None).expect_err("size").kind(), ErrorKind::InvalidInput);
        let dup = vec![spec("a", Dtype::U8, &[1]), spec("a", Dtype::U8, &[1])];
        assert!(Layout::plan(&dup, None).expect_err("dup").message().contains("given twice"));
        let reserved = vec![spec(METADATA_KEY, Dtype::U8, &[1])];
        assert!(Layout::plan(&reserved, None).is_err());
        // No tensors: `{}` padded to 8.
        assert_eq!(Layout::plan(&[], None).expect("empty").prefix, b"\x08\0\0\0\0\0\0\0{}      ".to_vec());
    }
}
