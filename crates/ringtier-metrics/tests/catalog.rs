//! The catalog, its documentation and the Grafana dashboard cannot drift apart; the series
//! count does not grow with the dataset.

use std::path::PathBuf;
use std::sync::Arc;

use ringtier_core::catalog::CATALOG;
use ringtier_core::layers::Metered;
use ringtier_core::{AlignedBuf, ReadBatch, Tier};
use ringtier_metrics::catalog_markdown;
use ringtier_uring::{UringConfig, UringTier};

fn repo_file(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(rel)
}

#[test]
fn metrics_md_matches_the_catalog() {
    let path = repo_file("docs/METRICS.md");
    let doc = std::fs::read_to_string(&path).unwrap_or_default();
    if doc != catalog_markdown() {
        panic!(
            "docs/METRICS.md is out of date with the catalog; regenerate it with\n  \
             cargo run -p ringtier-cli -- metrics catalog > docs/METRICS.md\n--- expected ---\n{}",
            catalog_markdown()
        );
    }
}

/// Metric names in a PromQL expression (histogram series suffixes stripped).
fn metric_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("ringtier_") {
        let tail = &rest[i..];
        let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
        let name = &tail[..end];
        let base = ["_bucket", "_sum", "_count"].iter().find_map(|s| name.strip_suffix(s)).unwrap_or(name);
        let known_histogram = CATALOG.iter().any(|m| m.name == base && m.kind == "histogram");
        out.push(if known_histogram { base.to_string() } else { name.to_string() });
        rest = &tail[end..];
    }
    out
}

/// Every panel of a dashboard: the top-level ones and those folded into collapsed rows.
fn all_panels(dash: &serde_json::Value) -> Vec<&serde_json::Value> {
    let mut out = Vec::new();
    for p in dash["panels"].as_array().expect("panels") {
        out.push(p);
        out.extend(p["panels"].as_array().into_iter().flatten());
    }
    out
}

/// The dashboard as JSON, and the catalog metrics its panels query (each with the panels that
/// query it).
fn dashboard() -> (serde_json::Value, std::collections::BTreeMap<String, Vec<String>>) {
    let text = std::fs::read_to_string(repo_file("docs/grafana/ringtier.json")).expect("dashboard");
    let dash: serde_json::Value = serde_json::from_str(&text).expect("dashboard is JSON");
    let mut used = std::collections::BTreeMap::<String, Vec<String>>::new();
    for p in all_panels(&dash).into_iter().filter(|p| p["type"] != "row") {
        let title = p["title"].as_str().expect("panel title").to_string();
        for t in p["targets"].as_array().into_iter().flatten() {
            for n in metric_names(t["expr"].as_str().unwrap_or_default()) {
                used.entry(n).or_default().push(title.clone());
            }
        }
    }
    (dash, used)
}

#[test]
fn grafana_dashboard_is_valid_and_queries_only_catalog_metrics() {
    let (dash, used) = dashboard();
    assert!(dash["title"].as_str().is_some_and(|t| !t.is_empty()));
    assert!(dash["uid"].as_str().is_some_and(|u| !u.is_empty()));
    assert!(dash["schemaVersion"].as_u64().is_some());
    let vars = dash["templating"]["list"].as_array().expect("templating.list");
    let ds = vars.iter().find(|v| v["type"] == "datasource").expect("a data source variable");
    assert_eq!(ds["query"], "prometheus");
    let ds_ref = format!("${{{}}}", ds["name"].as_str().expect("name"));
    let panels = all_panels(&dash);
    assert!(panels.len() >= 8, "throughput, IOPS, latency, in-flight, fallbacks, pool, ...");
    let mut ids = std::collections::HashSet::new();
    // The panels on the top-level grid; panels inside a collapsed row have a grid of their own
    // when it opens, and are checked against each other there.
    let mut grids: Vec<Vec<GridPos>> = vec![Vec::new()];
    for p in dash["panels"].as_array().expect("panels") {
        if let Some(inner) = p["panels"].as_array().filter(|v| !v.is_empty()) {
            grids.push(inner.iter().map(GridPos::of).collect());
        }
        grids[0].push(GridPos::of(p));
    }
    for grid in &grids {
        for (i, a) in grid.iter().enumerate() {
            assert!(a.x + a.w <= 24 && a.w > 0 && a.h > 0, "panel {} fits the 24-column grid", a.title);
            for b in &grid[i + 1..] {
                let apart = a.x + a.w <= b.x || b.x + b.w <= a.x || a.y + a.h <= b.y || b.y + b.h <= a.y;
                assert!(apart, "panels {} and {} overlap", a.title, b.title);
            }
        }
    }
    for p in panels {
        assert!(ids.insert(p["id"].as_u64().expect("panel id")), "duplicate panel id {}", p["id"]);
        if p["type"] == "row" {
            continue;
        }
        assert_eq!(p["datasource"]["uid"], ds_ref.as_str(), "panel {} uses the data source variable", p["title"]);
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "panel {} has queries", p["title"]);
        for t in targets {
            let expr = t["expr"].as_str().expect("expr");
            assert!(!metric_names(expr).is_empty(), "{expr}");
        }
    }
    for (n, titles) in &used {
        assert!(CATALOG.iter().any(|m| m.name == n), "panels {titles:?} query {n}, not in the catalog");
    }
}

