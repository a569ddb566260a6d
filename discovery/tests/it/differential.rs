//! The differential harness: marin3r's verdict on an EnvoyConfig must be real
//! Envoy's. A corpus the project writes itself, from Envoy's documented API, plus mutations of
//! it generated here (fields removed, lists emptied, enums in lower case, list items
//! duplicated, extensions given by name only, a single object for a one-element list); each
//! case judged by marin3r (its own checks, then Envoy as the last judge, as `marin3r validate`
//! runs them) and by a real Envoy 1.40 loading the same resources as written in a bootstrap of
//! this test's own, `envoy --mode validate`. Every verdict must agree; the counts are printed
//! (past the harness's capture, so `hack/test` shows them), with how often marin3r's own
//! checks alone agree, and the cases listed apart: resources without a name, and configs
//! reading files only the proxy's pod has.

use std::collections::BTreeSet;

use marin3r_api::EnvoyConfigSpec;
use marin3r_envoyconfig::judge::{EnvoyJudge, JudgeError};
use serde_json::{Value, json};

/// One case: resources by `spec.resources` type.
#[derive(Debug, Clone)]
struct Case {
    name: String,
    resources: Vec<(&'static str, Value)>,
}

fn router() -> Value {
    json!({"name": "envoy.filters.http.router", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}})
}

fn hcm(route: Value, filters: Value) -> Value {
    let mut hcm = json!({
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "ingress",
        "codec_type": "AUTO",
        "http_filters": filters,
    });
    hcm.as_object_mut()
        .unwrap()
        .extend(route.as_object().unwrap().clone());
    hcm
}

fn listener(name: &str, port: u16, typed_config: Value) -> Value {
    json!({
        "name": name,
        "address": {"socket_address": {"address": "0.0.0.0", "port_value": port, "protocol": "TCP"}},
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": typed_config}]}],
    })
}

