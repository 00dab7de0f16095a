//! `ringtier ckpt ...`: the checkpoint store from the command line, on the library alone
//! (`ringtier::store`, through the front door `ringtier::open`); the burst-buffer experiment,
//! `ringtier bench ckpt`, lives in `ringtier-bench`.

use std::path::Path;

use anyhow::{bail, Context, Result};
use ringtier::open::{Engine, OpenOptions};
use ringtier::store::{open_store, restore_to_dir};
use ringtier_migrate::{CheckpointStore, RestoreOptions, RestoreReport};

use crate::args::{CkptAction, CkptArgs, OnFullArg};

/// Restores the newest intact checkpoint into `dir`: a step whose every copy is bad is passed
/// over with a warning naming it and why, and the next older one restored.
async fn restore_latest_to_dir(
    store: &CheckpointStore,
    dir: &Path,
    opts: &RestoreOptions,
    sync: bool,
    engine: Engine,
) -> Result<(u64, RestoreReport)> {
    let steps: Vec<u64> = store.list().await?.iter().rev().map(|c| c.step).collect();
    let mut skipped = 0;
    for step in steps {
        match restore_to_dir(store, step, dir, opts, sync, &OpenOptions::store().with_engine(engine)).await {
            Ok(r) => return Ok((step, r)),
            Err(e) => match Some(&e) {
                // A part asked for by name that the checkpoint does not have is the user's
                // input, not a bad copy: said at once.
                Some(re)
                    if ringtier_migrate::is_bad_copy(re)
                        && !(opts.parts.is_some() && re.kind() == ringtier_core::ErrorKind::NotFound) =>
                {
                    eprintln!("warning: skipping checkpoint {step}, no intact copy: {re}");
                    skipped += 1;
                }
                _ => {
                    return Err(
                        anyhow::Error::new(e).context(format!("restoring checkpoint {step} into {}", dir.display()))
                    )
                }
            },
        }
    }
    if skipped > 0 {
        bail!("no intact checkpoint to restore ({skipped} bad, see the warnings)");
    }
    bail!("no checkpoint to restore")
}

/// Warns about every step the store quarantined since it was opened (recovery or the drain):
/// the drain went on without them.
fn report_quarantined(store: &CheckpointStore) {
    for (step, why) in store.quarantined_since_open() {
        eprintln!(
            "warning: checkpoint {step} quarantined, no intact copy ({why}); later steps drain on; \
             `ringtier ckpt rm --step {step}` removes it"
        );
    }
}

/// `ringtier ckpt ...`.
pub(crate) fn command(a: CkptArgs) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("building a tokio runtime")?;
    rt.block_on(ckpt_command(a))
}

