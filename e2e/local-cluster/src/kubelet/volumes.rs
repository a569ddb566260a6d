//! Pod volumes on disk. Secret, ConfigMap and service-account volumes use Kubernetes' atomic
//! writer layout (a `..<timestamp>` folder, a `..data` symlink to it and one symlink per
//! top-level entry through `..data`), so an update is a single rename of `..data`.

use std::collections::BTreeMap;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Component, Path, PathBuf};

use k8s_openapi::api::core::v1::{KeyToPath, Pod, Volume};

use super::{ClusterAccess, Objects};

/// A file of a volume: path relative to the volume root, content, mode.
pub type Files = BTreeMap<String, (Vec<u8>, u32)>;

const DATA: &str = "..data";

/// The files of a Secret volume with these keys and texts, as kubelet writes them (mode 0644).
pub fn secret_files<'a>(entries: impl IntoIterator<Item = (&'a str, &'a str)>) -> Files {
    entries
        .into_iter()
        .map(|(key, text)| (key.to_owned(), (text.as_bytes().to_vec(), 0o644)))
        .collect()
}

/// Writes `files` into `dir` with the atomic-writer layout. Returns whether anything changed
/// (an identical payload leaves the folder untouched, so watchers see no event).
pub fn write_atomic(dir: &Path, files: &Files) -> std::io::Result<bool> {
    std::fs::create_dir_all(dir)?;
    if current_payload(dir).as_ref() == Some(files) {
        return Ok(false);
    }
    let old = std::fs::read_link(dir.join(DATA)).ok();
    let stamp = jiff::Timestamp::now()
        .strftime("%Y_%m_%d_%H_%M_%S.%f")
        .to_string();
    let mut ts_name = format!("..{stamp}");
    while dir.join(&ts_name).exists() {
        ts_name.push('0');
    }
    let ts_dir = dir.join(&ts_name);
    for (rel, (content, mode)) in files {
        let path = ts_dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, content)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(*mode))?;
    }
    std::fs::create_dir_all(&ts_dir)?;
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    symlink(&ts_name, &tmp)?;
    std::fs::rename(&tmp, dir.join(DATA))?;
    let tops: std::collections::BTreeSet<&str> = files
        .keys()
        .filter_map(|rel| rel.split('/').next())
        .collect();
    for top in &tops {
        let link = dir.join(top);
        if std::fs::symlink_metadata(&link).is_err() {
            symlink(Path::new(DATA).join(top), &link)?;
        }
    }
    // Entries that the new payload no longer has.
    for entry in std::fs::read_dir(dir)?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("..") && !tops.contains(name.as_str()) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    if let Some(old) = old {
        let _ = std::fs::remove_dir_all(dir.join(old));
    }
    Ok(true)
}

pub(super) fn current_payload(dir: &Path) -> Option<Files> {
    let root = dir.join(DATA);
    std::fs::read_link(&root).ok()?;
    let mut files = Files::new();
    fn walk(root: &Path, rel: &Path, files: &mut Files) -> Option<()> {
        for entry in std::fs::read_dir(root.join(rel)).ok()?.flatten() {
            let rel = rel.join(entry.file_name());
            let meta = entry.metadata().ok()?;
            if meta.is_dir() {
                walk(root, &rel, files)?;
            } else {
                let content = std::fs::read(root.join(&rel)).ok()?;
                files.insert(
                    rel.to_string_lossy().into_owned(),
                    (content, meta.permissions().mode() & 0o7777),
                );
            }
        }
        Some(())
    }
    walk(&root, Path::new(""), &mut files)?;
    Some(files)
}

/// A key's relative path must stay inside the volume.
fn safe_relative(path: &str) -> Result<(), String> {
    let p = Path::new(path);
    if path.is_empty()
        || p.components().any(|c| !matches!(c, Component::Normal(_)))
        || path
            .split('/')
            .next()
            .is_some_and(|first| first.starts_with(".."))
    {
        return Err(format!("invalid path {path:?} in volume items"));
    }
    Ok(())
}

fn project(
    data: BTreeMap<String, Vec<u8>>,
    items: Option<&Vec<KeyToPath>>,
    default_mode: Option<i32>,
    what: &str,
) -> Result<Files, String> {
    let mode = default_mode.map_or(0o644, |m| (m as u32) & 0o7777);
    let mut files = Files::new();
    match items {
        Some(items) => {
            for item in items {
                let Some(content) = data.get(&item.key) else {
                    return Err(format!("{what}: key {:?} not found", item.key));
                };
                safe_relative(&item.path)?;
                let mode = item.mode.map_or(mode, |m| (m as u32) & 0o7777);
                files.insert(item.path.clone(), (content.clone(), mode));
            }
        }
        None => {
            for (k, v) in data {
                safe_relative(&k)?;
                files.insert(k, (v, mode));
            }
        }
    }
    Ok(files)
}

