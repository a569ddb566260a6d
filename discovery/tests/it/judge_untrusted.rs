//! A tenant's EnvoyConfig is untrusted input, and some of it is code. A review put a
//! Lua filter in one that read the discovery pod's server key and raised it as an error:
//! Envoy's validate mode ran it, and the key came back in the admission denial. Here the
//! same attack, plus a file written, a process forked and a connection opened, goes through
//! each path that judges a config (the webhook, the EnvoyConfig controller, `marin3r
//! validate`) and must get nothing: no content in any verdict, status or warning, no file,
//! no process, no connection. And Envoy's sandbox holds even when the script does run.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use marin3r_envoyconfig::judge::EnvoyJudge;
use marin3r_envoyconfig::rules::validator_with;
use marin3r_webhook::validate::review_envoy_config;
use serde_json::{Value, json};

use crate::support;
use support::plane::{NS, Plane, condition};

/// What the attacker wants: a file's content, and side effects.
struct Bait {
    dir: tempfile::TempDir,
    secret: String,
    marker: String,
    listener: TcpListener,
}

impl Bait {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let secret = format!("SECRET-{}-{}", std::process::id(), rand_suffix());
        std::fs::write(dir.path().join("tls.key"), &secret).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let marker = format!("{}.{}", 30 + std::process::id() % 20, rand_suffix() % 1000);
        Self {
            dir,
            secret,
            marker,
            listener,
        }
    }

    fn key(&self) -> PathBuf {
        self.dir.path().join("tls.key")
    }

    fn written(&self) -> PathBuf {
        self.dir.path().join("written")
    }

    /// That script, and more: read the key, write a file, fork a sleeper, connect out, and
    /// raise what was read as the error Envoy reports.
    fn script(&self) -> String {
        let port = self.listener.local_addr().unwrap().port();
        format!(
            r#"local ffi = require('ffi')
ffi.cdef[[int fork(void); unsigned int sleep(unsigned int); int socket(int, int, int);
int connect(int, const void *, unsigned int);]]
local w = io.open('{written}', 'w') if w then w:write('x') w:close() end
if ffi.C.fork() == 0 then os.execute('sleep {marker}') ffi.C.sleep(30) os.exit(0) end
os.execute('sleep {marker} &')
local sa = ffi.new('uint8_t[16]') sa[0] = 2 sa[2] = {hi} sa[3] = {lo} sa[4] = 127 sa[7] = 1
ffi.C.connect(ffi.C.socket(2, 1, 0), sa, 16)
local f = io.open('{key}')
error('LEAK:' .. (f and f:read('*a') or 'nothing'))"#,
            written = self.written().display(),
            marker = self.marker,
            key = self.key().display(),
            hi = port >> 8,
            lo = port & 0xff,
        )
    }

    /// A listener whose only filter before the router is the attacker's Lua.
    fn listener_value(&self) -> Value {
        json!({
            "name": "http", "address": {"socket_address": {"address": "0.0.0.0", "port_value": 8080}},
            "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": "http",
                "route_config": {"name": "local", "virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [
                    {"match": {"prefix": "/"}, "direct_response": {"status": 200}}]}]},
                "http_filters": [
                    {"name": "envoy.filters.http.lua", "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
                        "default_source_code": {"inline_string": self.script()}}},
                    {"name": "envoy.filters.http.router", "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}},
                ],
            }}]}],
        })
    }

    fn spec(&self, node: &str) -> Value {
        json!({"nodeID": node, "resources": [{"type": "listener", "value": self.listener_value()}]})
    }

    /// Nothing leaked in `said`, and nothing happened.
    fn assert_untouched(&self, said: &str) {
        assert!(!said.contains(&self.secret), "the secret leaked: {said}");
        assert!(!said.contains("LEAK:"), "the script ran: {said}");
        std::thread::sleep(Duration::from_millis(200));
        assert!(!self.written().exists(), "the script wrote a file");
        assert!(
            self.listener.accept().is_err(),
            "the script opened a connection"
        );
        assert!(!sleeper_running(&self.marker), "the script left a process");
    }
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::from(d.subsec_nanos()))
}

fn sleeper_running(marker: &str) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|p| {
        std::fs::read(p.path().join("cmdline"))
            .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&format!("sleep\0{marker}")))
    })
}

fn envoy() -> PathBuf {
    marin3r_testkit::tools::envoy().expect("hack/install-tools installs Envoy")
}