async fn ckpt_command(a: CkptArgs) -> Result<()> {
    let cfg = ringtier_migrate::StoreConfig::default()
        .with_prefix(a.prefix.clone())
        .with_keep_last(a.keep_last)
        .with_drain_bytes_per_sec(a.drain_bw)
        .with_fast_capacity_bytes(a.fast_capacity)
        .with_on_full(match a.on_full {
            OnFullArg::Wait => ringtier_migrate::OnFull::Wait,
            OnFullArg::WriteThrough => ringtier_migrate::OnFull::WriteThrough,
        });
    // Looking (ls, restore, verify) opens read-only: it works next to a training process that
    // has the store open, and never runs recovery under that process's feet.
    let read_only = matches!(a.action, CkptAction::Ls | CkptAction::Restore { .. } | CkptAction::Verify { .. });
    let store =
        open_store(&a.tiers, &OpenOptions::store().with_engine(a.engine), a.throttle_last, cfg, read_only).await?;
    match a.action {
        CkptAction::Save { step, parts, direct, no_drain } => {
            let mut files = Vec::new();
            for p in &parts {
                let Some((name, path)) = p.split_once('=') else {
                    bail!("--part takes NAME=PATH, got {p:?}");
                };
                let f = std::fs::File::open(path).with_context(|| format!("part {name}: opening {path}"))?;
                let size = f.metadata()?.len();
                files.push((name.to_string(), f, size));
            }
            let parts = files
                .into_iter()
                // Seekable: a fast tier that fills up part-way is retried elsewhere from the start.
                .map(|(n, f, size)| ringtier_migrate::Part::seekable(n, std::io::BufReader::new(f), Some(size)))
                .collect();
            let r = if direct { store.save_direct(step, parts).await? } else { store.save(step, parts).await? };
            println!(
                "saved step {} ({:.1} MB) on {} in {:.3} s{}",
                r.step,
                r.bytes as f64 / 1e6,
                r.tier,
                r.blocking.as_secs_f64(),
                if r.wrote_through { " (fast tier full: written through)" } else { "" }
            );
            if !no_drain {
                let t = std::time::Instant::now();
                store.drain().await?;
                report_quarantined(&store);
                println!("drained to the slowest tier in {:.3} s", t.elapsed().as_secs_f64());
            }
        }
        CkptAction::Ls => {
            println!("{:>20}  {:>12}  tiers", "step", "MB");
            for c in store.list().await? {
                println!("{:>20}  {:>12.1}  {}", c.step, c.bytes as f64 / 1e6, c.tiers.join(", "));
            }
            for q in store.quarantined().await? {
                println!("{:>20}  {:>12}  {} QUARANTINED: {}", q.step, "-", q.tier, q.reason);
            }
            let backlog = store.drain_backlog_bytes();
            if backlog > 0 {
                println!("drain backlog: {:.1} MB (run `ringtier ckpt ... drain`)", backlog as f64 / 1e6);
            }
        }
        CkptAction::Restore { step, out, parts, depth, chunk, no_sync } => {
            let opts = RestoreOptions::default()
                .with_depth(depth)
                .with_chunk_bytes(usize::try_from(chunk).context("--chunk too large")?)
                .with_parts((!parts.is_empty()).then_some(parts));
            let (step, r) = match step {
                Some(step) => (
                    step,
                    restore_to_dir(&store, step, &out, &opts, !no_sync, &OpenOptions::store().with_engine(a.engine))
                        .await
                        .with_context(|| format!("restoring checkpoint {step} into {}", out.display()))?,
                ),
                None => restore_latest_to_dir(&store, &out, &opts, !no_sync, a.engine).await?,
            };
            for f in &r.fallbacks {
                eprintln!("warning: checkpoint {step}: {f}");
            }
            println!(
                "restored step {step} from {} ({} parts, {:.1} MB) into {}{} in {:.2} s ({:.0} MB/s)",
                r.tier_summary(),
                r.sources.len(),
                r.bytes as f64 / 1e6,
                out.display(),
                if no_sync { " (not fsynced)" } else { "" },
                r.seconds,
                r.bytes as f64 / r.seconds.max(1e-9) / 1e6
            );
        }
        CkptAction::Verify { step } => {
            let steps: Vec<u64> = match step {
                Some(s) => vec![s],
                None => store.list().await?.iter().map(|c| c.step).collect(),
            };
            let mut bad = 0;
            for q in store.quarantined().await? {
                if step.is_none_or(|s| s == q.step) {
                    bad += 1;
                    println!("step {} on {}: QUARANTINED: {}", q.step, q.tier, q.reason);
                }
            }
            for s in steps {
                for (tier, res) in store.verify(s).await? {
                    match res {
                        Ok(()) => println!("step {s} on {tier}: ok"),
                        Err(e) => {
                            bad += 1;
                            println!("step {s} on {tier}: BAD: {e}");
                        }
                    }
                }
            }
            if bad > 0 {
                bail!("{bad} bad cop{}", if bad == 1 { "y" } else { "ies" });
            }
        }
        CkptAction::Drain => {
            // What reached a tier it was not on before: a step quarantined on the way is not
            // counted as drained.
            let before: std::collections::BTreeMap<u64, Vec<String>> =
                store.list().await?.into_iter().map(|c| (c.step, c.tiers)).collect();
            store.drain().await?;
            report_quarantined(&store);
            let (mut steps, mut bytes) = (0, 0);
            for c in store.list().await? {
                if before.get(&c.step).is_none_or(|t| c.tiers.iter().any(|n| !t.contains(n))) {
                    steps += 1;
                    bytes += c.bytes;
                }
            }
            println!(
                "drained {steps} checkpoint{} ({:.1} MB) to the slowest tier",
                if steps == 1 { "" } else { "s" },
                bytes as f64 / 1e6
            );
        }
        CkptAction::Rm { step } => {
            store.delete(step).await.with_context(|| format!("removing checkpoint {step}"))?;
            println!("removed step {step} from every tier");
        }
    }
    Ok(())
}