/// What a volume holds now, or `None` for emptyDir (a plain folder nobody rewrites).
/// Errors read like the kubelet's mount failures.
pub fn volume_files(
    pod: &Pod,
    volume: &Volume,
    objects: &dyn Objects,
) -> Result<Option<Files>, String> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    if volume.empty_dir.is_some() {
        return Ok(None);
    }
    if let Some(src) = &volume.secret {
        let name = src.secret_name.clone().unwrap_or_default();
        let what = format!("secret {namespace}/{name}");
        let Some(secret) = objects.secret(namespace, &name) else {
            if src.optional == Some(true) {
                return Ok(Some(Files::new()));
            }
            return Err(format!(
                "MountVolume.SetUp failed for volume {:?}: {what} not found",
                volume.name
            ));
        };
        let mut data: BTreeMap<String, Vec<u8>> = secret
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.0))
            .collect();
        for (k, v) in secret.string_data.unwrap_or_default() {
            data.insert(k, v.into_bytes());
        }
        return project(data, src.items.as_ref(), src.default_mode, &what).map(Some);
    }
    if let Some(src) = &volume.config_map {
        let name = src.name.clone();
        let what = format!("configmap {namespace}/{name}");
        let Some(cm) = objects.config_map(namespace, &name) else {
            if src.optional == Some(true) {
                return Ok(Some(Files::new()));
            }
            return Err(format!(
                "MountVolume.SetUp failed for volume {:?}: {what} not found",
                volume.name
            ));
        };
        let mut data: BTreeMap<String, Vec<u8>> = cm
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.into_bytes()))
            .collect();
        for (k, v) in cm.binary_data.unwrap_or_default() {
            data.insert(k, v.0);
        }
        return project(data, src.items.as_ref(), src.default_mode, &what).map(Some);
    }
    Err(format!(
        "volume {:?}: only secret, configMap and emptyDir volumes are supported by the local cluster",
        volume.name
    ))
}

/// The service account folder in-cluster clients read.
pub fn service_account_files(access: &ClusterAccess, namespace: &str, token: &str) -> Files {
    [
        ("token", token.as_bytes().to_vec()),
        ("ca.crt", access.ca_pem.as_bytes().to_vec()),
        ("namespace", namespace.as_bytes().to_vec()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), (v, 0o644)))
    .collect()
}

pub const SERVICE_ACCOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// Where a mount's source is on the host, given the volume folder and a `subPath`.
pub fn mount_source(volume_dir: &Path, sub_path: Option<&str>) -> Result<PathBuf, String> {
    match sub_path.filter(|s| !s.is_empty()) {
        None => Ok(volume_dir.to_owned()),
        Some(sub) => {
            if Path::new(sub)
                .components()
                .any(|c| !matches!(c, Component::Normal(_)))
            {
                return Err(format!(
                    "subPath {sub:?} must be a relative path inside the volume"
                ));
            }
            // Like the kubelet, a subPath mount pins the current target: later updates are not seen.
            let path = volume_dir.join(sub);
            if std::fs::symlink_metadata(&path).is_err() {
                std::fs::create_dir_all(&path).map_err(|e| format!("subPath {sub:?}: {e}"))?;
            }
            std::fs::canonicalize(&path).map_err(|e| format!("subPath {sub:?}: {e}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(pairs: &[(&str, &str)]) -> Files {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (v.as_bytes().to_vec(), 0o644)))
            .collect()
    }

    #[test]
    fn the_atomic_writer_swaps_the_data_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        assert!(write_atomic(d, &files(&[("a", "1"), ("sub/b", "2")])).unwrap());
        assert_eq!(std::fs::read_to_string(d.join("a")).unwrap(), "1");
        assert_eq!(std::fs::read_to_string(d.join("sub/b")).unwrap(), "2");
        assert_eq!(
            std::fs::read_link(d.join("a")).unwrap(),
            Path::new("..data/a")
        );
        let first = std::fs::read_link(d.join("..data")).unwrap();
        assert!(first.to_string_lossy().starts_with("..20"), "{first:?}");

        assert!(!write_atomic(d, &files(&[("a", "1"), ("sub/b", "2")])).unwrap());
        assert_eq!(std::fs::read_link(d.join("..data")).unwrap(), first);

        assert!(write_atomic(d, &files(&[("a", "3")])).unwrap());
        let second = std::fs::read_link(d.join("..data")).unwrap();
        assert_ne!(first, second);
        assert_eq!(std::fs::read_to_string(d.join("a")).unwrap(), "3");
        assert!(!d.join("sub").exists(), "removed keys disappear");
        assert!(!d.join(&first).exists(), "the old payload is removed");
    }

    #[test]
    fn items_select_and_rename_keys_and_reject_escapes() {
        let data: BTreeMap<String, Vec<u8>> = [
            ("k".to_owned(), b"v".to_vec()),
            ("other".to_owned(), b"o".to_vec()),
        ]
        .into();
        let items = vec![KeyToPath {
            key: "k".into(),
            path: "dir/file.json".into(),
            mode: Some(0o600),
            ..Default::default()
        }];
        let f = project(data.clone(), Some(&items), None, "cm").unwrap();
        assert_eq!(f.keys().collect::<Vec<_>>(), ["dir/file.json"]);
        assert_eq!(f["dir/file.json"].1, 0o600);
        let bad = vec![KeyToPath {
            key: "k".into(),
            path: "../x".into(),
            mode: None,
            ..Default::default()
        }];
        assert!(
            project(data.clone(), Some(&bad), None, "cm")
                .unwrap_err()
                .contains("../x")
        );
        let missing = vec![KeyToPath {
            key: "nope".into(),
            path: "x".into(),
            mode: None,
            ..Default::default()
        }];
        assert!(
            project(data, Some(&missing), None, "cm")
                .unwrap_err()
                .contains("nope")
        );
    }
}
