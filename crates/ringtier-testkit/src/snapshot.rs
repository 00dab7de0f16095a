//! [`snapshot`]: every file of a tree with its contents, to check that an operation changed
//! nothing outside a tier root.

/// Every file under `dir`, with its contents (links as `-> target`), sorted: a snapshot to
/// check that nothing outside a tier root changed.
pub fn snapshot(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    fn walk(base: &std::path::Path, dir: &std::path::Path, out: &mut Vec<(String, Vec<u8>)>) {
        let Ok(rd) = std::fs::read_dir(dir) else { return };
        for ent in rd.flatten() {
            let path = ent.path();
            let rel = path.strip_prefix(base).unwrap_or(&path).display().to_string();
            match std::fs::symlink_metadata(&path) {
                Ok(m) if m.file_type().is_symlink() => {
                    let target = std::fs::read_link(&path).map(|t| t.display().to_string()).unwrap_or_default();
                    out.push((rel, format!("-> {target}").into_bytes()));
                }
                Ok(m) if m.is_dir() => {
                    out.push((format!("{rel}/"), Vec::new()));
                    walk(base, &path, out);
                }
                Ok(_) => out.push((rel, std::fs::read(&path).unwrap_or_default())),
                Err(_) => {}
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}
