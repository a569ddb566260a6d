//! Where the sidecar goes: the classic layout, the classic layout holding the applications
//! until Envoy is ready, native sidecars; and the cluster's defaults a pod gets.

use serde_json::json;

use super::*;
use crate::annotations::NATIVE_SIDECAR;
use crate::config::Resources;

fn pod(annotations: &[(&str, &str)], spec: Value) -> Value {
    let mut all = serde_json::Map::new();
    all.insert("marin3r.3scale.net/node-id".into(), "kuard".into());
    for (k, v) in annotations {
        all.insert((*k).into(), (*v).into());
    }
    let mut pod_spec = json!({"containers": [{"name": "app", "image": "kuard:1"}]});
    if let (Some(s), Some(extra)) = (pod_spec.as_object_mut(), spec.as_object()) {
        s.extend(extra.clone());
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "kuard",
            "namespace": "shop",
            "labels": {"marin3r.3scale.net/status": "enabled"},
            "annotations": all,
        },
        "spec": pod_spec,
    })
}

fn injected(v: &Value, config: &InjectionConfig) -> Value {
    let patch = mutate(&serde_json::from_value(v.clone()).unwrap(), config).unwrap();
    let mut out = v.clone();
    json_patch::patch(&mut out, &patch.0).unwrap();
    out
}

fn names(list: &Value) -> Vec<&str> {
    list.as_array()
        .map(|l| l.iter().filter_map(|c| c["name"].as_str()).collect())
        .unwrap_or_default()
}

const NATIVE: (&str, &str) = ("marin3r.3scale.net/native-sidecar", "true");
const MANAGER: (&str, &str) = ("marin3r.3scale.net/shutdown-manager.enabled", "true");
const HOLD: (&str, &str) = (
    "marin3r.3scale.net/hold-application-until-proxy-starts",
    "true",
);

#[test]
fn classic_appends_envoy_after_the_applications() {
    let out = injected(&pod(&[MANAGER], json!({})), &InjectionConfig::default());
    assert_eq!(
        names(&out["spec"]["containers"]),
        ["app", "envoy-sidecar", "envoy-shtdn-mgr"]
    );
    assert!(out["spec"].get("initContainers").is_none());
    let envoy = &out["spec"]["containers"][1];
    assert!(envoy.get("restartPolicy").is_none(), "{envoy}");
    assert!(envoy.get("startupProbe").is_none(), "{envoy}");
}

#[test]
fn native_sidecars_are_init_containers_that_always_restart_and_start_ready() {
    let out = injected(
        &pod(&[NATIVE, MANAGER], json!({})),
        &InjectionConfig::default(),
    );
    assert_eq!(names(&out["spec"]["containers"]), ["app"]);
    // The manager first: kubelet stops sidecars in reverse order, so it outlives Envoy,
    // whose preStop calls it.
    assert_eq!(
        names(&out["spec"]["initContainers"]),
        ["envoy-shtdn-mgr", "envoy-sidecar"]
    );
    for c in out["spec"]["initContainers"].as_array().unwrap() {
        assert_eq!(c["restartPolicy"], "Always", "{c}");
    }
    let envoy = &out["spec"]["initContainers"][1];
    let startup = &envoy["startupProbe"];
    assert_eq!(startup["httpGet"]["path"], "/ready");
    assert_eq!(startup["httpGet"]["port"], 9902);
    assert_eq!(startup["periodSeconds"], 1);
    // Native sidecars keep their readiness and liveness probes.
    assert_eq!(envoy["readinessProbe"]["httpGet"]["path"], "/ready");
    assert_eq!(
        envoy["lifecycle"]["preStop"]["httpGet"]["path"],
        "/shutdown"
    );
}

#[test]
fn native_sidecars_go_before_the_pods_own_init_containers() {
    let spec = json!({"initContainers": [{"name": "migrate", "image": "kuard:1"}]});
    let out = injected(&pod(&[NATIVE], spec), &InjectionConfig::default());
    assert_eq!(
        names(&out["spec"]["initContainers"]),
        ["envoy-sidecar", "migrate"]
    );
}

