//! Reports: typed serde structs, each with a `schema` field naming its kind and version
//! (`ringtier.bench.read/1`), written as pretty JSON; and plain-text or Markdown tables.

use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;

/// Writes a report as pretty JSON to `path`, when one was asked for, and says so.
pub(crate) fn write_json(path: Option<&Path>, report: &impl Serialize) -> Result<()> {
    if let Some(path) = path {
        std::fs::write(path, serde_json::to_string_pretty(report)?)
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// Serializes a field by its `Display` form (`#[serde(serialize_with = "display")]`), for
/// settings such as the engine that are names on the command line.
pub(crate) fn display<T: std::fmt::Display, S: serde::Serializer>(v: &T, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.collect_str(v)
}

/// The current UTC time, `YYYY-MM-DDTHH:MM:SSZ` (from `date -u`; empty where there is none).
pub(crate) fn utc_now() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// A table: a header and rows of cells, printed with aligned columns (the first left, the rest
/// right) or as Markdown.
#[derive(Debug, Clone, Default)]
pub(crate) struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column names.
    pub(crate) fn new<S: Into<String>>(header: impl IntoIterator<Item = S>) -> Table {
        Table { header: header.into_iter().map(Into::into).collect(), rows: Vec::new() }
    }

    /// Adds a row.
    pub(crate) fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) {
        self.rows.push(cells.into_iter().map(Into::into).collect());
    }

    /// Aligned plain text, one line per row, the header first.
    pub(crate) fn text(&self) -> String {
        let cols = self.header.len();
        let mut width = vec![0; cols];
        for r in std::iter::once(&self.header).chain(&self.rows) {
            for (w, c) in width.iter_mut().zip(r) {
                *w = (*w).max(c.chars().count());
            }
        }
        let mut out = String::new();
        for r in std::iter::once(&self.header).chain(&self.rows) {
            let cells: Vec<String> = r
                .iter()
                .zip(&width)
                .enumerate()
                .map(|(i, (c, &w))| if i == 0 { format!("{c:<w$}") } else { format!("{c:>w$}") })
                .collect();
            out.push_str(cells.join("  ").trim_end());
            out.push('\n');
        }
        out
    }

    /// A Markdown table.
    pub(crate) fn markdown(&self) -> String {
        let line = |r: &[String]| format!("| {} |\n", r.join(" | "));
        let mut out = line(&self.header);
        out.push_str(&line(&vec!["---".to_string(); self.header.len()]));
        for r in &self.rows {
            out.push_str(&line(r));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_and_render_as_markdown() {
        let mut t = Table::new(["engine", "MB/s"]);
        t.row(["posix", "1.0"]);
        t.row(["uring-direct", "100.0"]);
        assert_eq!(t.text(), "engine         MB/s\nposix           1.0\nuring-direct  100.0\n");
        assert_eq!(t.markdown(), "| engine | MB/s |\n| --- | --- |\n| posix | 1.0 |\n| uring-direct | 100.0 |\n");
    }
}
