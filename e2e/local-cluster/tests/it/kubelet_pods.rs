//! The pod runner with real processes, driven without an API server: pod networks, volumes,
//! Service names, probes, the kill fault and cleanup. Needs root (namespaces) and python3.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use marin3r_local_cluster::kubelet::{ImageMap, Node, NodeConfig, PodHandle, StaticObjects, net};

const SERVER: &str = marin3r_local_cluster::kubelet::PROBE_SERVER_PY;

fn python() -> String {
    let out = std::process::Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3 is needed for the pod runner tests");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

fn node() -> Arc<Node> {
    let images = ImageMap::new()
        .with_envoy(marin3r_testkit::tools::envoy().unwrap())
        .with("probe-server", python());
    Node::start(NodeConfig {
        images,
        ..Default::default()
    })
    .unwrap()
}

fn from_yaml<T: serde::de::DeserializeOwned>(json: &str) -> T {
    serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {json}"))
}

fn server_pod(name: &str, app: &str, extra_container: &str, volumes: &str) -> Pod {
    let script = serde_json::to_string(SERVER).unwrap();
    from_yaml(&format!(
        r#"{{"metadata": {{"name": "{name}", "namespace": "ns1", "uid": "uid-{name}", "labels": {{"app": "{app}"}}}},
            "spec": {{"containers": [{{
                "name": "server", "image": "registry.local/probe-server:1",
                "command": ["python3", "-c", {script}],
                "env": [{{"name": "POD_NAME", "valueFrom": {{"fieldRef": {{"fieldPath": "metadata.name"}}}}}}],
                "readinessProbe": {{"httpGet": {{"path": "/", "port": 8080}}, "periodSeconds": 1}}
                {extra_container}
            }}], "volumes": [{volumes}]}}}}"#
    ))
}

fn get(url: &str) -> String {
    marin3r_testkit::envoy::get_body(url).unwrap_or_else(|e| format!("GET failed: {e:#}"))
}

