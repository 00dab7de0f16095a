//! The one recursive file walk.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// Every file under `dir`, depth first, each directory's entries in `readdir` order,
/// descending into a subdirectory where it is met (the order fio's `--opendir` reads a file
/// set in); symbolic links are not followed into directories.
pub fn files_under(dir: &Path) -> Result<Vec<PathBuf>> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
        for ent in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
            let ent = ent.with_context(|| format!("listing {}", dir.display()))?;
            if ent.file_type().is_ok_and(|t| t.is_dir()) {
                walk(&ent.path(), out)?;
            } else {
                out.push(ent.path());
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(dir, &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walks_nested_directories() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("a/b")).expect("mkdir");
        std::fs::write(dir.path().join("a/b/x"), b"1").expect("write");
        std::fs::write(dir.path().join("y"), b"2").expect("write");
        let mut f = files_under(dir.path()).expect("walk");
        f.sort();
        assert_eq!(f, [dir.path().join("a/b/x"), dir.path().join("y")]);
        assert!(files_under(&dir.path().join("missing")).is_err());
    }
}
