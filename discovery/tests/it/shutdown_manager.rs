//! `marin3r shutdown-manager` against a real Envoy: a drain waits while a downstream
//! connection is open and ends when it closes or when the drain time has passed; `/shutdown`
//! then makes Envoy exit; the readiness listener's connections (kubelet's probes) do not hold
//! a drain up; an admin it cannot reach is an error, not a hang.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use marin3r_testkit::envoy::{Envoy, request};

/// An upstream that echoes whatever each connection sends, until it closes.
fn echo_upstream() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            std::thread::spawn(move || {
                let mut buf = [0u8; 1024];
                while let Ok(n) = stream.read(&mut buf) {
                    if n == 0 || stream.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

fn tcp_listener(name: &str, upstream: &str) -> String {
    format!(
        r#"
    - name: {name}
      stat_prefix: {name}
      address: {{socket_address: {{address: 127.0.0.1, port_value: 0}}}}
      filter_chains:
      - filters:
        - name: envoy.filters.network.tcp_proxy
          typed_config:
            "@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy
            stat_prefix: {name}
            cluster: {upstream}"#
    )
}

/// Envoy with a TCP proxy listener (`traffic`) and one named as the sidecar's readiness
/// listener, both to the echo upstream, draining as the injected sidecar would.
fn envoy(drain_time: u32) -> Envoy {
    let upstream = echo_upstream();
    let bootstrap = format!(
        r#"
admin:
  address: {{socket_address: {{address: 127.0.0.1, port_value: 0}}}}
static_resources:
  listeners:{traffic}{readiness}
  clusters:
  - name: echo
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: echo
      endpoints:
      - lb_endpoints:
        - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {upstream}}}}}}}
"#,
        traffic = tcp_listener("traffic", "echo"),
        readiness = tcp_listener(marin3r_webhook::sidecar::READINESS_LISTENER, "echo"),
    );
    let drain_time = drain_time.to_string();
    Envoy::start(
        &bootstrap,
        &[
            "--drain-time-s",
            &drain_time,
            "--drain-strategy",
            "immediate",
        ],
    )
    .unwrap()
}

/// The port a listener of `envoy` is bound to.
fn listener_port(envoy: &Envoy, name: &str) -> u16 {
    let listeners: serde_json::Value =
        serde_json::from_str(&envoy.admin_get("/listeners?format=json").unwrap()).unwrap();
    let listener = listeners["listener_statuses"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == name)
        .unwrap_or_else(|| panic!("no listener {name}: {listeners}"));
    u16::try_from(
        listener["local_address"]["socket_address"]["port_value"]
            .as_u64()
            .unwrap(),
    )
    .unwrap()
}

/// A downstream connection through `port`, proven open end to end by an echo.
fn connect(port: u16) -> TcpStream {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    stream.write_all(b"ping").unwrap();
    let mut buf = [0u8; 4];
    stream.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"ping");
    stream
}

struct Manager {
    child: Child,
    url: String,
}

