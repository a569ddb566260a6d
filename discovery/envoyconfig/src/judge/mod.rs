//! Envoy as the last judge of an EnvoyConfig: our own checks first (fast, every problem with
//! its path), then, when an Envoy binary is at hand, Envoy's validate mode on a bootstrap that
//! holds the spec's resources as the user wrote them, its message mapped back to the entry.
//!
//! A tenant's config is untrusted input, and some of it is code: no script or module a
//! tenant wrote ever runs here (`code.rs` swaps each for a neutral stand-in first), and Envoy
//! runs in a sandbox all the same (`sandbox.rs`: no file but its own libraries, no network,
//! no new process, bounded CPU, memory and time; `process.rs`: its bootstrap in memory, its
//! output bounded, its process group killed at the deadline). What reaches the user is one
//! line of Envoy's reason (`reason.rs`).
//!
//! How the resources become one bootstrap Envoy can validate without any network: listeners,
//! clusters and runtimes as static resources and layers; each route configuration inside a
//! listener of its own on a pipe address (with `validate_clusters: false` unless it says
//! otherwise, which is what Envoy assumes for one delivered by RDS); each set of endpoints
//! as the load assignment of a static cluster of its own; an ADS config source whose cluster
//! never connects, for the `ads: {}` references; each scoped route configuration as the one
//! scope of a listener of its own, and each extension config that configures an HTTP or
//! listener filter as that filter of a listener of its own (`wrap.rs`). Entries generated
//! from Kubernetes objects (Secrets, EndpointSlices) and extension configs of other kinds are
//! left to our own checks.
//!
//! Envoy stops at its first error: when the whole spec fails, its entries are judged in
//! halves until the ones that fail are found, so the error names them; one that fails only
//! with the others (two listeners on one address) is reported on the spec. A refusal naming
//! a file the config reads (a certificate on a volume, an SDS path, a GeoIP database) is no
//! refusal: that file is in the proxy's pod, not here.

mod code;
mod extensions;
mod process;
mod reason;
pub mod sandbox;
mod wrap;

pub use code::NotJudged;
pub use reason::MAX_REASON;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::convert::{Entry, entries};
use marin3r_api::EnvoyConfigSpec;
use marin3r_xds::resource::ResourceType;

/// How long one verdict may take by default (`marin3r validate`), every Envoy run included.
const BUDGET: Duration = Duration::from_secs(20);

/// How long a verdict may take in the discovery pod: well inside the webhooks' 10 s timeout
/// (`failurePolicy: Fail`), so that a slow or hung Envoy makes the config admitted on our own
/// checks rather than refused by the API server for want of an answer.
pub const ADMISSION_BUDGET: Duration = Duration::from_secs(6);

/// The most Envoy processes one `marin3r` process runs at once (each ~60 ms of CPU): a burst
/// of admissions, or a failing config judged in parts, waits its turn.
const MAX_PROCESSES: usize = 4;

static RUNNING: (std::sync::Mutex<usize>, std::sync::Condvar) =
    (std::sync::Mutex::new(0), std::sync::Condvar::new());

/// One of the [`MAX_PROCESSES`] slots, released on drop.
struct Slot;

