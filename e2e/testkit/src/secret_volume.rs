//! A Secret volume's folder as the kubelet writes it (its atomic writer: a `..<timestamp>`
//! folder with the files, a `..data` symlink to it, one symlink per key through `..data`), so
//! tests of a process that reloads certificates from a mounted Secret swap them the way a
//! real kubelet does: one rename of `..data`. The real kubelet doing it in a real pod is the
//! subject of the CA rotation scenario.

use std::os::unix::fs::symlink;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

const DATA: &str = "..data";

/// Writes `files` (key, text) into `dir` as a new payload: the files in a fresh
/// `..<timestamp>` folder, `..data` renamed onto it, a symlink per key, and the keys and the
/// folder of the payload before removed.
pub fn write(dir: &Path, files: &[(&str, &str)]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let old = std::fs::read_link(dir.join(DATA)).ok();
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let mut payload = format!("..{nanos}");
    while dir.join(&payload).exists() {
        payload.push('0');
    }
    let folder = dir.join(&payload);
    std::fs::create_dir(&folder)?;
    for (key, text) in files {
        std::fs::write(folder.join(key), text)?;
    }
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    symlink(&payload, &tmp)?;
    std::fs::rename(&tmp, dir.join(DATA))?;
    for (key, _) in files {
        let link = dir.join(key);
        if std::fs::symlink_metadata(&link).is_err() {
            symlink(Path::new(DATA).join(key), &link)?;
        }
    }
    for entry in std::fs::read_dir(dir)?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("..") && !files.iter().any(|(key, _)| *key == name) {
            std::fs::remove_file(entry.path())?;
        }
    }
    if let Some(old) = old {
        std::fs::remove_dir_all(dir.join(old))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_payload_replaces_the_old_through_one_symlink() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), &[("tls.crt", "one"), ("tls.key", "k1")]).unwrap();
        let first = std::fs::read_link(dir.path().join(DATA)).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join("tls.crt")).unwrap(),
            "one"
        );
        assert_eq!(
            std::fs::read_link(dir.path().join("tls.crt")).unwrap(),
            Path::new("..data/tls.crt")
        );
        write(dir.path(), &[("tls.crt", "two")]).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join("tls.crt")).unwrap(),
            "two"
        );
        assert!(!dir.path().join("tls.key").exists());
        assert!(!dir.path().join(first).exists());
    }
}