fn assert_cleaned(prefix: &str) {
    assert!(
        !net::netns_names().iter().any(|n| n.starts_with(prefix)),
        "netns left"
    );
    assert!(
        !net::link_names().iter().any(|n| n.starts_with(prefix)),
        "links left"
    );
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(prefix), "mounts left: {mounts}");
    assert!(
        !std::env::temp_dir().join(prefix).exists(),
        "run folder left"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pods_listen_on_the_same_port_and_the_host_reaches_each_by_ip() {
    let node = node();
    let prefix = node.prefix();
    let objects = Arc::new(StaticObjects::default());
    let a = PodHandle::start(&node, &server_pod("a", "a", "", ""), objects.clone()).unwrap();
    let b = PodHandle::start(&node, &server_pod("b", "b", "", ""), objects.clone()).unwrap();
    a.wait_ready(Duration::from_secs(20)).await.unwrap();
    b.wait_ready(Duration::from_secs(20)).await.unwrap();
    assert_ne!(a.ip(), b.ip());
    assert_eq!(get(&format!("http://{}:8080/", a.ip())), "ok a ");
    assert_eq!(get(&format!("http://{}:8080/", b.ip())), "ok b ");
    assert_eq!(get(&format!("http://{}:8080/hostname", a.ip())), "a");
    assert_eq!(get(&format!("http://{}:8080/env/POD_NAME", b.ip())), "b");
    let status = a.status();
    assert_eq!(status.pod_ip.as_deref(), Some(a.ip()));
    assert_eq!(status.host_ip, Some(node.host_ip().to_string()));
    let cs = &status.container_statuses.unwrap()[0];
    assert!(cs.ready && cs.started == Some(true) && cs.state.as_ref().unwrap().running.is_some());
    a.stop(Duration::from_secs(5)).await;
    b.stop(Duration::from_secs(5)).await;
    drop(node);
    assert_cleaned(&prefix);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_resolves_service_names_to_the_serving_pod() {
    let node = node();
    let objects = Arc::new(StaticObjects::default());
    let web =
        PodHandle::start(&node, &server_pod("web-1", "web", "", ""), objects.clone()).unwrap();
    web.wait_ready(Duration::from_secs(20)).await.unwrap();
    let mut seen: Pod = server_pod("web-1", "web", "", "");
    seen.status = Some(web.status());
    objects.put_pod(seen);
    objects.put_service(from_yaml::<Service>(
        r#"{"metadata": {"name": "web", "namespace": "ns1"}, "spec": {"selector": {"app": "web"}, "ports": [{"port": 8080}]}}"#,
    ));
    let client = PodHandle::start(
        &node,
        &server_pod("client", "client", "", ""),
        objects.clone(),
    )
    .unwrap();
    client.wait_ready(Duration::from_secs(20)).await.unwrap();
    for name in ["web", "web.ns1", "web.ns1.svc", "web.ns1.svc.cluster.local"] {
        assert_eq!(
            get(&format!("http://{}:8080/resolve/{name}", client.ip())),
            web.ip(),
            "{name}"
        );
    }
    // The pod reaches the Service's pod by name from inside its own network namespace.
    let hosts = get(&format!("http://{}:8080/file/etc/hosts", client.ip()));
    assert!(
        hosts.contains(&format!("{}\tclient", client.ip())),
        "{hosts}"
    );
    // A Service added later appears after a refresh.
    objects.put_service(from_yaml::<Service>(
        r#"{"metadata": {"name": "web2", "namespace": "ns1"}, "spec": {"selector": {"app": "web"}}}"#,
    ));
    client.refresh(None);
    assert_eq!(
        get(&format!("http://{}:8080/resolve/web2.ns1.svc", client.ip())),
        web.ip()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_virtual_ip_forwards_to_a_ready_serving_pod_on_its_target_port() {
    let node = node();
    let prefix = node.prefix();
    // The host's MAC on the bridge must not change as pods come and go, or pods lose the
    // host (the API server, virtual IPs) until their ARP entry expires.
    let bridge_mac = || {
        let out = std::process::Command::new("ip")
            .args(["-o", "link", "show", &format!("{prefix}br")])
            .output()
            .unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        text.split_whitespace()
            .skip_while(|w| *w != "link/ether")
            .nth(1)
            .unwrap()
            .to_owned()
    };
    let mac = bridge_mac();
    let objects = Arc::new(StaticObjects::default());
    let mut pods = Vec::new();
    for name in ["web-1", "web-2"] {
        let pod = server_pod(name, "web", "", "");
        let handle = PodHandle::start(&node, &pod, objects.clone()).unwrap();
        handle.wait_ready(Duration::from_secs(20)).await.unwrap();
        let mut seen = pod;
        seen.status = Some(handle.status());
        objects.put_pod(seen.clone());
        pods.push((handle, seen));
    }
    objects.put_service(from_yaml::<Service>(
        r#"{"metadata": {"name": "web", "namespace": "ns1"}, "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}}"#,
    ));
    objects.put_service(from_yaml::<Service>(
        r#"{"metadata": {"name": "direct", "namespace": "ns1"}, "spec": {"clusterIP": "None", "selector": {"app": "web"}, "ports": [{"port": 8080}]}}"#,
    ));
    let proxy = marin3r_local_cluster::kubelet::service_proxy::ServiceProxy::new(
        node.clone(),
        objects.clone() as Arc<dyn marin3r_local_cluster::kubelet::Objects>,
    )
    .unwrap();
    proxy.sync();
    let vip = node.service_ip("ns1", "web").expect("a virtual IP");
    assert_eq!(node.service_ip("ns1", "direct"), None, "headless");
    assert!(!pods.iter().any(|(h, _)| h.ip() == vip.to_string()));

    // Port 80 of the virtual IP is port 8080 of a ready pod.
    let url = format!("http://{vip}:80/");
    let first = get(&url);
    assert!(first.starts_with("ok web-"), "{first}");
    assert_eq!(get(&url), first, "one client keeps its pod");
    // A pod's hosts file names the virtual IP; a headless Service names a pod.
    let client = PodHandle::start(
        &node,
        &server_pod("client", "client", "", ""),
        objects.clone(),
    )
    .unwrap();
    client.wait_ready(Duration::from_secs(20)).await.unwrap();
    assert_eq!(
        get(&format!("http://{}:8080/resolve/web.ns1.svc", client.ip())),
        vip.to_string()
    );
    let direct = get(&format!("http://{}:8080/resolve/direct", client.ip()));
    assert!(pods.iter().any(|(h, _)| h.ip() == direct), "{direct}");
    assert_eq!(bridge_mac(), mac, "three pods joined the bridge");

    // The serving pod starts terminating: new connections go to the other one.
    let (serving, other) = if first.starts_with("ok web-1") {
        (0, 1)
    } else {
        (1, 0)
    };
    let mut terminating = pods[serving].1.clone();
    terminating.metadata.deletion_timestamp = Some(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()),
    );
    objects.put_pod(terminating.clone());
    let name = |i: usize| pods[i].1.metadata.name.clone().unwrap();
    assert!(get(&url).starts_with(&format!("ok {}", name(other))));
    // Only the terminating pod is left ready: it still serves.
    objects.remove_pod("ns1", &name(other));
    assert!(get(&url).starts_with(&format!("ok {}", name(serving))));
    // No ready pod: the connection is refused.
    objects.remove_pod("ns1", &name(serving));
    let refused = marin3r_testkit::envoy::get_body(&url);
    assert!(refused.is_err(), "{refused:?}");

    // The Service goes away: so does its address.
    objects.remove_service("ns1", "web");
    proxy.sync();
    assert_eq!(node.service_ip("ns1", "web"), None);
    assert!(
        std::net::TcpStream::connect_timeout(&(vip, 80).into(), Duration::from_secs(1)).is_err()
    );
    drop(client);
    assert_eq!(bridge_mac(), mac, "a pod left the bridge");
    drop((proxy, pods));
    drop(node);
    assert_cleaned(&prefix);
}

const ENVOY_BOOTSTRAP: &str = r#"
admin:
  address: {socket_address: {address: 0.0.0.0, port_value: 9901}}
static_resources:
  listeners:
  - name: hello
    address: {socket_address: {address: 0.0.0.0, port_value: 8000}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: hello
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {prefix: "/"}
                direct_response: {status: 200, body: {inline_string: "hello from envoy"}}
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_reads_its_bootstrap_from_a_mounted_config_map_and_secrets_update_in_place() {
    let node = node();
    let prefix = node.prefix();
    let objects = Arc::new(StaticObjects::default());
    let mut cm: ConfigMap = from_yaml(r#"{"metadata": {"name": "bootstrap", "namespace": "ns1"}}"#);
    cm.data = Some([("envoy.yaml".to_owned(), ENVOY_BOOTSTRAP.to_owned())].into());
    objects.put_config_map(cm);
    let secret = |v: &str| -> Secret {
        from_yaml(&format!(
            r#"{{"metadata": {{"name": "tls", "namespace": "ns1"}}, "data": {{"tls.crt": "{}"}}}}"#,
            b64(v)
        ))
    };
    objects.put_secret(secret("first"));
    let pod: Pod = from_yaml(&format!(
        r#"{{"metadata": {{"name": "envoy", "namespace": "ns1", "uid": "u1"}},
            "spec": {{"containers": [
              {{"name": "envoy", "image": "envoyproxy/envoy:v1.40.0",
                "command": ["envoy"], "args": ["-c", "/etc/envoy/bootstrap/config.yaml", "--concurrency", "1"],
                "volumeMounts": [{{"name": "bootstrap", "mountPath": "/etc/envoy/bootstrap", "readOnly": true}}],
                "readinessProbe": {{"httpGet": {{"path": "/ready", "port": 9901}}, "periodSeconds": 1}}}},
              {{"name": "files", "image": "probe-server",
                "command": ["python3", "-c", {script}],
                "volumeMounts": [{{"name": "tls", "mountPath": "/etc/envoy/tls/client", "readOnly": true}}]}}
            ], "volumes": [
              {{"name": "bootstrap", "configMap": {{"name": "bootstrap", "items": [{{"key": "envoy.yaml", "path": "config.yaml"}}]}}}},
              {{"name": "tls", "secret": {{"secretName": "tls"}}}}
            ]}}}}"#,
        script = serde_json::to_string(SERVER).unwrap()
    ));
    let envoy = PodHandle::start(&node, &pod, objects.clone()).unwrap();
    envoy.wait_ready(Duration::from_secs(30)).await.unwrap();
    assert_eq!(
        get(&format!("http://{}:8000/", envoy.ip())),
        "hello from envoy"
    );
    let read = |path: &str| get(&format!("http://{}:8080/file/{path}", envoy.ip()));
    assert_eq!(read("etc/envoy/tls/client/tls.crt"), "first");
    // Read-only is honoured inside the container.
    let hosts_dir_before = std::fs::read_link(envoy.volume_dir("tls").join("..data")).unwrap();
    objects.put_secret(secret("second"));
    envoy.refresh(None);
    let after = std::fs::read_link(envoy.volume_dir("tls").join("..data")).unwrap();
    assert_ne!(hosts_dir_before, after, "a new ..data target");
    assert_eq!(read("etc/envoy/tls/client/tls.crt"), "second");
    assert!(read("etc/envoy/tls/client/..data/tls.crt") == "second");
    // The host's /etc has no trace of the mount points.
    assert!(!std::path::Path::new("/etc/envoy/bootstrap").exists());
    envoy.stop(Duration::from_secs(5)).await;
    drop(node);
    assert_cleaned(&prefix);
}

fn b64(s: &str) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes = s.as_bytes();
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, b)| acc | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_process_is_restarted_and_an_unknown_image_waits_with_a_pull_error() {
    let node = node();
    let objects = Arc::new(StaticObjects::default());
    let pod = PodHandle::start(&node, &server_pod("k", "k", "", ""), objects.clone()).unwrap();
    pod.wait_ready(Duration::from_secs(20)).await.unwrap();
    pod.kill_container("server").unwrap();
    let mut rx = pod.watch_status();
    tokio::time::timeout(
        Duration::from_secs(20),
        rx.wait_for(|s| {
            let cs = &s.container_statuses.as_ref().unwrap()[0];
            cs.restart_count == 1 && cs.ready
        }),
    )
    .await
    .expect("restarted and ready again")
    .unwrap();
    let cs = pod.status().container_statuses.unwrap().remove(0);
    let last = cs.last_state.unwrap().terminated.unwrap();
    assert_eq!((last.exit_code, last.signal), (137, Some(9)));
    assert!(
        pod.kill_container("nope")
            .unwrap_err()
            .to_string()
            .contains("nope")
    );

    let bad: Pod = from_yaml(
        r#"{"metadata": {"name": "bad", "namespace": "ns1"}, "spec": {"containers": [{"name": "c", "image": "nginx:1.27"}]}}"#,
    );
    let bad = PodHandle::start(&node, &bad, objects.clone()).unwrap();
    let mut rx = bad.watch_status();
    let status = tokio::time::timeout(
        Duration::from_secs(10),
        rx.wait_for(|s| {
            s.container_statuses.iter().flatten().any(|c| {
                c.state
                    .as_ref()
                    .and_then(|s| s.waiting.as_ref())
                    .and_then(|w| w.reason.as_deref())
                    == Some("ErrImagePull")
            })
        }),
    )
    .await
    .unwrap()
    .unwrap()
    .clone();
    assert_eq!(status.phase.as_deref(), Some("Pending"));
    let message = status.container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .waiting
        .unwrap()
        .message
        .unwrap();
    assert!(
        message.contains("nginx:1.27") && message.contains("--image"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leftovers_of_a_dead_run_are_removed() {
    // A run id nobody owns: its namespace and link are stale.
    let stale = "m3rdead0";
    let ns = format!("{stale}-1");
    let link = format!("{stale}br");
    std::process::Command::new("ip")
        .args(["netns", "add", &ns])
        .status()
        .unwrap();
    std::process::Command::new("ip")
        .args(["link", "add", &link, "type", "bridge"])
        .status()
        .unwrap();
    std::fs::create_dir_all(std::env::temp_dir().join(stale)).unwrap();
    net::cleanup_stale();
    assert!(!net::netns_names().contains(&ns));
    assert!(!net::link_names().contains(&link));
    assert!(!std::env::temp_dir().join(stale).exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_containers_run_first_and_share_empty_dirs() {
    let node = node();
    let objects = Arc::new(StaticObjects::default());
    let pod = |name: &str, init_code: &str, policy: &str| -> Pod {
        from_yaml(&format!(
            r#"{{"metadata": {{"name": "{name}", "namespace": "ns1", "uid": "u-{name}"}},
                "spec": {{"restartPolicy": "{policy}",
                  "initContainers": [{{"name": "init", "image": "probe-server",
                    "command": ["python3", "-c", "open('/etc/m3r-test/work/x', 'w').write('from init'); raise SystemExit({init_code})"],
                    "volumeMounts": [{{"name": "work", "mountPath": "/etc/m3r-test/work"}}]}}],
                  "containers": [{{"name": "server", "image": "probe-server",
                    "command": ["python3", "-c", {script}],
                    "volumeMounts": [{{"name": "work", "mountPath": "/etc/m3r-test/work"}}],
                    "readinessProbe": {{"tcpSocket": {{"port": 8080}}, "periodSeconds": 1}}}}],
                  "volumes": [{{"name": "work", "emptyDir": {{}}}}]}}}}"#,
            script = serde_json::to_string(SERVER).unwrap()
        ))
    };
    let ok = PodHandle::start(&node, &pod("ok", "0", "Always"), objects.clone()).unwrap();
    ok.wait_ready(Duration::from_secs(20)).await.unwrap();
    assert_eq!(
        get(&format!("http://{}:8080/file/etc/m3r-test/work/x", ok.ip())),
        "from init"
    );
    let status = ok.status();
    let init = &status.init_container_statuses.unwrap()[0];
    let done = init.state.as_ref().unwrap().terminated.as_ref().unwrap();
    assert_eq!(
        (done.exit_code, done.reason.as_deref()),
        (0, Some("Completed"))
    );
    let initialized = status
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "Initialized")
        .unwrap();
    assert_eq!(initialized.status, "True");

    let failing = PodHandle::start(&node, &pod("failing", "3", "Never"), objects.clone()).unwrap();
    let mut rx = failing.watch_status();
    let status = tokio::time::timeout(
        Duration::from_secs(20),
        rx.wait_for(|s| s.phase.as_deref() == Some("Failed")),
    )
    .await
    .expect("the pod fails")
    .unwrap()
    .clone();
    let main = &status.container_statuses.unwrap()[0];
    let waiting = main.state.as_ref().unwrap().waiting.as_ref().unwrap();
    assert_eq!(waiting.reason.as_deref(), Some("PodInitializing"));
    let init = &status.init_container_statuses.unwrap()[0];
    assert_eq!(
        init.state
            .as_ref()
            .unwrap()
            .terminated
            .as_ref()
            .unwrap()
            .exit_code,
        3
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn liveness_failures_restart_and_stop_escalates_to_sigkill_after_the_grace() {
    let node = node();
    let objects = Arc::new(StaticObjects::default());
    // Liveness on a path that answers 500: the container is killed and restarted.
    let mut unhealthy = server_pod("unhealthy", "x", "", "");
    let container = &mut unhealthy.spec.as_mut().unwrap().containers[0];
    container.liveness_probe = Some(from_yaml(
        r#"{"httpGet": {"path": "/file/no/such/file", "port": 8080}, "periodSeconds": 1, "failureThreshold": 2}"#,
    ));
    let pod = PodHandle::start(&node, &unhealthy, objects.clone()).unwrap();
    let mut rx = pod.watch_status();
    tokio::time::timeout(
        Duration::from_secs(30),
        rx.wait_for(|s| {
            s.container_statuses
                .iter()
                .flatten()
                .any(|c| c.restart_count >= 1)
        }),
    )
    .await
    .expect("restarted after failed liveness probes")
    .unwrap();

    // A process that ignores SIGTERM is killed once the grace period is over.
    let stubborn: Pod = from_yaml(
        r#"{"metadata": {"name": "stubborn", "namespace": "ns1"},
            "spec": {"containers": [{"name": "c", "image": "probe-server",
              "command": ["python3", "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(600)"]}]}}"#,
    );
    let stubborn = PodHandle::start(&node, &stubborn, objects.clone()).unwrap();
    let log = stubborn.log_path("c");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("up")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "never started: {}",
            stubborn.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pid = stubborn.status().container_statuses.unwrap()[0]
        .container_id
        .clone()
        .unwrap()
        .trim_start_matches("local://")
        .to_owned();
    let started = std::time::Instant::now();
    stubborn.stop(Duration::from_secs(1)).await;
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(5),
        "{took:?}"
    );
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "process {pid} survived"
    );
}

const SDS_BOOTSTRAP: &str = r#"
admin:
  address: {socket_address: {address: 0.0.0.0, port_value: 9901}}
static_resources:
  listeners:
  - name: tls
    address: {socket_address: {address: 0.0.0.0, port_value: 8443}}
    filter_chains:
    - transport_socket:
        name: envoy.transport_sockets.tls
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext
          common_tls_context:
            tls_certificate_sds_secret_configs:
            - name: server
              sds_config:
                path_config_source:
                  path: /etc/envoy/bootstrap/sds.yaml
                  watched_directory: {path: /etc/envoy/tls/server}
      filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: tls
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {prefix: "/"}
                direct_response: {status: 200, body: {inline_string: "tls"}}
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
"#;

const SDS_FILE: &str = r#"
resources:
- "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret
  name: server
  tls_certificate:
    certificate_chain: {filename: /etc/envoy/tls/server/tls.crt}
    private_key: {filename: /etc/envoy/tls/server/tls.key}
"#;

/// The serial as Envoy's admin `/certs` prints it: lowercase hex, no colons or leading zeros.
fn serial_of(pem: &str) -> String {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
    format!("{:x}", pem.parse_x509().unwrap().serial)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_picks_up_a_rotated_secret_through_the_data_symlink_swap() {
    let node = node();
    let objects = Arc::new(StaticObjects::default());
    let ca = marin3r_local_cluster::pki::Ca::new("envoy-ca").unwrap();
    let issue = || ca.server("envoy", &[]).unwrap();
    let tls_secret = |cert: &marin3r_local_cluster::pki::Issued| -> Secret {
        let mut s: Secret =
            from_yaml(r#"{"metadata": {"name": "server-tls", "namespace": "ns1"}}"#);
        s.string_data = Some(
            [
                ("tls.crt".to_owned(), cert.cert_pem.clone()),
                ("tls.key".to_owned(), cert.key_pem.clone()),
            ]
            .into(),
        );
        s
    };
    let first = issue();
    objects.put_secret(tls_secret(&first));
    let mut cm: ConfigMap = from_yaml(r#"{"metadata": {"name": "bootstrap", "namespace": "ns1"}}"#);
    cm.data = Some(
        [
            ("envoy.yaml".to_owned(), SDS_BOOTSTRAP.to_owned()),
            ("sds.yaml".to_owned(), SDS_FILE.to_owned()),
        ]
        .into(),
    );
    objects.put_config_map(cm);
    let pod: Pod = from_yaml(
        r#"{"metadata": {"name": "sds", "namespace": "ns1", "uid": "sds"},
            "spec": {"containers": [{"name": "envoy", "image": "envoyproxy/envoy:v1.40.0",
                "command": ["envoy"], "args": ["-c", "/etc/envoy/bootstrap/envoy.yaml", "--service-node", "sds", "--service-cluster", "sds", "--concurrency", "1"],
                "volumeMounts": [
                  {"name": "bootstrap", "mountPath": "/etc/envoy/bootstrap", "readOnly": true},
                  {"name": "tls", "mountPath": "/etc/envoy/tls/server", "readOnly": true}],
                "readinessProbe": {"httpGet": {"path": "/ready", "port": 9901}, "periodSeconds": 1}}],
              "volumes": [
                {"name": "bootstrap", "configMap": {"name": "bootstrap"}},
                {"name": "tls", "secret": {"secretName": "server-tls"}}]}}"#,
    );
    let envoy = PodHandle::start(&node, &pod, objects.clone()).unwrap();
    envoy.wait_ready(Duration::from_secs(30)).await.unwrap();
    let certs = || get(&format!("http://{}:9901/certs", envoy.ip()));
    let pid_of = |envoy: &PodHandle| {
        envoy.status().container_statuses.unwrap()[0]
            .container_id
            .clone()
    };
    let pid = pid_of(&envoy);
    let before = certs();
    assert!(before.contains(&serial_of(&first.cert_pem)), "{before}");

    for _ in 0..std::env::var("M3R_ROTATIONS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
    {
        objects.put_secret(tls_secret(&issue()));
        envoy.refresh(None);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let second = issue();
    objects.put_secret(tls_secret(&second));
    envoy.refresh(None);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let now = certs();
        if now.contains(&serial_of(&second.cert_pem)) {
            assert!(!now.contains(&serial_of(&first.cert_pem)), "{now}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "Envoy kept the old certificate: {now}\n{}",
            envoy.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Reloaded in place: the same process.
    assert_eq!(pid_of(&envoy), pid, "{}", envoy.logs());
}

/// The waiting reason and message of a pod's first container, once it has one.
async fn waiting(node: &Arc<Node>, pod: &str) -> (String, String) {
    let pod: Pod = from_yaml(pod);
    let handle = PodHandle::start(node, &pod, Arc::new(StaticObjects::default())).unwrap();
    let mut rx = handle.watch_status();
    let status = tokio::time::timeout(
        Duration::from_secs(10),
        rx.wait_for(|s| {
            s.container_statuses.iter().flatten().any(|c| {
                c.state
                    .as_ref()
                    .and_then(|s| s.waiting.as_ref())
                    .and_then(|w| w.reason.as_deref())
                    .is_some_and(|r| r != "ContainerCreating")
            })
        }),
    )
    .await
    .unwrap()
    .unwrap()
    .clone();
    let w = status.container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .waiting
        .unwrap();
    (w.reason.unwrap(), w.message.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_pinned_image_and_a_root_image_under_run_as_non_root_do_not_start() {
    const PINNED: &str = "marin3r:v0.1.0";
    let images = ImageMap::new()
        .with_envoy(marin3r_testkit::tools::envoy().unwrap())
        .pin(PINNED, Ok(python().into()), 65532);
    let node = Node::start(NodeConfig {
        images,
        ..Default::default()
    })
    .unwrap();
    // The original project's image (what the manifests used to name): not this build's.
    let (reason, message) = waiting(
        &node,
        r#"{"metadata": {"name": "stale", "namespace": "ns1", "uid": "u1"},
            "spec": {"containers": [{"name": "c", "image": "quay.io/3scale/marin3r:v0.1.0"}]}}"#,
    )
    .await;
    assert_eq!(reason, "ErrImagePull");
    assert!(
        message.contains("quay.io/3scale/marin3r:v0.1.0") && message.contains(PINNED),
        "{message}"
    );
    // envoyproxy/envoy's user is root: runAsNonRoot without runAsUser cannot start it.
    let (reason, message) = waiting(
        &node,
        r#"{"metadata": {"name": "root", "namespace": "ns1", "uid": "u2"},
            "spec": {"containers": [{"name": "envoy", "image": "envoyproxy/envoy:v1.40.0",
              "securityContext": {"runAsNonRoot": true}}]}}"#,
    )
    .await;
    assert_eq!(reason, "CreateContainerConfigError");
    assert_eq!(
        message,
        r#"container has runAsNonRoot and image will run as root (pod: "root_ns1(u2)", container: envoy)"#
    );
    let (reason, message) = waiting(
        &node,
        r#"{"metadata": {"name": "zero", "namespace": "ns1", "uid": "u3"},
            "spec": {"securityContext": {"runAsNonRoot": true, "runAsUser": 0},
              "containers": [{"name": "envoy", "image": "envoyproxy/envoy:v1.40.0"}]}}"#,
    )
    .await;
    assert_eq!(reason, "CreateContainerConfigError");
    assert!(
        message.starts_with("container's runAsUser breaks non-root policy"),
        "{message}"
    );
}

/// A real kubelet applies a Secret change to running pods only at its next sync; with
/// `volume_update_delay` the local one does too (a new pod mounts the current Secret at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_change_reaches_a_running_pod_after_the_nodes_volume_delay() {
    let images = ImageMap::new().with("probe-server", python());
    let delay = Duration::from_millis(1500);
    let node = Node::start(NodeConfig {
        images,
        volume_update_delay: delay,
        ..Default::default()
    })
    .unwrap();
    let prefix = node.prefix();
    let objects = Arc::new(StaticObjects::default());
    let secret = |v: &str| -> Secret {
        from_yaml(&format!(
            r#"{{"metadata": {{"name": "tls", "namespace": "ns1"}}, "data": {{"tls.crt": "{}"}}}}"#,
            b64(v)
        ))
    };
    objects.put_secret(secret("first"));
    let mount =
        r#", "volumeMounts": [{"name": "tls", "mountPath": "/etc/delayed", "readOnly": true}]"#;
    let volume = r#"{"name": "tls", "secret": {"secretName": "tls"}}"#;
    let pod = PodHandle::start(
        &node,
        &server_pod("delayed", "delayed", mount, volume),
        objects.clone(),
    )
    .unwrap();
    pod.wait_ready(Duration::from_secs(30)).await.unwrap();
    let file = pod.volume_dir("tls").join("tls.crt");
    let read = || std::fs::read_to_string(&file).unwrap();
    assert_eq!(read(), "first");
    objects.put_secret(secret("second"));
    let changed = std::time::Instant::now();
    pod.refresh(None);
    tokio::time::sleep(Duration::from_millis(500)).await;
    pod.refresh(None);
    assert_eq!(read(), "first", "applied before the delay");
    while read() != "second" {
        assert!(changed.elapsed() < Duration::from_secs(10), "never applied");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        changed.elapsed() >= delay,
        "applied after {:?}",
        changed.elapsed()
    );
    // A pod started now mounts the current Secret at once.
    let fresh = PodHandle::start(
        &node,
        &server_pod("fresh", "fresh", mount, volume),
        objects.clone(),
    )
    .unwrap();
    fresh.wait_ready(Duration::from_secs(30)).await.unwrap();
    assert_eq!(
        std::fs::read_to_string(fresh.volume_dir("tls").join("tls.crt")).unwrap(),
        "second"
    );
    pod.stop(Duration::from_secs(5)).await;
    fresh.stop(Duration::from_secs(5)).await;
    drop(node);
    assert_cleaned(&prefix);
}