impl Slot {
    /// A slot, or `None` when none frees up before `deadline`.
    fn take(deadline: Instant) -> Option<Self> {
        let (count, freed) = &RUNNING;
        let mut n = count.lock().unwrap_or_else(|e| e.into_inner());
        while *n >= MAX_PROCESSES {
            let left = deadline.checked_duration_since(Instant::now())?;
            n = freed
                .wait_timeout(n, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        *n += 1;
        Some(Self)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let (count, freed) = &RUNNING;
        let mut n = count.lock().unwrap_or_else(|e| e.into_inner());
        *n = n.saturating_sub(1);
        freed.notify_one();
    }
}

/// Why Envoy did not accept a config. The variant decides what becomes of it: a refusal is
/// the config's fault (refused at admission, not published), no verdict is nobody's (marin3r's
/// own checks decide).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JudgeError {
    /// Envoy refused it: each problem as `path: Envoy: message`.
    #[error("Envoy refused it: {}", .0.join("; "))]
    Refused(Vec<String>),
    /// Envoy could not be run (missing binary, timeout): no verdict.
    #[error("Envoy gave no verdict: {0}")]
    Unavailable(String),
}

/// Where the marin3r image carries Envoy (the `Dockerfile` copies it from Envoy's image).
pub const IMAGE_ENVOY: &str = "/usr/local/bin/envoy";

/// The clusters every injected sidecar's bootstrap defines, which a route may name.
pub const SIDECAR_CLUSTERS: [&str; 2] = [
    marin3r_webhook::bootstrap::XDS_CLUSTER,
    marin3r_webhook::readiness::ADMIN_CLUSTER,
];

/// The prefix of every name the judge adds to the bootstrap.
const OWN: &str = "marin3r-judge";

/// An Envoy binary that judges configs.
#[derive(Debug, Clone)]
pub struct EnvoyJudge {
    binary: PathBuf,
    /// The `marin3r` binary whose `judge-sandbox` starts each Envoy run.
    launcher: PathBuf,
    limits: sandbox::Limits,
    /// The longest one verdict may take, every Envoy run included; past it there is no
    /// verdict ([`JudgeError::Unavailable`]), or only the whole spec's when Envoy refused it.
    budget: Duration,
}

impl EnvoyJudge {
    /// A judge running `binary` through this process's own executable, which must be
    /// `marin3r` (its `judge-sandbox` command); see [`Self::with_launcher`].
    pub fn new(binary: impl Into<PathBuf>) -> Self {
        let launcher = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("marin3r"));
        Self {
            binary: binary.into(),
            launcher,
            limits: sandbox::Limits::default(),
            budget: BUDGET,
        }
        .with_budget(BUDGET)
    }

    /// The same judge, giving each verdict at most `budget` (and each Envoy run as many CPU
    /// seconds, rounded up).
    #[must_use]
    pub fn with_budget(mut self, budget: Duration) -> Self {
        self.budget = budget;
        self.limits.cpu_seconds = budget.as_secs() + u64::from(budget.subsec_nanos() > 0);
        self
    }

    /// The same judge, starting Envoy through `marin3r` at `launcher` (a program that is not
    /// this one: a test, a benchmark).
    #[must_use]
    pub fn with_launcher(mut self, launcher: impl Into<PathBuf>) -> Self {
        self.launcher = launcher.into();
        self
    }

    /// `explicit`, else `envoy` on `PATH`; `None` when there is none.
    pub fn find(explicit: Option<&Path>) -> Option<Self> {
        if let Some(path) = explicit {
            return Some(Self::new(path));
        }
        let path = std::env::var_os("PATH")?;
        std::env::split_paths(&path)
            .map(|dir| dir.join("envoy"))
            .find(|candidate| candidate.is_file())
            .map(Self::new)
    }

    /// The discovery pod's judge: `explicit`, else the Envoy the marin3r image carries
    /// ([`IMAGE_ENVOY`]), else none (said in the log either way).
    pub fn in_image(explicit: Option<&Path>) -> Option<Self> {
        let image = Path::new(IMAGE_ENVOY);
        let judge = explicit
            .map(Self::new)
            .or_else(|| image.is_file().then(|| Self::new(image)))
            .map(|j| j.with_budget(ADMISSION_BUDGET));
        match &judge {
            Some(j) => {
                let sandbox = j.sandbox();
                tracing::info!(envoy = %j.binary.display(), %sandbox, "EnvoyConfigs are judged by Envoy after marin3r's own checks");
            }
            None => tracing::info!(
                "no Envoy binary: EnvoyConfigs are judged by marin3r's own checks only"
            ),
        }
        judge
    }

