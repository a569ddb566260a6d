//! The real test cluster: the single-node Kubernetes `hack/cluster` runs on this machine,
//! started once and shared by every test (`hack/cluster up --reuse`), or any cluster named by
//! `MARIN3R_E2E_KUBECONFIG=PATH` (kind, a real one) that already has our images.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Condvar, Mutex, Weak};

use anyhow::{Context, anyhow, bail};

use crate::kubectl::Kubectl;

/// Names a kubeconfig to attach to instead of starting `hack/cluster`.
pub const KUBECONFIG_ENV: &str = "MARIN3R_E2E_KUBECONFIG";

/// A cluster the tests run on.
#[derive(Debug, Clone)]
pub struct Cluster {
    kubeconfig: PathBuf,
    /// Started (or reused) through `hack/cluster`, so `load` can import images into it.
    local: bool,
}

/// The cluster held by a scenario ([`Cluster::exclusive`], [`Cluster::shared`]) until it
/// drops (with every other guard of the same hold, [`Cluster::shared_for`]).
#[derive(Debug)]
pub struct Held {
    _file: Arc<std::fs::File>,
    /// A test's turn in its process's hold alone ([`Alone`]).
    _turn: Option<Turn>,
}

/// The cluster held alone by this process, lent in turn to its tests that need it alone
/// ([`Cluster::exclusive`], [`Cluster::operator_stopped`]). It is taken once and kept while
/// any of them runs or waits, so tests that follow one another (libtest hands out tests in
/// name order: a file's tests come together) do not each wait for every scenario of the
/// other test processes to end: with a hold per test, those waits cost the suite minutes.
#[derive(Debug)]
struct Alone {
    cluster: Cluster,
    file: Arc<std::fs::File>,
    state: Mutex<AloneState>,
    turn_ended: Condvar,
    /// When the hold was taken, for [`log_hold`].
    since: std::time::Instant,
}

/// Appends `event` to the file `MARIN3R_HOLD_LOG` names, if set, as
/// `<unix seconds> <pid> <event>`: `hack/test` sums from it how long each test process held
/// the cluster alone, and which tests it held it for, which is what makes the suite wait.
fn log_hold(event: &str) {
    let Some(path) = std::env::var_os("MARIN3R_HOLD_LOG") else {
        return;
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    let line = format!("{now:.1} {} {event}\n", std::process::id());
    if let Ok(mut file) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = std::io::Write::write_all(&mut file, line.as_bytes());
    }
}

#[derive(Debug)]
struct AloneState {
    /// A test has the turn.
    busy: bool,
    /// Tests waiting for it.
    waiting: usize,
    /// The in-cluster operator's replicas before a test stopped it (`Some(None)`: it is not
    /// installed); `None` while it runs as installed.
    stopped_from: Option<Option<String>>,
}

/// Each cluster's [`Alone`] hold in this process, by kubeconfig (locked on its own while the
/// hold is taken, which waits for the other processes).
static ALONE: Mutex<BTreeMap<PathBuf, Arc<Mutex<Weak<Alone>>>>> = Mutex::new(BTreeMap::new());

/// One test's turn in its process's [`Alone`] hold; the next waiting test's when it drops.
#[derive(Debug)]
struct Turn {
    alone: Arc<Alone>,
    /// When the turn began, and whose it is, for [`log_hold`].
    since: std::time::Instant,
    test: Option<String>,
}

/// How long a process keeps the cluster alone after its last such test: libtest starts the
/// next test on the thread the last one freed, and one that needs the cluster alone too then
/// joins at once instead of waiting behind every other process.
const LINGER: std::time::Duration = std::time::Duration::from_secs(3);

impl Drop for Turn {
    fn drop(&mut self) {
        log_hold(&format!(
            "turn {:.1}s {}",
            self.since.elapsed().as_secs_f64(),
            self.test.as_deref().unwrap_or("?")
        ));
        // No test of this process waits: the operator runs again now, not when the hold
        // ends (a process may exit before then, and nothing would start it).
        let waiting = self.alone.state().map(|s| s.waiting).unwrap_or_default();
        if waiting == 0 {
            let _ = self.alone.start_operator();
        }
        let mut state = self.alone.state.lock().unwrap_or_else(|e| e.into_inner());
        state.busy = false;
        self.alone.turn_ended.notify_one();
        drop(state);
        let alone = Arc::clone(&self.alone);
        std::thread::spawn(move || {
            std::thread::sleep(LINGER);
            drop(alone);
        });
    }
}