/// Where a panel sits on the dashboard's 24-column grid.
struct GridPos {
    x: u64,
    y: u64,
    w: u64,
    h: u64,
    title: String,
}

impl GridPos {
    fn of(p: &serde_json::Value) -> GridPos {
        let g = |k: &str| p["gridPos"][k].as_u64().unwrap_or_else(|| panic!("gridPos.{k} of {}", p["title"]));
        GridPos { x: g("x"), y: g("y"), w: g("w"), h: g("h"), title: p["title"].to_string() }
    }
}

#[test]
fn grafana_dashboard_shows_every_catalog_metric() {
    let (dash, used) = dashboard();
    let missing: Vec<&str> = CATALOG.iter().map(|m| m.name).filter(|n| !used.contains_key(*n)).collect();
    assert!(missing.is_empty(), "catalog metrics on no panel of docs/grafana/ringtier.json: {}", missing.join(", "));
    // The engine fallback is shown as a stat panel in the first row, where nobody misses it.
    let engine = ringtier_core::catalog::ENGINE_FALLBACKS_TOTAL;
    let first_row_end = dash["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .filter(|p| p["type"] == "row")
        .filter_map(|p| p["gridPos"]["y"].as_u64())
        .find(|&y| y > 0)
        .unwrap_or(u64::MAX);
    let shown = all_panels(&dash).into_iter().any(|p| {
        p["type"] == "stat"
            && p["gridPos"]["y"].as_u64().is_some_and(|y| y < first_row_end)
            && p["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|t| metric_names(t["expr"].as_str().unwrap_or_default()).iter().any(|n| n == engine))
    });
    assert!(shown, "a stat panel in the dashboard's first row shows {engine}");
}

/// Reads `n` files of a fresh dataset through a metered uring tier with a local recorder and
/// returns the exposition.
fn exposition_after_reading(n: usize) -> (String, usize) {
    let dir = tempfile::Builder::new().prefix("card").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    for i in 0..n {
        let p = dir.path().join(format!("c{}/f{i}", i % 10));
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, [i as u8; 100]).expect("write");
    }
    let recorder = ringtier_metrics::builder().expect("builder").build_recorder();
    let handle = recorder.handle();
    let tier = metrics::with_local_recorder(&recorder, || {
        let uring: Arc<dyn Tier> = Arc::new(UringTier::new(dir.path(), UringConfig::default()).expect("tier"));
        Metered::new(uring)
    });
    let rt = tokio::runtime::Builder::new_current_thread().build().expect("rt");
    rt.block_on(async {
        let mut batch = ReadBatch::new();
        for chunk in (0..n).collect::<Vec<_>>().chunks(256) {
            for &i in chunk {
                batch.push(&format!("c{}/f{i}", i % 10), 0, 100, AlignedBuf::new(4096, 4096).expect("buf"));
            }
            batch = tier.read_batch(batch).await;
            assert!(batch.iter().all(|(_, e)| matches!(e.result(), Some(Ok(100)))));
            batch.clear();
        }
        let _ = tier.stat("missing").await;
    });
    let text = handle.render();
    let series = text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()).count();
    (text, series)
}

#[test]
fn series_count_is_independent_of_dataset_size() {
    let (small, n_small) = exposition_after_reading(1_000);
    let (large, n_large) = exposition_after_reading(10_000);
    assert_eq!(n_small, n_large, "series must not grow with the number of files");
    assert!(!large.contains("f9999") && !large.contains("c1/"), "no key or file name in any label");
    let bytes = |t: &str| -> f64 {
        t.lines()
            .find(|l| l.starts_with("ringtier_tier_bytes_total{") && l.contains("op=\"read\""))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    assert_eq!(bytes(&small), 100_000.0);
    assert_eq!(bytes(&large), 1_000_000.0);
    assert!(large.contains("ringtier_tier_operation_duration_seconds_bucket{"), "latency histogram with buckets");
    assert!(large.contains("le=\"0.00001\""), "a 10 us bucket: {large}");
}
