//! Records a batch at a time: [`RecordEpoch::fill_batch`] takes up to N records of an epoch in
//! one call, and [`RecordBatch::pack_into`] copies a field of each, end to end, into a buffer
//! the caller gives (a DataLoader worker's shared-memory slot), with their offsets: a consumer
//! in another language handles one buffer per batch instead of one object per record.

use super::*;

/// Records of one epoch, in the epoch's order, taken together ([`RecordEpoch::fill_batch`]).
/// They are delivered: counted in the epoch's [`RecordStats`] and position, not in its
/// [`RecordEpoch::held`] (the caller holds them, as it holds a record from
/// [`RecordEpoch::next`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecordBatch {
    records: Vec<Record>,
    bytes: u64,
}

impl RecordBatch {
    /// An empty batch.
    pub fn new() -> Self {
        RecordBatch::default()
    }

    /// Records in the batch.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// No records.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Bytes of all fields of all records.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The records, in order.
    pub fn records(&self) -> &[Record] {
        &self.records
    }

    /// The records, in order, owned.
    pub fn into_records(self) -> Vec<Record> {
        self.records
    }

    /// Appends `r` (already counted as delivered by whoever took it from its epoch).
    pub fn push(&mut self, r: Record) {
        self.bytes += r.bytes();
        self.records.push(r);
    }

    /// Whether another record may join: fewer than `max_records`, and fewer than `max_bytes`
    /// bytes (0: no byte bound).
    pub fn has_room(&self, max_records: usize, max_bytes: u64) -> bool {
        self.records.len() < max_records && (max_bytes == 0 || self.bytes < max_bytes)
    }

    /// The field names of the records, each once, in the order they first appear (a TFRecord
    /// batch: the one unnamed field, `""`).
    pub fn field_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = Vec::new();
        for f in self.records.iter().flat_map(|r| &r.fields) {
            if !names.contains(&f.name.as_str()) {
                names.push(&f.name);
            }
        }
        names
    }

    /// The bytes [`RecordBatch::pack_into`] writes for `field`: each record's field of that
    /// name (nothing for a record without it), or with `None` all of each record's fields.
    pub fn packed_len(&self, field: Option<&str>) -> usize {
        match field {
            None => self.bytes as usize,
            Some(name) => self.records.iter().map(|r| r.field(name).map_or(0, <[u8]>::len)).sum(),
        }
    }

    /// Copies `field` of every record (see [`RecordBatch::packed_len`]) end to end into the
    /// front of `out`, and returns the offsets: record `i`'s bytes are
    /// `out[offsets[i]..offsets[i + 1]]`, `offsets[0] == 0` and `offsets[len] ==
    /// packed_len(field)`. A record without the field takes no bytes. An `out` shorter than
    /// `packed_len(field)` is an [`ErrorKind::InvalidInput`] error and nothing is written (the
    /// batch stays whole: pack it into a larger buffer).
    pub fn pack_into(&self, field: Option<&str>, out: &mut [u8]) -> Result<Vec<usize>> {
        let need = self.packed_len(field);
        if out.len() < need {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("the batch's {} records take {need} bytes, the buffer has {}", self.records.len(), out.len()),
            ));
        }
        let mut offsets = Vec::with_capacity(self.records.len() + 1);
        let mut at = 0;
        offsets.push(0);
        for r in &self.records {
            for f in r.fields.iter().filter(|f| field.is_none_or(|name| f.name == name)) {
                out[at..at + f.data.len()].copy_from_slice(&f.data);
                at += f.data.len();
                if field.is_some() {
                    break; // the first field of that name, as Record::field finds it
                }
            }
            offsets.push(at);
        }
        Ok(offsets)
    }
}

impl RecordEpoch {
    /// Appends this epoch's next records to `batch` while it has room
    /// ([`RecordBatch::has_room`]: `max_records` records, and `max_bytes` bytes where not 0,
    /// the record that reaches it included, so a record larger than `max_bytes` is never cut:
    /// it ends its batch). Each record is counted as delivered as [`RecordEpoch::next`] counts
    /// it; skipped records are counted in [`RecordStats::skipped`]. Stops early at the end of
    /// the epoch (a batch shorter than asked, empty once the epoch is over). An error when the
    /// batch already holds records ends it there and is returned by the next call (the records
    /// before it are delivered); an error into an empty batch is returned now.
    pub async fn fill_batch(&mut self, batch: &mut RecordBatch, max_records: usize, max_bytes: u64) -> Result<()> {
        while batch.has_room(max_records, max_bytes) {
            match self.take().await {
                None => break,
                Some(Ok(r)) => {
                    self.deliver(&r);
                    batch.push(r);
                }
                Some(Err(e)) if batch.is_empty() => return Err(e),
                Some(Err(e)) => {
                    self.failed = Some(e);
                    break;
                }
            }
        }
        Ok(())
    }

    /// The next batch: [`RecordEpoch::fill_batch`] into a new one (empty at the end of the
    /// epoch).
    pub async fn next_batch(&mut self, max_records: usize, max_bytes: u64) -> Result<RecordBatch> {
        let mut batch = RecordBatch::new();
        self.fill_batch(&mut batch, max_records, max_bytes).await?;
        Ok(batch)
    }
}