    /// How much of the sandbox this machine's kernel enforces, as `judge-sandbox --check`
    /// says (`Fully`, `Partly`, `NoLandlock`), or why it cannot be entered.
    pub fn sandbox(&self) -> String {
        let out = Command::new(&self.launcher)
            .args(["judge-sandbox", "--check"])
            .env_clear()
            .stdin(std::process::Stdio::null())
            .output();
        match out {
            Ok(out) if out.status.success() => {
                reason::one_line(&String::from_utf8_lossy(&out.stdout))
            }
            Ok(out) => reason::one_line(&String::from_utf8_lossy(&out.stderr)),
            Err(e) => format!("{}: {e}", self.launcher.display()),
        }
    }

    pub fn binary(&self) -> &Path {
        &self.binary
    }

    /// The Envoy release (`1.40.0`), from `envoy --version`, asked once per binary and
    /// process (a caller asking while another asks waits for its answer).
    pub fn version(&self) -> Option<String> {
        static KNOWN: Mutex<Option<HashMap<PathBuf, Option<String>>>> = Mutex::new(None);
        let mut known = KNOWN.lock().unwrap_or_else(|e| e.into_inner());
        known
            .get_or_insert_with(HashMap::new)
            .entry(self.binary.clone())
            .or_insert_with(|| self.ask_version())
            .clone()
    }

    fn ask_version(&self) -> Option<String> {
        let out = Command::new(&self.binary)
            .arg("--version")
            .env_clear()
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        // "<path>  version: <sha>/1.40.0/Clean/RELEASE/BoringSSL"
        let (_, build) = text.split_once("version: ")?;
        build.split('/').nth(1).map(str::to_owned)
    }

    /// Envoy's verdict on every entry of `spec`.
    pub fn judge(&self, spec: &EnvoyConfigSpec) -> Result<(), JudgeError> {
        let entries = entries(spec).map_err(|e| JudgeError::Refused(vec![e.to_string()]))?;
        self.judge_entries(&entries)
    }

    /// Envoy's verdict on `entries`, attributed to the entry that fails.
    pub fn judge_entries(&self, entries: &[Entry]) -> Result<(), JudgeError> {
        if entries.is_empty() {
            return Ok(());
        }
        let neutral = code::neutral(entries).map_err(|e| JudgeError::Unavailable(e.to_string()))?;
        let entries = neutral.as_slice();
        let deadline = Instant::now() + self.budget;
        let whole = match self.run(&bootstrap(entries), deadline) {
            Ok(()) => return Ok(()),
            Err(Run::Unavailable(why)) => return Err(JudgeError::Unavailable(why)),
            Err(Run::Refused(whole)) => whole,
        };
        // A file the proxy's pod may have (a Lua module, a certificate on a volume) is not
        // here: no refusal, but what else Envoy would say is hidden behind it, so the
        // entries are still judged apart.
        let everything: Vec<&Entry> = entries.iter().collect();
        let a_file = reads_a_file(&whole, &everything);
        if a_file {
            tracing::info!(reason = %whole, "Envoy cannot read a file of the proxy's pod; that part is left to marin3r's own checks");
        }
        if let [one] = entries {
            return match a_file {
                true => Ok(()),
                false => Err(JudgeError::Refused(vec![format!(
                    "{}: Envoy: {whole}",
                    one.path
                )])),
            };
        }
        // Which entries Envoy refuses: the clusters first, without the rest (they name
        // nothing the spec defines), then every other entry beside the clusters that passed,
        // since listeners and routes name clusters. Each by halving: a group Envoy accepts
        // holds no culprit, a refused one is split until single entries are left, so one bad
        // resource among a hundred costs a dozen runs, not a hundred. A run the budget cuts
        // short blames nobody.
        let (clusters, others): (Vec<&Entry>, Vec<&Entry>) = entries
            .iter()
            .partition(|e| e.kind == ResourceType::Cluster);
        let mut refused = self.culprits(&clusters, &[], deadline);
        let good: Vec<Entry> = clusters
            .iter()
            .filter(|c| !refused.iter().any(|(r, _)| std::ptr::eq(*r, **c)))
            .map(|c| (*c).clone())
            .collect();
        refused.extend(self.culprits(&others, &good, deadline));
        let mut refused: Vec<String> = refused
            .into_iter()
            .map(|(e, m)| format!("{}: Envoy: {m}", e.path))
            .collect();
        if refused.is_empty() {
            if a_file {
                return Ok(());
            }
            refused.push(format!(
                "spec: Envoy, with every resource together: {whole}"
            ));
        }
        Err(JudgeError::Refused(refused))
    }