impl Alone {
    /// The in-cluster operator stopped (scaled to 0, its pods gone) if it is installed.
    fn stop_operator(&self) -> anyhow::Result<()> {
        if self.state()?.stopped_from.is_some() {
            return Ok(());
        }
        let deployment = format!("deployment/{OPERATOR_DEPLOYMENT}");
        let replicas = self
            .cluster
            .kubectl_blocking(&[
                "get",
                "-n",
                OPERATOR_NAMESPACE,
                &deployment,
                "--ignore-not-found",
                "-o",
                "jsonpath={.spec.replicas}",
            ])?
            .trim()
            .to_owned();
        let installed = !replicas.is_empty();
        if installed {
            self.scale_operator("0")?;
            self.cluster.kubectl_blocking(&[
                "wait",
                "-n",
                OPERATOR_NAMESPACE,
                "--for=delete",
                "pod",
                "-l",
                OPERATOR_PODS,
                "--timeout=120s",
            ])?;
        }
        self.state()?.stopped_from = Some(installed.then_some(replicas));
        Ok(())
    }

    /// The in-cluster operator scaled back to what it was if a test stopped it (not waiting
    /// for it to be ready, as it was started before).
    fn start_operator(&self) -> anyhow::Result<()> {
        let Some(replicas) = self.state()?.stopped_from.take() else {
            return Ok(());
        };
        if let Some(replicas) = replicas {
            self.scale_operator(&replicas)?;
        }
        Ok(())
    }

    fn scale_operator(&self, replicas: &str) -> anyhow::Result<()> {
        let deployment = format!("deployment/{OPERATOR_DEPLOYMENT}");
        let replicas = format!("--replicas={replicas}");
        let scale = ["scale", "-n", OPERATOR_NAMESPACE, &deployment, &replicas];
        self.cluster.kubectl_blocking(&scale).map(drop)
    }

    fn state(&self) -> anyhow::Result<std::sync::MutexGuard<'_, AloneState>> {
        self.state
            .lock()
            .map_err(|_| anyhow!("the cluster's hold alone is poisoned"))
    }
}

impl Drop for Alone {
    fn drop(&mut self) {
        let _ = self.start_operator();
        log_hold(&format!(
            "released {:.1}s",
            self.since.elapsed().as_secs_f64()
        ));
    }
}

/// The holds of this process by the test that took them, so a test that holds the cluster
/// already (two planes in one test) is given its own hold again instead of queueing behind
/// an exclusive waiter that waits for that very hold.
static HOLDS: Mutex<BTreeMap<String, Weak<std::fs::File>>> = Mutex::new(BTreeMap::new());

/// Notes `held` as test `test`'s, for [`Cluster::shared_for`].
fn remember(test: Option<String>, held: &Held) -> anyhow::Result<()> {
    let Some(test) = test else {
        return Ok(());
    };
    let mut holds = HOLDS
        .lock()
        .map_err(|_| anyhow!("the holds' lock is poisoned"))?;
    holds.retain(|_, file| file.strong_count() > 0);
    holds.insert(test, Arc::downgrade(&held._file));
    Ok(())
}

/// The test running on this thread: libtest runs each test on a thread named after it (the
/// tokio worker and blocking threads that a test also uses are named for the runtime, and
/// are no test's).
pub fn current_test() -> Option<String> {
    let thread = std::thread::current();
    let name = thread.name()?;
    (name != "main" && !name.starts_with("tokio-")).then(|| name.to_owned())
}

/// marin3r's in-cluster operator, as `manifests/` installs it.
const OPERATOR_NAMESPACE: &str = "marin3r-system";
const OPERATOR_DEPLOYMENT: &str = "marin3r-operator";
const OPERATOR_PODS: &str = "app.kubernetes.io/name=marin3r,app.kubernetes.io/component=operator";

/// The cluster held [`Cluster::exclusive`]ly with marin3r's in-cluster operator stopped
/// ([`Cluster::operator_stopped`]); the operator starts again when the next test of this
/// process to hold the cluster alone needs it, or when none is left.
#[derive(Debug)]
pub struct OperatorStopped {
    _held: Held,
}

