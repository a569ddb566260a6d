//! The fault proxy in front of the real API server of `hack/cluster`: requests pass through
//! as they came, and each fault the tests rely on reaches a kube client the way the API
//! server's own would.

// Test code: it may unwrap, panic, and run past the product's 80-line bar on functions.
#![allow(
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines,
    clippy::unwrap_used
)]

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, PostParams, WatchEvent, WatchParams};
use marin3r_api_faults::{FaultProxy, FaultScope};
use marin3r_testkit::cluster::{Cluster, Held};
use marin3r_testkit::kubectl::Kubectl;

/// The cluster held beside other tests, a namespace of this test's own (deleted on drop),
/// and a proxy to the API server.
struct Env {
    ns: String,
    admin: kube::Client,
    kubectl: Kubectl,
    kubeconfig: std::path::PathBuf,
    cluster: Cluster,
    proxy: FaultProxy,
    _held: Held,
}

impl Env {
    async fn start(prefix: &str) -> Self {
        let cluster = tokio::task::spawn_blocking(Cluster::start_or_attach)
            .await
            .unwrap()
            .unwrap();
        let held = cluster.shared().unwrap();
        let millis = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis();
        let ns = format!("faults-{prefix}-{}-{millis}", std::process::id());
        let kubectl = cluster.kubectl().unwrap();
        kubectl.ok(&["create", "namespace", &ns]).await.unwrap();
        let proxy = FaultProxy::start(cluster.config().await.unwrap())
            .await
            .unwrap();
        Self {
            ns,
            admin: cluster.client().await.unwrap(),
            kubectl,
            kubeconfig: cluster.kubeconfig().to_path_buf(),
            cluster,
            proxy,
            _held: held,
        }
    }

    async fn maps(&self, user: &str) -> Api<ConfigMap> {
        let endpoint = self.proxy.endpoint(user).await.unwrap();
        Api::namespaced(endpoint.client().unwrap(), &self.ns)
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if let Ok(kubectl) = marin3r_testkit::tools::kubectl() {
            let _ = std::process::Command::new(kubectl)
                .args(["delete", "namespace", &self.ns, "--wait=false"])
                .env("KUBECONFIG", &self.kubeconfig)
                .output();
        }
    }
}

fn map(name: &str) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.into());
    cm
}

/// The next watch event that is not a bookmark.
async fn next_event(
    watch: &mut (impl futures::Stream<Item = kube::Result<WatchEvent<ConfigMap>>> + Unpin),
) -> kube::Result<Option<WatchEvent<ConfigMap>>> {
    loop {
        match watch.try_next().await? {
            Some(WatchEvent::Bookmark(_)) => {}
            other => return Ok(other),
        }
    }
}