    /// The entries of `group` Envoy refuses beside `context`, each with Envoy's reason, in
    /// order: the group judged whole, and when refused, each half likewise (in parallel).
    /// A refusal naming a file the entry reads blames nobody (see [`reads_a_file`]).
    fn culprits<'e>(
        &self,
        group: &[&'e Entry],
        context: &[Entry],
        deadline: Instant,
    ) -> Vec<(&'e Entry, String)> {
        if group.is_empty() {
            return Vec::new();
        }
        let mut together = context.to_vec();
        together.extend(group.iter().map(|e| (*e).clone()));
        let reason = match self.run(&bootstrap(&together), deadline) {
            Err(Run::Refused(reason)) => reason,
            Ok(()) | Err(Run::Unavailable(_)) => return Vec::new(),
        };
        if let [one] = group {
            return match reads_a_file(&reason, &[one]) {
                true => Vec::new(),
                false => vec![(*one, reason)],
            };
        }
        let (left, right) = group.split_at(group.len() / 2);
        std::thread::scope(|scope| {
            let right = scope.spawn(|| self.culprits(right, context, deadline));
            let mut found = self.culprits(left, context, deadline);
            found.extend(right.join().unwrap_or_default());
            found
        })
    }

    /// Runs `envoy --mode validate` on a whole `bootstrap`: `Ok`, Envoy's message, or why
    /// Envoy gave no verdict.
    pub fn validate(&self, bootstrap: &Value) -> Result<(), JudgeError> {
        let deadline = Instant::now() + self.budget;
        self.run(bootstrap, deadline).map_err(|r| match r {
            Run::Refused(m) => JudgeError::Refused(vec![m]),
            Run::Unavailable(m) => JudgeError::Unavailable(m),
        })
    }

    fn run(&self, bootstrap: &Value, deadline: Instant) -> Result<(), Run> {
        let late = || Run::Unavailable(format!("Envoy gave no verdict within {:?}", self.budget));
        let Some(_slot) = Slot::take(deadline) else {
            return Err(late());
        };
        let args = [
            "--mode",
            "validate",
            "--log-level",
            "critical",
            "--disable-hot-restart",
            "--concurrency",
            "1",
        ];
        let input = bootstrap.to_string().into_bytes();
        match process::run(
            &self.launcher,
            &self.binary,
            &self.limits,
            &args,
            &input,
            deadline,
        ) {
            process::Ended::Accepted => Ok(()),
            process::Ended::Refused(output) => Err(Run::Refused(reason::of(&output))),
            process::Ended::Late => Err(late()),
            process::Ended::Killed(signal) => Err(Run::Unavailable(format!(
                "Envoy died of signal {signal} judging it (a crash, or its CPU limit)"
            ))),
            process::Ended::NoEnvoy(why) => Err(Run::Unavailable(reason::one_line(&why))),
        }
    }
}

/// Whether Envoy's `reason` is a file one of `entries` names, which the judge cannot have:
/// it lives in the proxy's pod.
fn reads_a_file(reason: &str, entries: &[&Entry]) -> bool {
    reason::names_a_file_of(reason, entries.iter().map(|e| &e.value))
}

/// How one Envoy run ended, when not with `Ok`.
enum Run {
    Refused(String),
    Unavailable(String),
}