fn judge() -> EnvoyJudge {
    EnvoyJudge::new(envoy()).with_launcher(env!("CARGO_BIN_EXE_marin3r"))
}

#[test]
fn the_webhook_runs_no_tenant_code_and_leaks_nothing() {
    let bait = Bait::new();
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "u-1", "namespace": "shop", "operation": "CREATE",
            "kind": {"group": "marin3r.3scale.net", "version": "v1alpha1", "kind": "EnvoyConfig"},
            "resource": {"group": "marin3r.3scale.net", "version": "v1alpha1", "resource": "envoyconfigs"},
            "object": {"apiVersion": "marin3r.3scale.net/v1alpha1", "kind": "EnvoyConfig",
                "metadata": {"name": "evil", "namespace": "shop"}, "spec": bait.spec("shop")},
        }
    });
    let validator = validator_with(false, Some(judge()));
    let (out, _) = review_envoy_config(review.to_string().as_bytes(), &validator).unwrap();
    // The config around the script is valid: admitted, its code left to the proxy.
    assert_eq!(out["response"]["allowed"], true, "{out}");
    bait.assert_untouched(&out.to_string());
}

#[test]
fn marin3r_validate_runs_no_tenant_code_and_leaks_nothing() {
    let bait = Bait::new();
    let manifest = bait.dir.path().join("evil.json");
    let object = json!({"apiVersion": "marin3r.3scale.net/v1alpha1", "kind": "EnvoyConfig",
        "metadata": {"name": "evil", "namespace": "shop"}, "spec": bait.spec("shop")});
    std::fs::write(&manifest, object.to_string()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_marin3r"))
        .args(["validate", "--envoy"])
        .arg(envoy())
        .arg("-f")
        .arg(&manifest)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{said}");
    assert!(said.contains("accepted by Envoy"), "{said}");
    bait.assert_untouched(&said);
}

#[test]
fn the_controller_runs_no_tenant_code_and_leaks_nothing() {
    let bait = Bait::new();
    let judge = judge();
    let plane = Plane::start_with(&[NS], move |config, _| config.judge = Some(judge));
    let ns = plane.ns(NS);
    plane.apply(ns, "evil", bait.spec("evil-node"));
    let ec = plane.wait_in_sync(ns, "evil");
    let status = serde_json::to_string(&ec.status).unwrap();
    assert!(
        condition(&ec, "CacheOutOfSync").is_none_or(|c| c.status == "False"),
        "{status}"
    );
    bait.assert_untouched(&status);
    let events: kube::Api<k8s_openapi::api::core::v1::Event> =
        kube::Api::namespaced(plane.client.clone(), ns);
    let events = plane.rt.block_on(events.list(&Default::default())).unwrap();
    bait.assert_untouched(&serde_json::to_string(&events.items).unwrap());
}

/// Defence in depth: with the script handed to Envoy as written (what `code.rs` prevents),
/// the sandbox still lets it read nothing, write nothing, start nothing, reach nothing.
#[test]
fn the_sandbox_holds_when_the_script_runs() {
    let bait = Bait::new();
    let bootstrap = json!({
        "node": {"id": "n", "cluster": "n"},
        "static_resources": {"listeners": [bait.listener_value()]},
    });
    let config = bait.dir.path().join("bootstrap.json");
    std::fs::write(&config, bootstrap.to_string()).unwrap();
    let out = sandboxed(&config);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The script ran (its error is Envoy's refusal), and found nothing to read.
    assert!(said.contains("LEAK:nothing"), "{said}");
    assert!(!said.contains(&bait.secret), "{said}");
    std::thread::sleep(Duration::from_millis(200));
    assert!(!bait.written().exists(), "the script wrote a file");
    assert!(bait.listener.accept().is_err(), "a connection was opened");
    assert!(!sleeper_running(&bait.marker), "a process was left");
}

fn sandboxed(config: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_marin3r"))
        .arg("judge-sandbox")
        .arg("--config")
        .arg(config)
        .arg("--")
        .arg(envoy())
        .args(["--mode", "validate", "--log-level", "critical"])
        .env_clear()
        .output()
        .unwrap()
}

/// This machine's kernel enforces the whole sandbox (Linux 6.12 or newer): the test machines
/// must, or the tests above prove less than they say.
#[test]
fn this_machine_enforces_the_whole_sandbox() {
    assert_eq!(
        judge().sandbox(),
        "Fully",
        "the judge's sandbox is only partly enforced here: Landlock ABI 6 (Linux 6.12) is needed"
    );
}
