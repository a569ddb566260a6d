//! The shell script that starts a container: run inside the pod's network namespace and a
//! fresh private mount namespace, it gives the process its own `/dev/shm`, creates missing
//! mount points under a private overlay (the host's folders stay untouched), bind-mounts the
//! volumes and `/etc/hosts`, then execs the container's argv.

use std::path::{Path, PathBuf};

/// One bind mount into the container.
#[derive(Clone, Debug)]
pub struct Mount {
    pub source: PathBuf,
    pub target: PathBuf,
    pub read_only: bool,
}

/// Everything the script needs besides argv (passed as its positional parameters).
#[derive(Clone, Debug)]
pub struct Launch {
    pub mounts: Vec<Mount>,
    pub hosts_file: PathBuf,
    /// Private scratch space for overlay upper/work folders.
    pub scratch: PathBuf,
    pub working_dir: Option<String>,
    /// The pod's hostname, set in the container's own UTS namespace.
    pub hostname: String,
}

pub fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn q(p: &Path) -> String {
    quote(&p.to_string_lossy())
}

/// The deepest existing folder above a missing mount point, resolved through symlinks.
fn existing_ancestor(target: &Path) -> Option<PathBuf> {
    target
        .ancestors()
        .skip(1)
        .find(|a| a.exists())
        .and_then(|a| std::fs::canonicalize(a).ok())
}

/// The folders to overlay so that every missing mount point can be created.
fn overlays(mounts: &[Mount]) -> Result<Vec<PathBuf>, String> {
    let mut needed: Vec<PathBuf> = Vec::new();
    for m in mounts {
        if !m.target.is_absolute() {
            return Err(format!("mountPath {:?} must be absolute", m.target));
        }
        if std::fs::symlink_metadata(&m.target).is_ok() {
            continue;
        }
        let Some(ancestor) = existing_ancestor(&m.target) else {
            return Err(format!(
                "mountPath {:?}: no existing parent folder",
                m.target
            ));
        };
        if ancestor == Path::new("/") {
            return Err(format!(
                "mountPath {:?}: the local cluster cannot create a top-level folder on this host",
                m.target
            ));
        }
        needed.push(ancestor);
    }
    needed.sort();
    needed.dedup();
    let mut reduced: Vec<PathBuf> = Vec::new();
    for path in needed {
        if !reduced.iter().any(|r| path.starts_with(r)) {
            reduced.push(path);
        }
    }
    Ok(reduced)
}

/// The script text. Mount points are created in path order so a parent mount comes first.
pub fn script(launch: &Launch) -> Result<String, String> {
    let mut s = String::from("#!/bin/sh\nset -e\n");
    s.push_str(&format!(
        "echo {} > /proc/sys/kernel/hostname\n",
        quote(&launch.hostname)
    ));
    s.push_str("mount -t tmpfs -o mode=1777,size=256m shm /dev/shm\n");
    for (i, dir) in overlays(&launch.mounts)?.iter().enumerate() {
        let upper = launch.scratch.join(format!("overlay{i}/upper"));
        let work = launch.scratch.join(format!("overlay{i}/work"));
        s.push_str(&format!("mkdir -p {} {}\n", q(&upper), q(&work)));
        let opts = format!(
            "lowerdir={},upperdir={},workdir={}",
            dir.display(),
            upper.display(),
            work.display()
        );
        s.push_str(&format!(
            "mount -t overlay overlay -o {} {}\n",
            quote(&opts),
            q(dir)
        ));
    }
    let mut mounts = launch.mounts.clone();
    mounts.sort_by(|a, b| a.target.cmp(&b.target));
    for m in &mounts {
        let target = q(&m.target);
        if m.source.is_dir() {
            s.push_str(&format!("mkdir -p {target}\n"));
        } else {
            s.push_str(&format!(
                "[ -e {target} ] || {{ mkdir -p \"$(dirname {target})\"; : > {target}; }}\n"
            ));
        }
        s.push_str(&format!("mount --bind {} {target}\n", q(&m.source)));
        if m.read_only {
            s.push_str(&format!("mount -o remount,bind,ro {target}\n"));
        }
    }
    s.push_str(&format!(
        "mount --bind {} /etc/hosts\n",
        q(&launch.hosts_file)
    ));
    let dir = launch.working_dir.as_deref().unwrap_or("/");
    s.push_str(&format!("mkdir -p {0}\ncd {0}\n", quote(dir)));
    s.push_str("exec \"$@\"\n");
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_single_quotes() {
        assert_eq!(quote("a'b"), r"'a'\''b'");
    }

    #[test]
    fn missing_mount_points_get_one_overlay_on_their_existing_parent() {
        let mounts = |targets: &[&str]| -> Vec<Mount> {
            targets
                .iter()
                .map(|t| Mount {
                    source: "/tmp".into(),
                    target: (*t).into(),
                    read_only: true,
                })
                .collect()
        };
        let got = overlays(&mounts(&[
            "/etc/m3r-test-x/a",
            "/etc/m3r-test-y/b/c",
            "/tmp",
        ]))
        .unwrap();
        assert_eq!(got, [PathBuf::from("/etc")]);
        let err = overlays(&mounts(&["/m3r-no-such-top/x"])).unwrap_err();
        assert!(err.contains("top-level"), "{err}");
        assert!(
            overlays(&mounts(&["relative/x"]))
                .unwrap_err()
                .contains("absolute")
        );
    }

    #[test]
    fn the_script_mounts_read_only_and_execs_argv() {
        let s = script(&Launch {
            mounts: vec![Mount {
                source: "/tmp".into(),
                target: "/etc/m3r-test/x".into(),
                read_only: true,
            }],
            hosts_file: "/h".into(),
            scratch: "/s".into(),
            working_dir: None,
            hostname: "p".into(),
        })
        .unwrap();
        assert!(s.contains("mount -t overlay overlay -o 'lowerdir=/etc,upperdir=/s/overlay0/upper,workdir=/s/overlay0/work' '/etc'"), "{s}");
        assert!(
            s.contains(
                "mount --bind '/tmp' '/etc/m3r-test/x'\nmount -o remount,bind,ro '/etc/m3r-test/x'"
            ),
            "{s}"
        );
        assert!(s.ends_with("exec \"$@\"\n"), "{s}");
    }
}
