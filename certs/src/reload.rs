//! Certificate files that are re-read while a server runs, for the webhook's serving pair and
//! the xDS server's pair and client CA alike.
//!
//! Kubernetes updates a mounted Secret by renaming a `..data` symlink, so the files' content is
//! polled (watching one inode would miss the swap). The content is turned into the value a
//! server uses (a rustls certified key, a whole server configuration) by a build function; a
//! half-written or mismatched set fails that build and the last good value keeps being served.
//! Each content is built once: a bad set is reported once, not on every poll.

use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use sha2::{Digest, Sha256};

/// A file that could not be read.
#[derive(Debug, thiserror::Error)]
#[error("reading {path}: {source}")]
pub struct ReadError {
    pub path: PathBuf,
    pub source: std::io::Error,
}

/// Turns the content of the `N` files (in the order their paths were given) into the value.
pub type Build<T, E, const N: usize> = Box<dyn Fn(&[Vec<u8>; N]) -> Result<T, E> + Send + Sync>;

/// The value built from the newest usable content of `N` files.
pub struct Reloading<T, E, const N: usize> {
    paths: [PathBuf; N],
    build: Build<T, E, N>,
    current: ArcSwap<T>,
    /// Hash of the content last built, good or bad.
    seen: Mutex<[u8; 32]>,
}

impl<T, E, const N: usize> fmt::Debug for Reloading<T, E, N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reloading")
            .field("paths", &self.paths)
            .finish_non_exhaustive()
    }
}

impl<T, E, const N: usize> Reloading<T, E, N>
where
    E: From<ReadError> + fmt::Display,
{
    /// Reads and builds the value once; fails (with the build's error, which should name the
    /// file and the problem) when the files are missing or unusable.
    pub fn load(paths: [PathBuf; N], build: Build<T, E, N>) -> Result<Self, E> {
        let content = read_all(&paths)?;
        let value = build(&content)?;
        Ok(Self {
            seen: Mutex::new(fingerprint(&content)),
            paths,
            build,
            current: ArcSwap::from_pointee(value),
        })
    }

    /// Re-reads the files and, when their content changed and builds, serves the new value.
    /// Returns whether a new value is now served.
    pub fn reload(&self) -> Result<bool, E> {
        let content = read_all(&self.paths)?;
        let seen = fingerprint(&content);
        {
            let mut last = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            if *last == seen {
                return Ok(false);
            }
            *last = seen;
        }
        let value = (self.build)(&content)?;
        self.current.store(Arc::new(value));
        Ok(true)
    }

    /// The value served now.
    pub fn current(&self) -> Arc<T> {
        self.current.load_full()
    }

    /// The files, in the order the build function receives their content.
    pub fn paths(&self) -> &[PathBuf; N] {
        &self.paths
    }

    /// Re-reads the files every `interval` until `shutdown` resolves, logging each change and
    /// each content that cannot be used.
    pub async fn watch(self: Arc<Self>, interval: Duration, shutdown: impl Future<Output = ()>) {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(shutdown);
        let first = self.paths.first().map(|p| p.display().to_string());
        loop {
            tokio::select! {
                () = &mut shutdown => return,
                _ = ticker.tick() => {}
            }
            match self.reload() {
                Ok(true) => tracing::info!(file = first, "certificate files changed: reloaded"),
                Ok(false) => {}
                // Mid-update (certificate and key not swapped together yet) or broken: keep
                // serving what works and look again on the next tick.
                Err(e) => {
                    tracing::warn!(error = %e, "certificate files changed but cannot be used; keeping the previous ones")
                }
            }
        }
    }
}

fn read_all<const N: usize>(paths: &[PathBuf; N]) -> Result<[Vec<u8>; N], ReadError> {
    let mut content: [Vec<u8>; N] = std::array::from_fn(|_| Vec::new());
    for (path, slot) in paths.iter().zip(content.iter_mut()) {
        *slot = std::fs::read(path).map_err(|source| ReadError {
            path: path.clone(),
            source,
        })?;
    }
    Ok(content)
}