fn code(err: &kube::Error) -> Option<u16> {
    match err {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_pass_through_and_queued_errors_reach_only_their_scope_and_client() {
    let env = Env::start("errors").await;
    let maps = env.maps("controller").await;
    let other = env.maps("bystander").await;
    maps.create(&PostParams::default(), &map("a"))
        .await
        .unwrap();
    // Written through the proxy, read directly from the API server.
    let direct: Api<ConfigMap> = Api::namespaced(env.admin.clone(), &env.ns);
    assert!(direct.get_opt("a").await.unwrap().is_some());

    let faults = env.proxy.faults();
    faults.fail_next(1, 409, FaultScope::Write);
    faults.fail_next_for(1, 500, FaultScope::Any, "contr");
    // The bystander is served; the controller's read takes the 500, its write the 409.
    assert!(other.get("a").await.is_ok());
    assert_eq!(code(&maps.get("a").await.unwrap_err()), Some(500));
    let err = maps
        .create(&PostParams::default(), &map("b"))
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(409), "{err}");
    assert!(
        direct.get_opt("b").await.unwrap().is_none(),
        "a failed write never reached the API server"
    );
    assert_eq!(faults.pending(), 0);
    assert_eq!(
        faults.served(),
        std::collections::BTreeMap::from([(409, 1), (500, 1)])
    );
    maps.create(&PostParams::default(), &map("b"))
        .await
        .unwrap();

    // A refused prefix answers its code until allowed; the API server's own errors pass.
    let prefix = format!("/api/v1/namespaces/{}/configmaps/a", env.ns);
    faults.deny(&prefix, 403);
    assert_eq!(code(&maps.get("a").await.unwrap_err()), Some(403));
    assert!(maps.get("b").await.is_ok());
    faults.allow(&prefix);
    assert!(maps.get("a").await.is_ok());
    assert_eq!(code(&maps.get("nothing").await.unwrap_err()), Some(404));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_end_when_dropped_and_expire_inside_the_stream() {
    let env = Env::start("watches").await;
    let maps = env.maps("controller").await;
    let faults = env.proxy.faults();

    // Only the test's map: the namespace's controller adds `kube-root-ca.crt` of its own.
    let only_seen = WatchParams::default()
        .timeout(60)
        .fields("metadata.name=seen");
    let mut watch = maps.watch(&only_seen, "0").await.unwrap().boxed();
    maps.create(&PostParams::default(), &map("seen"))
        .await
        .unwrap();
    let event = tokio::time::timeout(Duration::from_secs(10), next_event(&mut watch)).await;
    assert!(
        matches!(event, Ok(Ok(Some(WatchEvent::Added(ref c)))) if c.metadata.name.as_deref() == Some("seen")),
        "{event:?}"
    );
    faults.drop_watches();
    let ended = tokio::time::timeout(Duration::from_secs(10), watch.next()).await;
    assert!(
        matches!(ended, Ok(None)),
        "the watch did not end: {ended:?}"
    );

    faults.fail_next(1, 410, FaultScope::Watch);
    // A read is not a watch: it passes.
    assert!(maps.get("seen").await.is_ok());
    let mut watch = maps.watch(&only_seen, "0").await.unwrap().boxed();
    let event = tokio::time::timeout(Duration::from_secs(10), next_event(&mut watch)).await;
    assert!(
        matches!(event, Ok(Ok(Some(WatchEvent::Error(ref e)))) if e.code == 410),
        "{event:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_delayed_and_unanswered_requests() {
    let env = Env::start("slow").await;
    let maps = env.maps("controller").await;
    let faults = env.proxy.faults();
    maps.create(&PostParams::default(), &map("a"))
        .await
        .unwrap();
    let path = format!("/api/v1/namespaces/{}/configmaps/a", env.ns);

    faults.hold(&path);
    let held = tokio::spawn({
        let maps = maps.clone();
        async move { maps.get("a").await.map(|_| Instant::now()) }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!held.is_finished(), "a held request was answered");
    let released = Instant::now();
    faults.release(&path);
    let answered = held.await.unwrap().unwrap();
    assert!(answered >= released);

    faults.delay_requests("configmaps", Some(Duration::from_millis(700)));
    let sent = Instant::now();
    maps.get("a").await.unwrap();
    assert!(sent.elapsed() >= Duration::from_millis(700));
    faults.delay_requests("configmaps", None);

    // A request never answered waits for the client's own timeout; the next is served.
    faults.never_answer(&path, 1);
    let mut config = env.proxy.endpoint("impatient").await.unwrap().config();
    config.read_timeout = Some(Duration::from_secs(1));
    let impatient: Api<ConfigMap> =
        Api::namespaced(kube::Client::try_from(config).unwrap(), &env.ns);
    let sent = Instant::now();
    assert!(impatient.get("a").await.is_err());
    assert!(sent.elapsed() >= Duration::from_secs(1));
    assert_eq!(faults.swallowed(), 1);
    impatient.get("a").await.unwrap();
    maps.delete("a", &DeleteParams::default()).await.unwrap();
}

/// A client's bearer token is passed on, so the API server's RBAC judges its requests, not
/// the proxy's admin credentials.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_token_is_what_the_api_server_authorizes() {
    let env = Env::start("token").await;
    env.kubectl
        .ok(&["create", "serviceaccount", "-n", &env.ns, "reader"])
        .await
        .unwrap();
    let token = env
        .kubectl
        .ok(&["create", "token", "-n", &env.ns, "reader"])
        .await
        .unwrap();
    let endpoint = env.proxy.endpoint("reader").await.unwrap();
    let kubeconfig =
        kube::config::Kubeconfig::from_yaml(&endpoint.kubeconfig(Some(token.trim()))).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    let maps: Api<ConfigMap> = Api::namespaced(kube::Client::try_from(config).unwrap(), &env.ns);
    let err = maps.list(&Default::default()).await.unwrap_err();
    let kube::Error::Api(status) = &err else {
        panic!("{err}");
    };
    assert_eq!(status.code, 403, "{err}");
    assert!(
        status
            .message
            .contains(&format!("system:serviceaccount:{}:reader", env.ns)),
        "{}",
        status.message
    );
    // Without a token the same endpoint is the admin.
    let admin: Api<ConfigMap> = Api::namespaced(endpoint.client().unwrap(), &env.ns);
    admin.list(&Default::default()).await.unwrap();
}

/// A pod endpoint speaks TLS with the API server's own certificate and names each request's
/// user after its service account token, so rules may pick one pod's service account.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_endpoint_names_users_by_their_service_account_token() {
    let env = Env::start("pods").await;
    let Some(pki) = env.cluster.pki_dir() else {
        panic!("pod endpoints need hack/cluster's PKI; this cluster is attached");
    };
    let read = |f: &str| std::fs::read_to_string(pki.join(f)).unwrap();
    let addr = env
        .proxy
        .pod_endpoint(
            "127.0.0.1:0".parse().unwrap(),
            &read("apiserver.crt"),
            &read("apiserver.key"),
        )
        .await
        .unwrap();
    for sa in ["reader", "writer"] {
        env.kubectl
            .ok(&["create", "serviceaccount", "-n", &env.ns, sa])
            .await
            .unwrap();
    }
    env.kubectl
        .ok(&[
            "create",
            "rolebinding",
            "-n",
            &env.ns,
            "view",
            "--clusterrole=view",
            &format!("--serviceaccount={}:reader", env.ns),
            &format!("--serviceaccount={}:writer", env.ns),
        ])
        .await
        .unwrap();
    let ca = first_der(&read("ca.crt"));
    let mut pods = Vec::new();
    for sa in ["reader", "writer"] {
        let token = env
            .kubectl
            .ok(&["create", "token", "-n", &env.ns, sa])
            .await
            .unwrap();
        let mut config = kube::Config::new(format!("https://{addr}").parse().unwrap());
        config.root_cert = Some(vec![ca.clone()]);
        // The name a pod calls the API server by.
        config.tls_server_name = Some("kubernetes.default.svc".into());
        config.auth_info =
            serde_json::from_value(serde_json::json!({"token": token.trim()})).unwrap();
        pods.push(Api::<ConfigMap>::namespaced(
            kube::Client::try_from(config).unwrap(),
            &env.ns,
        ));
    }
    let (reader, writer) = (&pods[0], &pods[1]);
    let faults = env.proxy.faults();
    faults.fail_next_for(
        1,
        500,
        FaultScope::Any,
        &format!("system:serviceaccount:{}:writer", env.ns),
    );
    reader.list(&Default::default()).await.unwrap();
    assert_eq!(
        code(&writer.list(&Default::default()).await.unwrap_err()),
        Some(500)
    );
    writer.list(&Default::default()).await.unwrap();
    // The token is what the API server authorizes: `view` may not write.
    let err = writer
        .create(&PostParams::default(), &map("x"))
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(403), "{err}");
}

/// The DER of the first certificate of a PEM text.
fn first_der(pem: &str) -> Vec<u8> {
    use base64::Engine as _;
    let body: String = pem
        .lines()
        .skip_while(|l| !l.starts_with("-----BEGIN CERTIFICATE"))
        .skip(1)
        .take_while(|l| !l.starts_with("-----END"))
        .collect();
    base64::engine::general_purpose::STANDARD
        .decode(body)
        .unwrap()
}

/// Each endpoint logs the request lines its clients sent, faulted ones included, and only
/// theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_logs_what_its_clients_asked() {
    let env = Env::start("log").await;
    let (logged, other) = (
        env.proxy.endpoint("logged").await.unwrap(),
        env.proxy.endpoint("other").await.unwrap(),
    );
    let maps: Api<ConfigMap> = Api::namespaced(logged.client().unwrap(), &env.ns);
    let others: Api<ConfigMap> = Api::namespaced(other.client().unwrap(), &env.ns);
    env.proxy
        .faults()
        .fail_next_for(1, 500, FaultScope::Any, "logged");
    assert!(maps.get("a").await.is_err());
    maps.create(&PostParams::default(), &map("a"))
        .await
        .unwrap();
    others.get("a").await.unwrap();
    let path = format!("/api/v1/namespaces/{}/configmaps", env.ns);
    assert_eq!(
        logged.requests(),
        [format!("GET {path}/a"), format!("POST {path}?"),],
    );
    assert_eq!(other.requests(), [format!("GET {path}/a")]);
}