fn endpoints(name: &str, host: &str) -> Value {
    json!({"cluster_name": name, "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {"address": host, "port_value": 8080}}}}]}]})
}

/// The valid configs every mutation starts from.
fn bases() -> Vec<Case> {
    let direct = json!({"route_config": {"name": "local", "virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [{"match": {"prefix": "/"}, "direct_response": {"status": 200, "body": {"inline_string": "hi"}}}]}]}});
    let rds = json!({"rds": {"route_config_name": "app", "config_source": {"ads": {}, "resource_api_version": "V3"}}});
    let routes = json!({"name": "app", "virtual_hosts": [{
        "name": "app", "domains": ["app.example.com", "*"],
        "routes": [
            {"match": {"safe_regex": {"regex": "^/api/v[0-9]+/.*"}}, "route": {"cluster": "app", "timeout": "5s", "retry_policy": {"retry_on": "5xx", "num_retries": 2}}},
            {"match": {"prefix": "/", "headers": [{"name": ":method", "string_match": {"exact": "GET"}}]}, "route": {"cluster": "app", "prefix_rewrite": "/"}},
        ],
    }]});
    let static_cluster = json!({"name": "app", "type": "STATIC", "connect_timeout": "1s", "lb_policy": "ROUND_ROBIN", "load_assignment": endpoints("app", "127.0.0.1")});
    let dns_cluster = json!({"name": "app", "type": "STRICT_DNS", "connect_timeout": "0.5s", "dns_lookup_family": "V4_ONLY", "load_assignment": endpoints("app", "app.svc"),
        "health_checks": [{"timeout": "1s", "interval": "5s", "unhealthy_threshold": 3, "healthy_threshold": 1, "http_health_check": {"path": "/healthz"}}]});
    let eds_cluster = json!({"name": "app", "type": "EDS", "connect_timeout": "2s", "eds_cluster_config": {"eds_config": {"ads": {}, "resource_api_version": "V3"}}});
    let buffer_typed_struct = json!({"name": "envoy.filters.http.buffer", "typed_config": {
        "@type": "type.googleapis.com/xds.type.v3.TypedStruct",
        "type_url": "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer",
        "value": {"max_request_bytes": 4096}}});
    let disabled_buffer = json!({"name": "envoy.filters.http.buffer", "disabled": true, "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer", "max_request_bytes": 1024}});
    let enable_per_route = json!({"route_config": {"name": "local", "virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [{
        "match": {"prefix": "/upload"}, "direct_response": {"status": 200},
        "typed_per_filter_config": {"envoy.filters.http.buffer": {"@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig", "config": {}}}}]}]}});
    let tcp = json!({
        "name": "tcp", "address": {"socket_address": {"address": "0.0.0.0", "port_value": 9000}},
        "listener_filters": [{"name": "envoy.filters.listener.tls_inspector", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector"}}],
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.tcp_proxy", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
            "stat_prefix": "tcp", "cluster": "app", "idle_timeout": "30s"}}]}],
    });
    let access_log = json!({"name": "logged", "address": {"socket_address": {"address": "0.0.0.0", "port_value": 8081}},
        "filter_chains": [{"filters": [{"name": "hcm", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": "logged",
            "access_log": [{"name": "envoy.access_loggers.stdout", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.access_loggers.stream.v3.StdoutAccessLog"}}],
            "route_config": {"name": "logged", "virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [{"match": {"path": "/"}, "direct_response": {"status": 204}}]}]},
            "http_filters": [router()]}}]}]});
    let runtime = json!({"name": "runtime", "layer": {"envoy.reloadable_features.example": true, "health_check.min_interval": 1000}});
    let case = |name: &str, resources: Vec<(&'static str, Value)>| Case {
        name: name.to_owned(),
        resources,
    };
    vec![
        case(
            "direct-response",
            vec![(
                "listener",
                listener("http", 8080, hcm(direct.clone(), json!([router()]))),
            )],
        ),
        case(
            "rds-static-cluster",
            vec![
                (
                    "listener",
                    listener("http", 8080, hcm(rds.clone(), json!([router()]))),
                ),
                ("route", routes.clone()),
                ("cluster", static_cluster.clone()),
            ],
        ),
        case(
            "rds-dns-cluster",
            vec![
                (
                    "listener",
                    listener("http", 8080, hcm(rds.clone(), json!([router()]))),
                ),
                ("route", routes.clone()),
                ("cluster", dns_cluster),
            ],
        ),
        case(
            "eds",
            vec![
                ("cluster", eds_cluster),
                ("endpoint", endpoints("app", "10.0.0.1")),
            ],
        ),
        case(
            "typed-struct-filter",
            vec![(
                "listener",
                listener(
                    "http",
                    8080,
                    hcm(direct.clone(), json!([buffer_typed_struct, router()])),
                ),
            )],
        ),
        case(
            "per-route-enabled-filter",
            vec![(
                "listener",
                listener(
                    "http",
                    8080,
                    hcm(enable_per_route, json!([disabled_buffer, router()])),
                ),
            )],
        ),
        case(
            "tcp-proxy",
            vec![("listener", tcp), ("cluster", static_cluster)],
        ),
        case("access-log", vec![("listener", access_log)]),
        case("runtime", vec![("runtime", runtime)]),
        case(
            "two-listeners",
            vec![
                (
                    "listener",
                    listener("a", 8080, hcm(direct.clone(), json!([router()]))),
                ),
                (
                    "listener",
                    listener("b", 8081, hcm(direct, json!([router()]))),
                ),
            ],
        ),
    ]
}

/// Every place in `v` (paths of keys and list indexes), up to `depth`.
fn paths(v: &Value, at: &mut Vec<String>, depth: usize, out: &mut Vec<Vec<String>>) {
    if depth == 0 {
        return;
    }
    match v {
        Value::Object(map) => {
            for (k, child) in map {
                at.push(k.clone());
                out.push(at.clone());
                paths(child, at, depth - 1, out);
                at.pop();
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                at.push(i.to_string());
                out.push(at.clone());
                paths(child, at, depth - 1, out);
                at.pop();
            }
        }
        _ => {}
    }
}

fn pointer(path: &[String]) -> String {
    path.iter()
        .map(|p| format!("/{}", p.replace('~', "~0").replace('/', "~1")))
        .collect()
}

/// The mutations of one resource value, each with a label.
fn mutations(v: &Value) -> Vec<(String, Value)> {
    let mut all = Vec::new();
    paths(v, &mut Vec::new(), 12, &mut all);
    let mut out = Vec::new();
    for path in all {
        let at = pointer(&path);
        let (parent, last) = path.split_at(path.len() - 1);
        let parent_at = pointer(parent);
        let target = v.pointer(&at).cloned().unwrap_or_default();
        let parent_is_object = v.pointer(&parent_at).is_some_and(Value::is_object);
        // A field removed.
        if parent_is_object && last[0] != "@type" {
            let mut m = v.clone();
            m.pointer_mut(&parent_at)
                .and_then(Value::as_object_mut)
                .unwrap()
                .remove(&last[0]);
            out.push((format!("remove {at}"), m));
        }
        match &target {
            Value::Array(items) if !items.is_empty() => {
                let mut m = v.clone();
                *m.pointer_mut(&at).unwrap() = json!([]);
                out.push((format!("empty {at}"), m));
                let mut m = v.clone();
                let first = items[0].clone();
                m.pointer_mut(&at)
                    .and_then(Value::as_array_mut)
                    .unwrap()
                    .push(first);
                out.push((format!("duplicate {at}[0]"), m));
                if items.len() == 1 && items[0].is_object() {
                    let mut m = v.clone();
                    *m.pointer_mut(&at).unwrap() = items[0].clone();
                    out.push((format!("single object for {at}"), m));
                }
            }
            Value::String(s)
                if s.len() > 1
                    && s.chars()
                        .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_') =>
            {
                let mut m = v.clone();
                *m.pointer_mut(&at).unwrap() = json!(s.to_ascii_lowercase());
                out.push((format!("lowercase {at}"), m));
            }
            Value::Object(map) if map.contains_key("typed_config") && map.contains_key("name") => {
                let mut m = v.clone();
                m.pointer_mut(&at)
                    .and_then(Value::as_object_mut)
                    .unwrap()
                    .remove("typed_config");
                out.push((format!("name only {at}"), m));
            }
            _ => {}
        }
    }
    out
}

/// The corpus: every base and every mutation of each of its resources.
fn corpus() -> Vec<Case> {
    let mut out = Vec::new();
    for base in bases() {
        for (i, (_, value)) in base.resources.iter().enumerate() {
            for (label, mutated) in mutations(value) {
                let mut case = base.clone();
                case.name = format!("{} resources[{i}] {label}", base.name);
                case.resources[i].1 = mutated;
                out.push(case);
            }
        }
        out.push(base);
    }
    out.extend(reading_files());
    out
}

/// The name every case of [`reading_files`] ends with.
const READS_FILES: &str = " (reads a file of the proxy's pod)";

/// Configs that read files only the proxy's pod has (a Lua module, certificates on a
/// volume): Envoy here refuses them for the missing file, a proxy whose pod mounts it takes
/// them. Listed apart, not counted as agreements.
fn reading_files() -> Vec<Case> {
    let direct = json!({"route_config": {"name": "local", "virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [{"match": {"prefix": "/"}, "direct_response": {"status": 200}}]}]}});
    let lua = json!({"name": "envoy.filters.http.lua", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
        "default_source_code": {"filename": "/etc/envoy/lua/headers.lua"}}});
    let tls = |context: &str| {
        json!({"name": "envoy.transport_sockets.tls", "typed_config": {
            "@type": format!("type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.{context}"),
            "common_tls_context": {"tls_certificates": [{
                "certificate_chain": {"filename": "/etc/envoy/tls/tls.crt"},
                "private_key": {"filename": "/etc/envoy/tls/tls.key"}}]}}})
    };
    let mut https = listener("https", 8443, hcm(direct.clone(), json!([router()])));
    https["filter_chains"][0]["transport_socket"] = tls("DownstreamTlsContext");
    let mut upstream = json!({"name": "secure", "connect_timeout": "1s", "load_assignment": endpoints("secure", "127.0.0.1")});
    upstream["transport_socket"] = tls("UpstreamTlsContext");
    [
        (
            "a Lua module",
            vec![(
                "listener",
                listener("lua", 8080, hcm(direct, json!([lua, router()]))),
            )],
        ),
        ("a listener's certificate", vec![("listener", https)]),
        ("a client certificate", vec![("cluster", upstream)]),
    ]
    .into_iter()
    .map(|(name, resources)| Case {
        name: format!("{name}{READS_FILES}"),
        resources,
    })
    .collect()
}

fn spec(case: &Case) -> EnvoyConfigSpec {
    let resources: Vec<Value> = case
        .resources
        .iter()
        .map(|(kind, value)| json!({"type": kind, "value": value}))
        .collect();
    serde_json::from_value(json!({"nodeID": "differential", "resources": resources})).unwrap()
}

/// Real Envoy's verdict, on this test's own bootstrap: listeners, clusters and runtime layers
/// as they are; a route configuration as RDS would deliver it, inside a listener of its own;
/// endpoints as a static cluster's; an ADS source that never connects.
fn envoy_verdict(judge: &EnvoyJudge, case: &Case) -> Result<(), JudgeError> {
    let (mut listeners, mut clusters, mut layers) = (Vec::new(), Vec::new(), Vec::new());
    for (i, (kind, value)) in case.resources.iter().enumerate() {
        match *kind {
            "listener" => listeners.push(value.clone()),
            "cluster" => clusters.push(value.clone()),
            "route" => {
                let mut route = value.clone();
                if let Some(map) = route.as_object_mut() {
                    map.entry("validate_clusters").or_insert(json!(false));
                }
                let hcm = json!({
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                    "stat_prefix": "rds", "route_config": route, "http_filters": [router()]});
                let mut l = listener(&format!("differential-rds-{i}"), 0, hcm);
                l["address"] = json!({"pipe": {"path": format!("/differential/rds-{i}")}});
                listeners.push(l);
            }
            "endpoint" => clusters.push(json!({"name": format!("differential-eds-{i}"), "type": "STATIC", "connect_timeout": "1s", "load_assignment": value})),
            "runtime" => layers.push(json!({"name": format!("layer-{i}"), "static_layer": value.get("layer").cloned().unwrap_or(json!({}))})),
            other => panic!("no such kind {other}"),
        }
    }
    clusters.push(json!({"name": "ads", "type": "STATIC", "connect_timeout": "1s",
        "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}}}},
        "load_assignment": endpoints("ads", "127.0.0.1")}));
    let mut bootstrap = json!({
        "node": {"id": "differential", "cluster": "differential"},
        "static_resources": {"listeners": listeners, "clusters": clusters},
        "dynamic_resources": {"ads_config": {"api_type": "GRPC", "transport_api_version": "V3",
            "grpc_services": [{"envoy_grpc": {"cluster_name": "ads"}}]}},
    });
    if !layers.is_empty() {
        bootstrap["layered_runtime"] = json!({"layers": layers});
    }
    judge.validate(&bootstrap)
}

/// (marin3r's own checks, marin3r with Envoy as the last judge).
fn marin3r_verdicts(judge: &EnvoyJudge, case: &Case) -> (bool, Result<(), JudgeError>) {
    let spec = spec(case);
    let own = marin3r_envoyconfig::rules::problems(&spec, "differential", false).is_empty();
    match own {
        true => (own, judge.judge(&spec)),
        false => (
            own,
            Err(JudgeError::Refused(vec!["marin3r's own checks".into()])),
        ),
    }
}

/// One case's verdicts: (name, Envoy's, marin3r's own checks', marin3r's with its judge).
type Verdicts = (String, Result<(), JudgeError>, bool, Result<(), JudgeError>);

fn verdicts(judge: &EnvoyJudge, case: &Case) -> Verdicts {
    let truth = envoy_verdict(judge, case);
    let (own, full) = marin3r_verdicts(judge, case);
    (case.name.clone(), truth, own, full)
}

/// Whether Envoy gave no verdict on one side (a run past its time or killed): no answer,
/// where the comparison needs one.
fn unanswered(v: &Verdicts) -> bool {
    matches!(v.1, Err(JudgeError::Unavailable(_))) || matches!(v.3, Err(JudgeError::Unavailable(_)))
}

#[test]
fn marin3rs_verdict_is_envoys_on_every_case_of_the_corpus() {
    let envoy = marin3r_testkit::tools::envoy().expect("hack/install-tools installs Envoy");
    let judge = EnvoyJudge::new(envoy).with_launcher(env!("CARGO_BIN_EXE_marin3r"));
    let corpus = corpus();
    let names: BTreeSet<&str> = corpus.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names.len(), corpus.len(), "case names are unique");
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get().min(4));
    let chunks: Vec<&[Case]> = corpus.chunks(corpus.len().div_ceil(workers)).collect();
    let mut verdicts: Vec<Verdicts> = std::thread::scope(|scope| {
        let runs: Vec<_> = chunks
            .into_iter()
            .map(|chunk| {
                let judge = &judge;
                scope.spawn(move || {
                    chunk
                        .iter()
                        .map(|case| verdicts(judge, case))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        runs.into_iter().flat_map(|r| r.join().unwrap()).collect()
    });
    // A machine busy with other suites can push an Envoy run past its budget, or starve it
    // otherwise: a case without a verdict, or whose verdicts differ, is judged again, alone
    // (what was first said goes to the standard error). A case still unanswered fails the
    // test with Envoy's reason; one still differing is a disagreement.
    let mut again = String::new();
    for (v, case) in verdicts.iter_mut().zip(&corpus) {
        // The cases listed apart below differ by design.
        let by_design = v.0.ends_with(" remove /name") || v.0.ends_with(READS_FILES);
        for _ in 0..2 {
            if !unanswered(v) && (by_design || v.1.is_ok() == v.3.is_ok()) {
                break;
            }
            again.push_str(&format!("differential: judged again, alone: {v:?}\n"));
            *v = self::verdicts(&judge, case);
        }
        assert!(!unanswered(v), "Envoy gave no verdict on {}: {v:?}", v.0);
    }
    std::io::Write::write_all(&mut std::io::stderr(), again.as_bytes()).unwrap();
    let results: Vec<(String, bool, bool, bool)> = verdicts
        .iter()
        .map(|(name, truth, own, full)| (name.clone(), truth.is_ok(), *own, full.is_ok()))
        .collect();
    let accepted = results.iter().filter(|r| r.1).count();
    assert!(
        results.len() - accepted >= 100 && accepted >= 100,
        "the corpus must hold both verdicts"
    );
    // Listed apart: a static bootstrap names an unnamed listener or cluster itself, but xDS
    // serves resources by name, so marin3r cannot serve one without (and says so).
    let unnamed: Vec<&str> = results
        .iter()
        .filter(|r| r.1 && !r.2 && r.0.ends_with(" remove /name"))
        .map(|r| r.0.as_str())
        .collect();
    // And what reads files of the proxy's pod: Envoy here refuses it for the missing file,
    // marin3r leaves it to its own checks.
    let files: Vec<&str> = results
        .iter()
        .filter(|r| r.0.ends_with(READS_FILES))
        .map(|r| r.0.as_str())
        .collect();
    assert!(
        results
            .iter()
            .filter(|r| files.contains(&r.0.as_str()))
            .all(|r| !r.1 && r.3),
        "Envoy here refuses every config reading a missing file, marin3r's judge none: {results:?}"
    );
    let apart: Vec<&str> = unnamed.iter().chain(&files).copied().collect();
    let counted: Vec<_> = results
        .iter()
        .filter(|r| !apart.contains(&r.0.as_str()))
        .collect();
    assert!(counted.len() >= 500, "only {} cases", counted.len());
    let accepted = counted.iter().filter(|r| r.1).count();
    let agree = counted.iter().filter(|r| r.1 == r.3).count();
    let own_agree = counted.iter().filter(|r| r.1 == r.2).count();
    // Straight to the standard error, past the test harness's capture: `hack/test` shows it.
    let summary = format!(
        "differential: {} cases ({accepted} accepted by Envoy, {} refused); marin3r agrees with \
         Envoy on {agree}; marin3r's own checks alone on {own_agree}\n\
         differential: listed apart ({}), a resource without a name, which xDS cannot serve: \
         {}\n\
         differential: listed apart ({}), reading files only the proxy's pod has: {}\n",
        counted.len(),
        counted.len() - accepted,
        unnamed.len(),
        unnamed.join("; "),
        files.len(),
        files.join("; ")
    );
    std::io::Write::write_all(&mut std::io::stderr(), summary.as_bytes()).unwrap();
    let disagreements: Vec<String> = verdicts
        .iter()
        .filter(|r| r.1.is_ok() != r.3.is_ok() && !apart.contains(&r.0.as_str()))
        .map(|(name, truth, own, full)| {
            let envoy = match truth {
                Ok(()) => "accepts".to_owned(),
                Err(e) => format!("refuses ({e})"),
            };
            let ours = match (own, full) {
                (false, _) => "our checks refuse".to_owned(),
                (true, Ok(())) => "our checks and Envoy as judge accept".to_owned(),
                (true, Err(e)) => format!("our checks accept, Envoy as judge refuses ({e})"),
            };
            format!("{name}: Envoy {envoy}; {ours}")
        })
        .collect();
    assert!(
        disagreements.is_empty(),
        "{} disagreements:\n{}",
        disagreements.len(),
        disagreements.join("\n")
    );
}