#[test]
fn the_cluster_default_layout_is_the_config_and_an_annotation_overrides_it() {
    let native = InjectionConfig {
        native_sidecars: true,
        ..InjectionConfig::default()
    };
    let out = injected(&pod(&[], json!({})), &native);
    assert_eq!(names(&out["spec"]["initContainers"]), ["envoy-sidecar"]);
    let out = injected(&pod(&[(NATIVE_SIDECAR, "false")], json!({})), &native);
    assert_eq!(names(&out["spec"]["containers"]), ["app", "envoy-sidecar"]);
}

#[test]
fn hold_puts_envoy_first_and_a_waiting_container_before_the_applications() {
    let config = InjectionConfig {
        shutdown_manager_image: "registry.local/marin3r:v9".into(),
        ..InjectionConfig::default()
    };
    let out = injected(&pod(&[HOLD, MANAGER], json!({})), &config);
    assert_eq!(
        names(&out["spec"]["containers"]),
        ["envoy-sidecar", "marin3r-hold", "app", "envoy-shtdn-mgr"]
    );
    let hold = &out["spec"]["containers"][1];
    assert_eq!(hold["image"], "registry.local/marin3r:v9");
    let wait = &hold["lifecycle"]["postStart"]["exec"]["command"];
    assert_eq!(
        wait,
        &json!([
            "/usr/local/bin/marin3r",
            "wait-for-proxy",
            "--url=http://127.0.0.1:9902/ready",
            "--timeout=120"
        ])
    );
    assert_eq!(hold["securityContext"]["runAsNonRoot"], true);
}

#[test]
fn the_drain_hook_lands_on_the_named_container_when_envoy_is_inserted_before_it() {
    let out = injected(
        &pod(
            &[
                HOLD,
                MANAGER,
                (
                    "marin3r.3scale.net/shutdown-manager.extra-lifecycle-hooks",
                    "app",
                ),
            ],
            json!({}),
        ),
        &InjectionConfig::default(),
    );
    let app = &out["spec"]["containers"][2];
    assert_eq!(app["name"], "app");
    assert_eq!(app["lifecycle"]["preStop"]["httpGet"]["path"], "/drain");
    assert!(out["spec"]["containers"][0].get("lifecycle").is_some());
    assert!(
        out["spec"]["containers"][1]["lifecycle"]
            .get("preStop")
            .is_none()
    );
}

#[test]
fn hold_follows_an_ipv6_admin() {
    let out = injected(
        &pod(
            &[HOLD, ("marin3r.3scale.net/admin.bind-address", "::1")],
            json!({}),
        ),
        &InjectionConfig::default(),
    );
    let wait = &out["spec"]["containers"][1]["lifecycle"]["postStart"]["exec"]["command"];
    assert_eq!(wait[2], "--url=http://[::1]:9902/ready");
}

#[test]
fn hold_on_a_native_sidecar_is_a_no_op_and_false_says_so() {
    let out = injected(
        &pod(&[NATIVE, HOLD], json!({})),
        &InjectionConfig::default(),
    );
    assert_eq!(names(&out["spec"]["containers"]), ["app"]);
    let v = pod(
        &[
            NATIVE,
            (
                "marin3r.3scale.net/hold-application-until-proxy-starts",
                "false",
            ),
        ],
        json!({}),
    );
    let m = mutation(
        &serde_json::from_value(v).unwrap(),
        &InjectionConfig::default(),
    )
    .unwrap();
    assert!(
        m.warnings
            .iter()
            .any(|w| w.contains("no effect on a native sidecar")),
        "{:?}",
        m.warnings
    );
}

#[test]
fn a_bad_layout_annotation_is_denied_naming_it() {
    let v = pod(
        &[("marin3r.3scale.net/native-sidecar", "sometimes")],
        json!({}),
    );
    let err = mutate(
        &serde_json::from_value(v).unwrap(),
        &InjectionConfig::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.starts_with("marin3r.3scale.net/native-sidecar: \"sometimes\""),
        "{err}"
    );
}

#[test]
fn a_container_named_like_the_hold_container_is_a_conflict() {
    let spec = json!({"containers": [{"name": "marin3r-hold", "image": "kuard:1"}]});
    let v = pod(&[HOLD], spec);
    let err = mutate(
        &serde_json::from_value(v).unwrap(),
        &InjectionConfig::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("\"marin3r-hold\""), "{err}");
}