/// `hack/cluster up --reuse` runs once per test process; its kubeconfig path (or the error,
/// as text: every later caller gets it too).
static STARTED: Mutex<Option<Result<PathBuf, String>>> = Mutex::new(None);

fn hack_cluster() -> PathBuf {
    crate::tools::repo_root().join("hack/cluster")
}

fn run(args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(hack_cluster())
        .args(args)
        .output()
        .with_context(|| format!("running hack/cluster {}", args.join(" ")))?;
    if !out.status.success() {
        bail!(
            "hack/cluster {} failed ({}):\n{}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl Cluster {
    /// The cluster `MARIN3R_E2E_KUBECONFIG` names, or else this machine's `hack/cluster`
    /// (started if it does not run; it needs root, and the first time on a machine its parts
    /// are built for several minutes).
    pub fn start_or_attach() -> anyhow::Result<Self> {
        Self::from_env_value(std::env::var_os(KUBECONFIG_ENV).as_deref())
    }

    /// What `start_or_attach` does with the given value of `MARIN3R_E2E_KUBECONFIG`.
    pub fn from_env_value(value: Option<&OsStr>) -> anyhow::Result<Self> {
        match value {
            Some(path) if !path.is_empty() => Self::attach(Path::new(path)),
            _ => Self::start(),
        }
    }

    /// This machine's `hack/cluster`, started unless it already runs.
    pub fn start() -> anyhow::Result<Self> {
        let mut started = STARTED
            .lock()
            .map_err(|_| anyhow::anyhow!("a test panicked while starting the cluster"))?;
        let result = started.get_or_insert_with(|| {
            run(&["up", "--reuse"])
                .and_then(|_| run(&["kubeconfig"]))
                .map(|out| PathBuf::from(out.trim()))
                .map_err(|e| format!("{e:#}"))
        });
        match result {
            Ok(kubeconfig) => Ok(Self {
                kubeconfig: kubeconfig.clone(),
                local: true,
            }),
            Err(e) => bail!("the test cluster did not start: {e}"),
        }
    }

    /// Any cluster, through its kubeconfig; it must already have the images the tests run.
    pub fn attach(kubeconfig: &Path) -> anyhow::Result<Self> {
        if !kubeconfig.is_file() {
            bail!(
                "{KUBECONFIG_ENV}={} does not name a kubeconfig file",
                kubeconfig.display()
            );
        }
        Ok(Self {
            kubeconfig: kubeconfig.to_path_buf(),
            local: false,
        })
    }

    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The PKI folder of this machine's `hack/cluster` (its CA, the API server's serving
    /// certificate `apiserver.crt`/`.key`...), beside its kubeconfig; `None` for an attached
    /// cluster.
    pub fn pki_dir(&self) -> Option<PathBuf> {
        self.local
            .then(|| self.kubeconfig.parent().map(|state| state.join("pki")))
            .flatten()
    }

    /// Whether this is this machine's `hack/cluster` (not one attached by kubeconfig).
    pub fn is_local(&self) -> bool {
        self.local
    }

    /// Imports an image archive (OCI or docker-archive tar) into the node's containerd, as
    /// `kind load image-archive` does, and deletes the pods that run an older image of its
    /// name, so that what their controllers start again runs this one. On an attached cluster
    /// it does nothing: that cluster must already have the image.
    pub fn load(&self, archive: &Path) -> anyhow::Result<()> {
        if !self.local {
            return Ok(());
        }
        let archive = archive
            .to_str()
            .with_context(|| format!("{} is not UTF-8", archive.display()))?;
        run(&["load", "--restart", archive]).map(|_| ())
    }

    /// Holds the whole cluster for one scenario (blocking until every scenario holding it,
    /// [`Cluster::shared`] or [`Cluster::exclusive`], has let go), across test processes: a
    /// scenario that changes marin3r's cluster-wide parts (uninstalls it, or uses the fixed
    /// `marin3r-system/instance` and `demo`) takes it. The test's turn ends when the guard
    /// drops; the process lets the cluster go once none of its tests holds or waits for it
    /// alone ([`Alone`]).
    pub fn exclusive(&self) -> anyhow::Result<Held> {
        self.exclusive_for(current_test())
    }

    /// [`Cluster::exclusive`] for test `test` ([`current_test`] taken on the test's own
    /// thread before handing the wait to another), which the hold log names.
    pub fn exclusive_for(&self, test: Option<String>) -> anyhow::Result<Held> {
        let turn = self.alone(test)?;
        turn.alone.start_operator()?;
        let held = Held {
            _file: Arc::clone(&turn.alone.file),
            _turn: Some(turn),
        };
        remember(current_test(), &held)?;
        Ok(held)
    }

    /// This test's turn in the process's [`Alone`] hold, taking that hold first when no test
    /// of this process has it.
    fn alone(&self, test: Option<String>) -> anyhow::Result<Turn> {
        let poisoned = || anyhow!("the holds alone are poisoned");
        let slot = ALONE
            .lock()
            .map_err(|_| poisoned())?
            .entry(self.kubeconfig.clone())
            .or_default()
            .clone();
        let alone = {
            let mut slot = slot.lock().map_err(|_| poisoned())?;
            match slot.upgrade() {
                Some(alone) => alone,
                None => {
                    let held = self.hold(rustix::fs::FlockOperation::LockExclusive)?;
                    let alone = Arc::new(Alone {
                        cluster: self.clone(),
                        file: held._file,
                        state: Mutex::new(AloneState {
                            busy: false,
                            waiting: 0,
                            stopped_from: None,
                        }),
                        turn_ended: Condvar::new(),
                        since: std::time::Instant::now(),
                    });
                    *slot = Arc::downgrade(&alone);
                    alone
                }
            }
        };
        let mut state = alone.state()?;
        state.waiting += 1;
        while state.busy {
            state = alone
                .turn_ended
                .wait(state)
                .map_err(|_| anyhow!("the cluster's hold alone is poisoned"))?;
        }
        state.waiting -= 1;
        state.busy = true;
        drop(state);
        Ok(Turn {
            alone,
            since: std::time::Instant::now(),
            test,
        })
    }

    /// Holds the cluster beside other scenarios that keep to their own namespaces (waiting
    /// while one holds it [`Cluster::exclusive`]ly). Released when the guard drops.
    pub fn shared(&self) -> anyhow::Result<Held> {
        self.shared_for(current_test())
    }

    /// [`Cluster::shared`] for test `test` ([`current_test`] on the test's own thread, taken
    /// before handing the wait to another thread): a test that holds the cluster already gets
    /// that hold again.
    pub fn shared_for(&self, test: Option<String>) -> anyhow::Result<Held> {
        if let Some(test) = &test {
            let holds = HOLDS
                .lock()
                .map_err(|_| anyhow!("the holds' lock is poisoned"))?;
            if let Some(file) = holds.get(test).and_then(Weak::upgrade) {
                return Ok(Held {
                    _file: file,
                    _turn: None,
                });
            }
        }
        let held = self.hold(rustix::fs::FlockOperation::LockShared)?;
        remember(test, &held)?;
        Ok(held)
    }

    /// Holds the cluster [`Cluster::exclusive`]ly and stops marin3r's in-cluster operator
    /// (`marin3r-system/marin3r-operator` scaled to 0, its pods gone) when it is installed, for
    /// a test that runs the operator's controllers itself: they reconcile every
    /// DiscoveryService and DiscoveryServiceCertificate of the cluster, and two operators on
    /// one object prove nothing. The operator is scaled back when the next test of this
    /// process to hold the cluster alone needs it running, or when none is left.
    pub fn operator_stopped(&self) -> anyhow::Result<OperatorStopped> {
        self.operator_stopped_for(current_test())
    }

    /// [`Cluster::operator_stopped`] for test `test` (see [`Cluster::exclusive_for`]).
    pub fn operator_stopped_for(&self, test: Option<String>) -> anyhow::Result<OperatorStopped> {
        let turn = self.alone(test)?;
        turn.alone.stop_operator()?;
        Ok(OperatorStopped {
            _held: Held {
                _file: Arc::clone(&turn.alone.file),
                _turn: Some(turn),
            },
        })
    }

    /// kubectl run to completion on this thread; its stdout, or an error with its stderr.
    fn kubectl_blocking(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = Command::new(crate::tools::kubectl()?)
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .output()
            .with_context(|| format!("running kubectl {}", args.join(" ")))?;
        if !out.status.success() {
            bail!(
                "kubectl {} failed ({}): {}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// flock(2) on a file named after the kubeconfig (std's File::lock is newer than our
    /// MSRV), taken in turn: flock(2) lets new shared holds in while an exclusive one waits,
    /// so with tests holding it shared back to back (two test processes side by side) an
    /// exclusive one would wait for ever. Every hold first takes a second file, the turn,
    /// exclusively, and lets it go once it has the first: while an exclusive hold waits for
    /// the shared ones to end, it keeps the turn, and new holds wait behind it.
    fn hold(&self, how: rustix::fs::FlockOperation) -> anyhow::Result<Held> {
        let lock = |path: PathBuf, how| -> anyhow::Result<std::fs::File> {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .with_context(|| format!("opening {}", path.display()))?;
            rustix::fs::flock(&file, how).with_context(|| format!("locking {}", path.display()))?;
            Ok(file)
        };
        let [turn, file] = self.hold_files();
        let turn = lock(turn, rustix::fs::FlockOperation::LockExclusive)?;
        let file = lock(file, how)?;
        drop(turn);
        Ok(Held {
            _file: Arc::new(file),
            _turn: None,
        })
    }

    /// The turn and the lock of [`Cluster::hold`], in the temporary folder, named after the
    /// kubeconfig.
    fn hold_files(&self) -> [PathBuf; 2] {
        let name = self
            .kubeconfig
            .canonicalize()
            .unwrap_or_else(|_| self.kubeconfig.clone())
            .to_string_lossy()
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325_u64, |hash, b| {
                (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
            });
        let base = std::env::temp_dir().join(format!("marin3r-e2e-cluster-{name:016x}"));
        [base.with_extension("turn"), base.with_extension("lock")]
    }

    /// The client configuration of the cluster's admin, from its kubeconfig.
    pub async fn config(&self) -> anyhow::Result<kube::Config> {
        let kubeconfig = kube::config::Kubeconfig::read_from(&self.kubeconfig)
            .with_context(|| format!("reading {}", self.kubeconfig.display()))?;
        kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .with_context(|| format!("loading {}", self.kubeconfig.display()))
    }

    /// A client of the cluster's API server, from its kubeconfig.
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        let config = self.config().await?;
        kube::Client::try_from(config).context("building a client from the kubeconfig")
    }

    /// kubectl bound to the cluster's kubeconfig.
    pub fn kubectl(&self) -> anyhow::Result<Kubectl> {
        Kubectl::new(&self.kubeconfig)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cluster attached to a kubeconfig of its own; its hold files are removed with it.
    struct Throwaway {
        cluster: Cluster,
        kubeconfig: tempfile::NamedTempFile,
    }

    impl Throwaway {
        fn new() -> Self {
            let kubeconfig = tempfile::NamedTempFile::new().unwrap();
            let cluster = Cluster::from_env_value(Some(kubeconfig.path().as_os_str())).unwrap();
            Self {
                cluster,
                kubeconfig,
            }
        }
    }

    impl Drop for Throwaway {
        fn drop(&mut self) {
            for file in self.cluster.hold_files() {
                let _ = std::fs::remove_file(file);
            }
        }
    }

    #[test]
    fn attaching_to_a_missing_kubeconfig_names_the_variable() {
        let err = Cluster::from_env_value(Some(OsStr::new("/nonexistent/marin3r-kubeconfig")))
            .unwrap_err()
            .to_string();
        assert!(err.contains(KUBECONFIG_ENV), "{err}");
        assert!(err.contains("/nonexistent/marin3r-kubeconfig"), "{err}");
    }

    #[test]
    fn shared_holds_coexist_and_an_exclusive_one_waits_for_them() {
        let throwaway = Throwaway::new();
        let cluster = &throwaway.cluster;
        let first = cluster.shared().unwrap();
        let second = cluster.shared().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let waiting = std::thread::spawn({
            let cluster = cluster.clone();
            move || {
                let held = cluster.exclusive().unwrap();
                tx.send(()).unwrap();
                drop(held);
            }
        });
        assert!(
            rx.recv_timeout(std::time::Duration::from_millis(300))
                .is_err(),
            "held exclusively beside two shared holds"
        );
        drop(first);
        drop(second);
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("the exclusive hold once the shared ones went");
        waiting.join().unwrap();
    }

    /// An exclusive hold that waits is not passed by shared holds asked for after it (two
    /// test processes holding it shared back to back would starve it), and a test that holds
    /// the cluster already gets its hold again at once, not behind that waiter.
    #[test]
    fn an_exclusive_hold_waits_its_turn_and_a_test_never_waits_for_itself() {
        use std::sync::mpsc::channel;
        use std::time::Duration;
        let throwaway = Throwaway::new();
        let cluster = &throwaway.cluster;
        let first = cluster.shared().unwrap();
        let (tx, rx) = channel();
        let exclusive = std::thread::spawn({
            let (cluster, tx) = (cluster.clone(), tx.clone());
            move || {
                let held = cluster.exclusive().unwrap();
                tx.send("exclusive").unwrap();
                std::thread::sleep(Duration::from_millis(200));
                drop(held);
            }
        });
        std::thread::sleep(Duration::from_millis(300));
        let later = std::thread::Builder::new()
            .name("another test".into())
            .spawn({
                let cluster = cluster.clone();
                move || {
                    let held = cluster.shared().unwrap();
                    tx.send("shared").unwrap();
                    drop(held);
                }
            })
            .unwrap();
        // This test's own second hold is its first one again.
        let again = cluster.shared().unwrap();
        assert!(
            rx.recv_timeout(Duration::from_millis(300)).is_err(),
            "held beside this test's hold"
        );
        drop((first, again));
        let order: Vec<&str> = (0..2)
            .map(|_| rx.recv_timeout(Duration::from_secs(10)).unwrap())
            .collect();
        assert_eq!(order, ["exclusive", "shared"]);
        exclusive.join().unwrap();
        later.join().unwrap();
    }

    /// Tests of one process that need the cluster alone take turns in one hold: the next
    /// one's turn comes as the last ends, before anyone else's hold, even one asked for
    /// earlier.
    #[test]
    fn a_processs_tests_alone_take_turns_in_one_hold() {
        use std::sync::mpsc::channel;
        use std::time::Duration;
        let throwaway = Throwaway::new();
        let cluster = &throwaway.cluster;
        let first = cluster.exclusive().unwrap();
        let (tx, rx) = channel();
        let shared = std::thread::Builder::new()
            .name("a test of another process".into())
            .spawn({
                let (cluster, tx) = (cluster.clone(), tx.clone());
                move || {
                    let held = cluster.shared().unwrap();
                    tx.send("shared").unwrap();
                    drop(held);
                }
            })
            .unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let next = std::thread::spawn({
            let cluster = cluster.clone();
            move || {
                let held = cluster.exclusive().unwrap();
                tx.send("next alone").unwrap();
                std::thread::sleep(Duration::from_millis(200));
                drop(held);
            }
        });
        assert!(
            rx.recv_timeout(Duration::from_millis(300)).is_err(),
            "held beside the first test's turn"
        );
        drop(first);
        let order: Vec<&str> = (0..2)
            .map(|_| rx.recv_timeout(Duration::from_secs(10)).unwrap())
            .collect();
        assert_eq!(order, ["next alone", "shared"]);
        next.join().unwrap();
        shared.join().unwrap();
    }

    /// The next test libtest starts on a freed thread joins the hold alone if it comes within
    /// the linger, before a hold asked for by another process meanwhile.
    #[test]
    fn a_test_alone_right_after_the_last_joins_its_hold() {
        use std::time::Duration;
        let throwaway = Throwaway::new();
        let cluster = &throwaway.cluster;
        let first = cluster.exclusive().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let shared = std::thread::Builder::new()
            .name("a test of another process".into())
            .spawn({
                let cluster = cluster.clone();
                move || {
                    let held = cluster.shared().unwrap();
                    tx.send(()).unwrap();
                    drop(held);
                }
            })
            .unwrap();
        std::thread::sleep(Duration::from_millis(200));
        drop(first);
        std::thread::sleep(Duration::from_millis(100));
        let again = cluster.exclusive().unwrap();
        assert!(rx.try_recv().is_err(), "another hold came in between");
        drop(again);
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the other hold once the linger ended");
        shared.join().unwrap();
    }

    #[test]
    fn an_attached_cluster_is_not_loaded_into() {
        let throwaway = Throwaway::new();
        let cluster = &throwaway.cluster;
        assert!(!cluster.is_local());
        assert_eq!(cluster.kubeconfig(), throwaway.kubeconfig.path());
        // No hack/cluster is run for an attached cluster, even for an archive that is not there.
        cluster.load(Path::new("/nonexistent/image.tar")).unwrap();
    }
}
