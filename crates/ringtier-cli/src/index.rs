//! `ringtier index`: `SHARD.idx` beside every record shard (one `offset size` line per record,
//! DALI's tfrecord2idx / wds2idx format), for a global shuffle. On the library alone: the
//! shards' tier comes through the front door (`ringtier::open`, engine `auto`).

use std::io::Write as _;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use ringtier::loader::records::{list_shards, RecordConfig, RecordFormat, RecordIndex, RecordLoader};
use ringtier::open::OpenOptions;

use crate::args::{IndexArgs, IndexFormat};

/// `ringtier index`.
pub(crate) fn command(a: IndexArgs) -> Result<()> {
    let format = match a.format {
        IndexFormat::Tfrecord => RecordFormat::TfRecord,
        IndexFormat::Wds => RecordFormat::WebDataset,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("building a tokio runtime")?;
    let options = OpenOptions::dataset().with_engine(a.engine).with_name("records").with_metered(false);
    let tier = ringtier::open(&a.dir, &options)?.tier;
    let shards = rt.block_on(list_shards(tier.as_ref(), format))?;
    let loader = RecordLoader::new(tier, shards.clone(), format, RecordConfig::default())?;
    let t0 = Instant::now();
    let mut records = 0;
    for (i, s) in shards.iter().enumerate() {
        let idx = rt.block_on(loader.build_index(i)).with_context(|| format!("indexing {}", s.key))?;
        records += idx.entries.len();
        write_index(&a.dir.join(format!("{}.idx", s.key)), &idx)?;
    }
    println!(
        "indexed {records} records in {} {} shards in {:.1} s ({}/SHARD.idx)",
        shards.len(),
        format.as_str(),
        t0.elapsed().as_secs_f64(),
        a.dir.display()
    );
    Ok(())
}

/// Writes `idx` to `path` whole or not at all: a new temporary file beside it (created, never
/// opened through an existing name or link), then renamed over `path`.
fn write_index(path: &Path, idx: &RecordIndex) -> Result<()> {
    let tmp = path.with_extension(format!("idx.tmp-{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        f.write_all(idx.to_text().as_bytes())?;
        f.sync_all()
    };
    if let Err(e) = write() {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("writing {}", tmp.display()));
    }
    std::fs::rename(&tmp, path).with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
}