fn fingerprint(content: &[Vec<u8>]) -> [u8; 32] {
    let mut h = Sha256::new();
    for file in content {
        // Lengths first, so moving bytes from one file to the next changes the hash.
        h.update((file.len() as u64).to_be_bytes());
        h.update(file);
    }
    h.finalize().into()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code

    use super::*;

    #[derive(Debug, thiserror::Error)]
    enum TestError {
        #[error(transparent)]
        Read(#[from] ReadError),
        #[error("{0}")]
        Bad(String),
    }

    /// Builds the sum of two files' numbers, refusing odd sums (a "mismatched pair").
    fn even_sum() -> Build<u64, TestError, 2> {
        Box::new(|[a, b]| {
            let parse = |f: &Vec<u8>| -> Result<u64, TestError> {
                let text = std::str::from_utf8(f).map_err(|e| TestError::Bad(e.to_string()))?;
                text.trim()
                    .parse()
                    .map_err(|e| TestError::Bad(format!("{text:?}: {e}")))
            };
            let sum = parse(a)? + parse(b)?;
            if sum % 2 == 1 {
                return Err(TestError::Bad(format!("odd sum {sum}")));
            }
            Ok(sum)
        })
    }

    #[test]
    fn new_content_is_served_and_bad_content_keeps_the_last_good_value() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::write(&a, "1").unwrap();
        std::fs::write(&b, "3").unwrap();
        let r = Reloading::load([a.clone(), b.clone()], even_sum()).unwrap();
        assert_eq!(*r.current(), 4);
        assert!(!r.reload().unwrap(), "unchanged files are not rebuilt");

        std::fs::write(&a, "2").unwrap();
        let err = r.reload().unwrap_err().to_string();
        assert!(err.contains("odd sum 5"), "{err}");
        assert_eq!(*r.current(), 4, "a bad set keeps the previous value");
        assert!(
            !r.reload().unwrap(),
            "a bad set is built (and reported) once"
        );

        std::fs::write(&b, "4").unwrap();
        assert!(r.reload().unwrap());
        assert_eq!(*r.current(), 6);

        std::fs::remove_file(&b).unwrap();
        let err = r.reload().unwrap_err().to_string();
        assert!(
            err.contains("reading") && err.contains(&*b.to_string_lossy()),
            "{err}"
        );
        assert_eq!(*r.current(), 6, "a missing file keeps the previous value");
    }

    #[test]
    fn a_missing_or_bad_file_fails_the_first_load_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::write(&a, "1").unwrap();
        let err = Reloading::load([a.clone(), b.clone()], even_sum()).unwrap_err();
        assert!(err.to_string().contains(&*b.to_string_lossy()), "{err}");
        std::fs::write(&b, "x").unwrap();
        let err = Reloading::load([a, b], even_sum()).unwrap_err();
        assert!(err.to_string().contains("\"x\""), "{err}");
    }

    #[test]
    fn moving_bytes_between_files_is_a_change() {
        assert_ne!(
            fingerprint(&[b"ab".to_vec(), b"c".to_vec()]),
            fingerprint(&[b"a".to_vec(), b"bc".to_vec()])
        );
    }

    #[tokio::test]
    async fn the_watch_picks_up_changes_until_shut_down() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::write(&a, "1").unwrap();
        std::fs::write(&b, "1").unwrap();
        let r = Arc::new(Reloading::load([a.clone(), b], even_sum()).unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(r.clone().watch(Duration::from_millis(10), async {
            let _ = stopped.await;
        }));
        std::fs::write(&a, "3").unwrap();
        for _ in 0..500 {
            tokio::time::sleep(Duration::from_millis(10)).await;
            if *r.current() == 4 {
                break;
            }
        }
        assert_eq!(*r.current(), 4);
        stop.send(()).unwrap();
        task.await.unwrap();
    }
}