impl Drop for Manager {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `marin3r shutdown-manager` for `admin`, as the injected container runs it (plus a zero
/// check delay, so the test need not wait for it).
fn manager(admin: &str, drain_time: u32) -> Manager {
    let port = {
        let probe = TcpListener::bind("0.0.0.0:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let child = Command::new(env!("CARGO_BIN_EXE_marin3r"))
        .args([
            "shutdown-manager",
            &format!("--port={port}"),
            &format!("--envoy-admin-address={admin}"),
            &format!("--drain-time={drain_time}"),
            "--check-drain-delay=0",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let manager = Manager {
        child,
        url: format!("http://127.0.0.1:{port}"),
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while request("GET", &format!("{}/healthz", manager.url))
        .map(|r| r.0)
        .ok()
        != Some(200)
    {
        assert!(
            Instant::now() < deadline,
            "the shutdown manager did not answer /healthz"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    manager
}

/// A hook's answer: status, body, and how long it took.
type HookAnswer = mpsc::Receiver<(u16, String, Duration)>;

/// GETs `path` from the manager on a thread (as kubelet's hook does).
fn hook(manager: &Manager, path: &str) -> HookAnswer {
    hook_with(manager, path, Vec::new())
}

/// [`hook`] with the hook's `httpHeaders`.
fn hook_with(manager: &Manager, path: &str, headers: Vec<(String, String)>) -> HookAnswer {
    let (tx, rx) = mpsc::channel();
    let url = format!("{}{path}", manager.url);
    std::thread::spawn(move || {
        let started = Instant::now();
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(120)))
            .build()
            .into();
        let mut request = agent.get(&url);
        for (name, value) in &headers {
            request = request.header(name, value);
        }
        let mut response = request.call().unwrap();
        let status = response.status().as_u16();
        let body = response.body_mut().read_to_string().unwrap();
        let _ = tx.send((status, body, started.elapsed()));
    });
    rx
}

#[test]
fn an_open_connection_holds_the_drain_until_it_closes() {
    let mut envoy = envoy(60);
    let traffic = connect(listener_port(&envoy, "traffic"));
    // Kubelet's probe connections do not count.
    let _probe = connect(listener_port(
        &envoy,
        marin3r_webhook::sidecar::READINESS_LISTENER,
    ));
    let manager = manager(envoy.admin_address(), 60);

    let app_hook = hook(&manager, "/drain");
    let manager_hook = hook(&manager, "/drain");
    // Both hooks are still waiting on the open connection, seconds later.
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        app_hook.try_recv().is_err(),
        "the drain ended with a connection open"
    );
    assert!(manager_hook.try_recv().is_err());

    drop(traffic);
    for rx in [app_hook, manager_hook] {
        let (status, body, took) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!((status, body.trim()), (200, "drained: no connection left"));
        assert!(took >= Duration::from_secs(3), "{took:?}");
        assert!(took < Duration::from_secs(60), "{took:?}");
    }
    // A drain alone leaves Envoy running; a later /drain returns at once with the same answer.
    assert!(envoy.try_wait().unwrap().is_none(), "{}", envoy.log_tail());
    let (status, body, _) = hook(&manager, "/drain")
        .recv_timeout(Duration::from_secs(10))
        .unwrap();
    assert_eq!((status, body.trim()), (200, "drained: no connection left"));
}

#[test]
fn the_drain_time_ends_the_wait_and_shutdown_stops_envoy() {
    let mut envoy = envoy(2);
    let port = listener_port(&envoy, "traffic");
    let _traffic = connect(port);
    let manager = manager(envoy.admin_address(), 2);

    let (status, body, took) = hook(&manager, "/drain")
        .recv_timeout(Duration::from_secs(30))
        .unwrap();
    assert_eq!(
        (status, body.trim()),
        (200, "drain time over with 1 connection(s) still open")
    );
    assert!(took >= Duration::from_secs(2), "{took:?}");
    // Envoy drained its listeners for its --drain-time-s and then closed them.
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_ok() {
        assert!(
            Instant::now() < deadline,
            "the drained listener still accepts"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(envoy.try_wait().unwrap().is_none(), "{}", envoy.log_tail());

    // Envoy's preStop: the same drain (over), then Envoy exits.
    let (status, body, _) = hook(&manager, "/shutdown")
        .recv_timeout(Duration::from_secs(30))
        .unwrap();
    assert_eq!(
        (status, body.trim()),
        (
            200,
            "drain time over with 1 connection(s) still open; Envoy asked to exit"
        )
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let exit = loop {
        if let Some(status) = envoy.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "Envoy still runs: {}",
            envoy.log_tail()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(exit.success(), "{exit:?}: {}", envoy.log_tail());
}

#[test]
fn an_unreachable_admin_is_an_error_not_a_hang() {
    let closed = {
        let probe = TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap()
    };
    let manager = manager(&closed.to_string(), 300);
    for path in ["/drain", "/shutdown"] {
        let (status, body, _) = hook(&manager, path)
            .recv_timeout(Duration::from_secs(30))
            .unwrap();
        assert_eq!(status, 500, "{path}: {body}");
        assert!(
            body.starts_with(&format!(
                "drain failed: POST http://{closed}/drain_listeners?graceful: "
            )),
            "{path}: {body}"
        );
    }
}

fn free_port() -> u16 {
    let probe = TcpListener::bind("0.0.0.0:0").unwrap();
    probe.local_addr().unwrap().port()
}

/// The whole injected pod, with kubelet's part played by the test: Envoy runs the injected
/// sidecar's command line (drain flags, the overlay's readiness listener), the manager runs the
/// injected container's arguments, and every preStop hook of the pod is called at once, as
/// kubelet calls them on termination. The hooks wait while a downstream connection is open
/// (a probe connection to the readiness listener does not count); when it closes they all
/// return and Envoy exits.
#[test]
fn the_injected_pods_prestop_hooks_drain_envoy_then_stop_it() {
    use k8s_openapi::api::core::v1::Pod;
    use marin3r_webhook::{InjectionConfig, inject_json, sidecar};

    let (admin, readiness, manager_port) = (free_port(), free_port(), free_port());
    let upstream = echo_upstream();
    let pod = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "kuard",
            "namespace": "shop",
            "labels": {"marin3r.3scale.net/status": "enabled"},
            "annotations": {
                "marin3r.3scale.net/node-id": "kuard",
                "marin3r.3scale.net/admin.port": admin.to_string(),
                "marin3r.3scale.net/readiness.port": readiness.to_string(),
                "marin3r.3scale.net/shutdown-manager.enabled": "true",
                "marin3r.3scale.net/shutdown-manager.port": manager_port.to_string(),
                "marin3r.3scale.net/shutdown-manager.drain-time": "120",
                "marin3r.3scale.net/shutdown-manager.extra-lifecycle-hooks": "app",
            },
        },
        "spec": {"containers": [{"name": "app", "image": "kuard"}]},
    });
    let mut pod = pod;
    let (_, warnings) = inject_json(&mut pod, &InjectionConfig::default()).unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    let pod: Pod = serde_json::from_value(pod).unwrap();
    let containers = &pod.spec.as_ref().unwrap().containers;
    let container = |name: &str| containers.iter().find(|c| c.name == name).unwrap();

    // Envoy: the sidecar's args, $(POD_NAME) and $(POD_NAMESPACE) expanded as kubelet does,
    // over a bootstrap with a TCP listener in place of the mounted one.
    let env = std::collections::BTreeMap::from([
        ("POD_NAME".to_owned(), "kuard".to_owned()),
        ("POD_NAMESPACE".to_owned(), "shop".to_owned()),
    ]);
    let args = sidecar::expand_env(container("envoy-sidecar").args.as_ref().unwrap(), &env);
    assert_eq!(args[..2], ["-c", "/etc/envoy/bootstrap/config.json"]);
    let rest: Vec<&str> = args[2..].iter().map(String::as_str).collect();
    assert!(
        rest.windows(2).any(|w| w == ["--drain-time-s", "120"]),
        "{rest:?}"
    );
    let bootstrap = format!(
        r#"
static_resources:
  listeners:{traffic}
  clusters:
  - name: echo
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: echo
      endpoints:
      - lb_endpoints:
        - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {upstream}}}}}}}
"#,
        traffic = tcp_listener("traffic", "echo"),
    );
    let mut envoy = Envoy::start(&bootstrap, &rest).unwrap();
    assert_eq!(envoy.admin_address(), format!("127.0.0.1:{admin}"));
    // The overlay's readiness listener answers kubelet over either family of the pod's
    // addresses (`::` with ipv4_compat), so IPv6-only and dual-stack pods pass their probes.
    for host in ["127.0.0.1", "[::1]"] {
        let (status, body) = request("GET", &format!("http://{host}:{readiness}/ready")).unwrap();
        assert_eq!((status, body.trim()), (200, "LIVE"), "readiness on {host}");
    }
    let info: serde_json::Value =
        serde_json::from_str(&envoy.admin_get("/server_info").unwrap()).unwrap();
    assert_eq!(info["command_line_options"]["drain_time"], "120s", "{info}");
    assert_eq!(info["command_line_options"]["drain_strategy"], "Gradual");

    // The manager: the injected container's own arguments and environment (its token).
    let manager_env = container("envoy-shtdn-mgr").env.clone().unwrap_or_default();
    assert!(
        manager_env
            .iter()
            .any(|e| e.name == marin3r_webhook::sidecar::SHUTDOWN_TOKEN_ENV),
        "{manager_env:?}"
    );
    let manager = Command::new(env!("CARGO_BIN_EXE_marin3r"))
        .args(container("envoy-shtdn-mgr").args.as_ref().unwrap())
        .envs(
            manager_env
                .iter()
                .filter_map(|e| Some((e.name.clone(), e.value.clone()?))),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let manager = Manager {
        child: manager,
        url: format!("http://127.0.0.1:{manager_port}"),
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while request("GET", &format!("{}/healthz", manager.url))
        .map(|r| r.0)
        .ok()
        != Some(200)
    {
        assert!(
            Instant::now() < deadline,
            "the shutdown manager did not answer /healthz"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Its hooks and probe reach it over IPv6 too.
    let healthz = request("GET", &format!("http://[::1]:{manager_port}/healthz")).unwrap();
    assert_eq!(healthz.0, 200, "the shutdown manager on [::1]");

    let traffic = connect(listener_port(&envoy, "traffic"));
    // An idle connection to the readiness listener, as a slow probe would hold.
    let _probe = TcpStream::connect(("127.0.0.1", readiness)).unwrap();

    // Kubelet: every container's preStop at once.
    let hooks: Vec<(String, HookAnswer)> = containers
        .iter()
        .filter_map(|c| {
            let get = c.lifecycle.as_ref()?.pre_stop.as_ref()?.http_get.as_ref()?;
            let k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(port) = get.port
            else {
                panic!("{}: a named port", c.name)
            };
            assert_eq!(port, i32::from(manager_port));
            // Kubelet sends the hook's headers: the pod's token.
            let headers = get
                .http_headers
                .iter()
                .flatten()
                .map(|h| (h.name.clone(), h.value.clone()))
                .collect();
            let path = get.path.as_deref().unwrap();
            Some((c.name.clone(), hook_with(&manager, path, headers)))
        })
        .collect();
    let names: Vec<&str> = hooks.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["app", "envoy-sidecar", "envoy-shtdn-mgr"]);
    // The manager counts only after its check delay (5 s); wait past it.
    std::thread::sleep(Duration::from_secs(7));
    for (name, rx) in &hooks {
        assert!(
            rx.try_recv().is_err(),
            "{name}'s hook returned with a connection open"
        );
    }
    assert!(envoy.try_wait().unwrap().is_none());

    drop(traffic);
    for (name, rx) in hooks {
        let (status, body, _) = rx.recv_timeout(Duration::from_secs(15)).unwrap();
        let want = if name == "envoy-sidecar" {
            "drained: no connection left; Envoy asked to exit"
        } else {
            "drained: no connection left"
        };
        assert_eq!((status, body.trim()), (200, want), "{name}");
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let exit = loop {
        if let Some(status) = envoy.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "Envoy still runs: {}",
            envoy.log_tail()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(exit.success(), "{exit:?}: {}", envoy.log_tail());
}