#[test]
fn cluster_defaults_give_image_resources_and_pull_secrets() {
    let config = InjectionConfig {
        envoy_image: "mirror.local/envoy:v1.40.0".into(),
        resources: Resources {
            requests_cpu: Some("100m".into()),
            limits_memory: Some("256Mi".into()),
            ..Resources::default()
        },
        image_pull_secrets: vec!["mirror".into(), "other".into()],
        ..InjectionConfig::default()
    };
    let spec = json!({"imagePullSecrets": [{"name": "other"}]});
    let out = injected(
        &pod(
            &[("marin3r.3scale.net/resources.requests.memory", "64Mi")],
            spec,
        ),
        &config,
    );
    let envoy = &out["spec"]["containers"][1];
    assert_eq!(envoy["image"], "mirror.local/envoy:v1.40.0");
    assert_eq!(
        envoy["resources"],
        json!({"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}})
    );
    assert_eq!(
        out["spec"]["imagePullSecrets"],
        json!([{"name": "other"}, {"name": "mirror"}])
    );
    // A pod without any gets the list.
    let out = injected(&pod(&[], json!({})), &config);
    assert_eq!(
        out["spec"]["imagePullSecrets"],
        json!([{"name": "mirror"}, {"name": "other"}])
    );
}

#[test]
fn an_annotation_over_the_default_limit_is_denied_naming_the_default() {
    let config = InjectionConfig {
        resources: Resources {
            limits_cpu: Some("200m".into()),
            ..Resources::default()
        },
        ..InjectionConfig::default()
    };
    let v = pod(
        &[("marin3r.3scale.net/resources.requests.cpu", "1")],
        json!({}),
    );
    let err = mutate(&serde_json::from_value(v).unwrap(), &config)
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "marin3r.3scale.net/resources.requests.cpu: \"1\": the request is greater than the \
         limit marin3r.3scale.net/resources.limits.cpu=\"200m\" (the cluster default)"
    );
}

/// The `--config-yaml` overlay of the injected Envoy, parsed.
fn overlay(pod: &Value) -> Value {
    let envoy = pod["spec"]["initContainers"]
        .as_array()
        .into_iter()
        .chain(pod["spec"]["containers"].as_array())
        .flatten()
        .find(|c| c["name"] == "envoy-sidecar")
        .unwrap();
    let args: Vec<&str> = envoy["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let at = args.iter().position(|a| *a == "--config-yaml").unwrap();
    serde_json::from_str(args[at + 1]).unwrap()
}

#[test]
fn the_xds_protocol_comes_from_the_annotation_else_the_cluster_default() {
    use crate::annotations::XDS_PROTOCOL;
    use crate::config::XdsProtocol;
    let sotw = InjectionConfig::default();
    let delta = InjectionConfig {
        xds_protocol: XdsProtocol::Delta,
        ..InjectionConfig::default()
    };
    let api_type =
        |pod: &Value| overlay(pod)["dynamic_resources"]["ads_config"]["api_type"].clone();
    // State of the world: the shared bootstrap's, nothing overlaid.
    assert_eq!(
        api_type(&injected(&pod(&[], json!({})), &sotw)),
        Value::Null
    );
    assert_eq!(
        api_type(&injected(&pod(&[], json!({})), &delta)),
        json!("DELTA_GRPC")
    );
    assert_eq!(
        api_type(&injected(
            &pod(&[(XDS_PROTOCOL, "delta")], json!({})),
            &sotw
        )),
        json!("DELTA_GRPC")
    );
    assert_eq!(
        api_type(&injected(
            &pod(&[(XDS_PROTOCOL, "sotw")], json!({})),
            &delta
        )),
        Value::Null
    );
    // Anything else is refused, naming the annotation.
    let bad: Pod = serde_json::from_value(pod(&[(XDS_PROTOCOL, "Delta")], json!({}))).unwrap();
    let err = mutate(&bad, &sotw).unwrap_err().to_string();
    assert!(
        err.contains(XDS_PROTOCOL) && err.contains("must be sotw (state of the world) or delta"),
        "{err}"
    );
}