/// The bootstrap holding `entries` (see the module's documentation).
pub fn bootstrap(entries: &[Entry]) -> Value {
    let (mut listeners, mut clusters, mut layers) = (Vec::new(), Vec::new(), Vec::new());
    for (i, e) in entries.iter().enumerate() {
        match e.kind {
            ResourceType::Listener => listeners.push(e.value.clone()),
            ResourceType::Cluster => clusters.push(e.value.clone()),
            ResourceType::Route => listeners.push(route_listener(i, &e.value)),
            ResourceType::Endpoint => clusters.push(json!({
                "name": format!("{OWN}-endpoints-{i}"),
                "type": "STATIC",
                "connect_timeout": "1s",
                "load_assignment": e.value,
            })),
            ResourceType::Runtime => layers.push(json!({
                "name": format!("{OWN}-runtime-{i}"),
                "static_layer": e.value.get("layer").cloned().unwrap_or(json!({})),
            })),
            ResourceType::ScopedRoute => listeners.push(wrap::scoped_route_listener(i, &e.value)),
            ResourceType::ExtensionConfig => {
                listeners.extend(wrap::extension_listener(i, &e.value));
            }
            ResourceType::Secret => {}
        }
    }
    // What the sidecar's bootstrap defines, which routes may name: stand-ins, unless the
    // spec defines a cluster of that name itself.
    for name in SIDECAR_CLUSTERS {
        if !clusters.iter().any(|c| c.get("name") == Some(&json!(name))) {
            clusters.push(static_cluster(name, false));
        }
    }
    clusters.push(static_cluster(&format!("{OWN}-xds"), true));
    let mut bootstrap = json!({
        "node": {"id": OWN, "cluster": OWN},
        // Never bound in validate mode; without it, some extensions (a tap transport socket)
        // crash Envoy 1.40.
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "static_resources": {"listeners": listeners, "clusters": clusters},
        "dynamic_resources": {"ads_config": {
            "api_type": "GRPC",
            "transport_api_version": "V3",
            "grpc_services": [{"envoy_grpc": {"cluster_name": format!("{OWN}-xds")}}],
        }},
    });
    if !layers.is_empty() {
        bootstrap["layered_runtime"] = json!({ "layers": layers });
    }
    bootstrap
}

/// A static cluster `name` that never connects (port 1), speaking HTTP/2 when `grpc`.
fn static_cluster(name: &str, grpc: bool) -> Value {
    let mut cluster = json!({
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 1}}}}]}],
        },
    });
    if grpc {
        cluster["typed_extension_protocol_options"] = json!({
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        });
    }
    cluster
}

/// A route configuration served by RDS, judged inside a listener of its own.
fn route_listener(i: usize, route: &Value) -> Value {
    let mut route = route.clone();
    if let Some(map) = route.as_object_mut() {
        map.entry("validate_clusters").or_insert(json!(false));
    }
    json!({
        "name": format!("{OWN}-routes-{i}"),
        "address": {"pipe": {"path": format!("/{OWN}/routes-{i}")}},
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": format!("{OWN}-routes-{i}"),
                "route_config": route,
                "http_filters": [{
                    "name": "envoy.filters.http.router",
                    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
                }],
            },
        }]}],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_and_endpoints_are_wrapped_and_rds_keeps_its_default() {
        let entries = [
            Entry {
                path: "spec.resources[0].value".into(),
                kind: ResourceType::Route,
                value: json!({"name": "local"}),
            },
            Entry {
                path: "spec.resources[1].value".into(),
                kind: ResourceType::Endpoint,
                value: json!({"cluster_name": "app"}),
            },
        ];
        let b = bootstrap(&entries);
        let listener = &b["static_resources"]["listeners"][0];
        let hcm = &listener["filter_chains"][0]["filters"][0]["typed_config"];
        assert_eq!(hcm["route_config"]["validate_clusters"], false);
        assert_eq!(
            b["static_resources"]["clusters"][0]["load_assignment"]["cluster_name"],
            "app"
        );
    }
}
