use k8s_openapi::jiff::Timestamp;
use serde_json::json;

use super::*;

/// The `EnvoyDeployment` `kuard` of namespace `shop` (uid `u-1`, generation 1) naming the
/// EnvoyConfig `kuard` and the DiscoveryService `instance`, with `spec`'s fields on top.
fn mk_ed(spec: serde_json::Value) -> EnvoyDeployment {
    let mut full = json!({"envoyConfigRef": "kuard", "discoveryServiceRef": "instance"});
    if let (Some(full), Some(fields)) = (full.as_object_mut(), spec.as_object()) {
        full.extend(fields.clone());
    }
    let api_version = "operator.marin3r.3scale.net/v1alpha1";
    let mut object = json!({"apiVersion": api_version, "kind": "EnvoyDeployment"});
    object["metadata"] =
        json!({"name": "kuard", "namespace": "shop", "uid": "u-1", "generation": 1});
    object["spec"] = full;
    serde_json::from_value(object).unwrap()
}

fn mk_ds() -> DiscoveryService {
    serde_json::from_value(json!({
        "apiVersion": "operator.marin3r.3scale.net/v1alpha1",
        "kind": "DiscoveryService",
        "metadata": {"name": "instance", "namespace": "shop"},
        "spec": {},
    }))
    .unwrap()
}

fn mk_ec() -> EnvoyConfig {
    serde_json::from_value(json!({
        "apiVersion": "marin3r.3scale.net/v1alpha1",
        "kind": "EnvoyConfig",
        "metadata": {"name": "kuard", "namespace": "shop"},
        "spec": {"nodeID": "kuard-gw", "resources": []},
    }))
    .unwrap()
}

fn observed(ed: &EnvoyDeployment) -> Observed<'_> {
    Observed {
        ed,
        spec: ed.resolve(),
        discovery_service: Some(mk_ds()),
        envoy_config: Some(mk_ec()),
        deployment: None,
        marin3r_image: "marin3r:v0.1.0".into(),
        json_logs: false,
        now: Time(Timestamp::UNIX_EPOCH),
    }
}

fn token() -> Result<String, NoRandomness> {
    Ok("fresh-token".into())
}

fn json_of<T: serde::Serialize>(v: &T) -> serde_json::Value {
    serde_json::to_value(v).unwrap()
}

#[test]
fn the_deployment_has_the_originals_names_and_the_sidecars_envoy() {
    let ed = mk_ed(json!({"ports": [{"name": "http", "port": 8080}], "replicas": {"static": 2}}));
    let children = decide(&observed(&ed), token).unwrap();
    let d = json_of(&children.deployment);
    assert_eq!(d["metadata"]["name"], "marin3r-envoydeployment-kuard");
    assert_eq!(d["metadata"]["ownerReferences"][0]["uid"], "u-1");
    let selector = json!({
        "app.kubernetes.io/name": "marin3r",
        "app.kubernetes.io/managed-by": "marin3r-operator",
        "app.kubernetes.io/component": "envoy-deployment",
        "app.kubernetes.io/instance": "kuard",
    });
    assert_eq!(d["spec"]["selector"]["matchLabels"], selector);
    assert_eq!(d["spec"]["replicas"], 2);
    let pod = &d["spec"]["template"]["spec"];
    assert_eq!(pod["automountServiceAccountToken"], false);
    let envoy = &pod["containers"][0];
    assert_eq!(envoy["name"], "envoy");
    assert_eq!(envoy["image"], "envoyproxy/envoy:v1.40.0");
    let args: Vec<String> = serde_json::from_value(envoy["args"].clone()).unwrap();
    assert_eq!(
        &args[..6],
        [
            "-c",
            "/etc/envoy/bootstrap/config.json",
            "--service-node",
            "kuard-gw",
            "--service-cluster",
            "kuard-gw"
        ]
    );
    // The sidecar's overlay: admin on loopback, the readiness listener on 9902.
    assert!(
        args[7].contains(r#""address":"127.0.0.1","port_value":9901"#),
        "{}",
        args[7]
    );
    assert!(args[7].contains("marin3r_sidecar_readiness"), "{}", args[7]);
    let readiness = &envoy["readinessProbe"];
    assert_eq!(readiness["httpGet"]["port"], 9902);
    assert_eq!(readiness["httpGet"]["path"], "/ready");
    assert_eq!(readiness["initialDelaySeconds"], 15);
    assert_eq!(envoy["livenessProbe"]["failureThreshold"], 10);
    assert_eq!(envoy["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        envoy["securityContext"]["capabilities"]["drop"],
        json!(["ALL"])
    );
    // Envoy's stats, as every sidecar has them: the readiness port, named, and annotated.
    assert_eq!(
        envoy["ports"],
        json!([
            {"name": "http", "containerPort": 8080, "protocol": "TCP"},
            {"name": "envoy-stats", "containerPort": 9902, "protocol": "TCP"},
        ])
    );
    assert_eq!(
        d["spec"]["template"]["metadata"]["annotations"],
        json!({
            "prometheus.io/scrape": "true",
            "prometheus.io/port": "9902",
            "prometheus.io/path": "/stats/prometheus",
        })
    );
    assert_eq!(
        pod["volumes"][0]["configMap"]["name"],
        "marin3r-envoydeployment-kuard"
    );
    assert_eq!(
        pod["volumes"][1]["secret"]["secretName"],
        "envoy-client-cert-kuard"
    );
    assert!(pod["containers"].as_array().unwrap().len() == 1);
    assert!(children.autoscaler.is_none() && children.pod_disruption_budget.is_none());

    let cert = json_of(&children.certificate);
    assert_eq!(cert["metadata"]["name"], "envoy-client-cert-kuard");
    assert_eq!(
        cert["spec"]["hosts"],
        json!(["spiffe://cluster.local/ns/shop"])
    );
    assert_eq!(cert["spec"]["validFor"], 48 * 3600);
    assert_eq!(
        cert["spec"]["signer"]["caSigned"]["caSecretRef"]["name"],
        "marin3r-ca-cert-instance"
    );
    let bootstrap = json_of(&children.bootstrap);
    assert!(
        bootstrap["data"]["config.json"]
            .as_str()
            .unwrap()
            .contains("marin3r-instance.shop.svc"),
        "{bootstrap}"
    );
}

#[test]
fn dynamic_replicas_leave_the_count_to_an_autoscaler_and_a_budget_is_built_when_asked() {
    let ed = mk_ed(json!({
        "replicas": {"dynamic": {"minReplicas": 2, "maxReplicas": 5}},
        "podDisruptionBudget": {"maxUnavailable": "25%"},
    }));
    let children = decide(&observed(&ed), token).unwrap();
    assert!(children.deployment.spec.replicas.is_none());
    let hpa = json_of(&children.autoscaler.unwrap());
    assert_eq!(hpa["metadata"]["name"], "marin3r-envoydeployment-kuard");
    assert_eq!(
        hpa["spec"]["scaleTargetRef"],
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "name": "marin3r-envoydeployment-kuard"})
    );
    assert_eq!(
        (
            hpa["spec"]["minReplicas"].clone(),
            hpa["spec"]["maxReplicas"].clone()
        ),
        (json!(2), json!(5))
    );
    let pdb = json_of(&children.pod_disruption_budget.unwrap());
    assert_eq!(pdb["spec"]["maxUnavailable"], "25%");
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"]["app.kubernetes.io/instance"],
        "kuard"
    );
}

#[test]
fn the_shutdown_manager_keeps_its_token_across_reconciles() {
    let ed = mk_ed(json!({"shutdownManager": {"drainTime": 20}}));
    let first = decide(&observed(&ed), token).unwrap();
    let pod = json_of(&first.deployment.spec.template.spec);
    assert_eq!(pod["terminationGracePeriodSeconds"], 35);
    assert_eq!(pod["containers"][1]["name"], "envoy-shtdn-mgr");
    assert_eq!(pod["containers"][1]["image"], "marin3r:v0.1.0");
    assert_eq!(
        pod["containers"][0]["lifecycle"]["preStop"]["httpGet"]["httpHeaders"][0]["value"],
        "Bearer fresh-token"
    );
    let mut obs = observed(&ed);
    obs.deployment = Some(first.deployment.clone());
    let again = decide(&obs, || Err(NoRandomness)).unwrap();
    assert_eq!(again.deployment, first.deployment);
    // Without one, and none can be drawn: the machine's fault, not the spec's.
    let err = decide(&observed(&ed), || Err(NoRandomness)).unwrap_err();
    assert_eq!(err.reason, Reason::ShutdownTokenUnavailable);
    assert!(err.message.contains("random source"), "{err:?}");
    // An operator logging JSON runs shutdown managers that do too.
    let mut obs = observed(&ed);
    obs.json_logs = true;
    let json = decide(&obs, token).unwrap();
    let pod = json_of(&json.deployment.spec.template.spec);
    let args = pod["containers"][1]["args"].as_array().unwrap();
    assert_eq!(args.last().unwrap(), "--log-format=json");
}

#[test]
fn what_is_missing_or_wrong_is_named_and_nothing_is_built() {
    let ed = mk_ed(json!({"replicas": {"static": 1, "dynamic": {"maxReplicas": 2}}}));
    let err = decide(&observed(&ed), token).unwrap_err();
    assert_eq!(err.reason, Reason::InvalidSpec);
    assert!(err.message.contains("spec.replicas"), "{err:?}");

    let ed = mk_ed(json!({}));
    let mut obs = observed(&ed);
    obs.discovery_service = None;
    let err = decide(&obs, token).unwrap_err();
    assert_eq!(err.reason, Reason::DiscoveryServiceNotFound);
    assert!(err.message.contains("spec.discoveryServiceRef"), "{err:?}");
    let mut obs = observed(&ed);
    obs.envoy_config = None;
    let err = decide(&obs, token).unwrap_err();
    assert_eq!(err.reason, Reason::EnvoyConfigNotFound);
    let outcome = not_ready(&obs, err);
    let ready = &outcome.status.conditions[0];
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "EnvoyConfigNotFound")
    );
    assert_eq!(outcome.requeue, None);
    assert_eq!(outcome.events.len(), 1);
}

#[test]
fn an_init_manager_is_reported_once_per_generation() {
    let mut ed = mk_ed(json!({"initManager": {"image": "quay.io/3scale/marin3r:v0.13.3"}}));
    let children = decide(&observed(&ed), token).unwrap();
    assert_eq!(children.events.len(), 1);
    ed.status = Some(EnvoyDeploymentStatus {
        observed_generation: Some(1),
        ..Default::default()
    });
    assert!(decide(&observed(&ed), token).unwrap().events.is_empty());
}

#[test]
fn ready_once_the_certificate_is_issued_and_the_deployment_rolled_out() {
    let ed = mk_ed(json!({}));
    let obs = observed(&ed);
    let children = decide(&obs, token).unwrap();
    let outcome = report(&obs, &children.certificate, None);
    assert_eq!(outcome.status.conditions[0].reason, "CertificateNotReady");
    let mut cert = children.certificate.clone();
    cert.status = serde_json::from_value(json!({"ready": true})).unwrap();
    let mut d = children.deployment.clone();
    d.metadata.generation = Some(1);
    d.status = serde_json::from_value(json!({"observedGeneration": 1, "replicas": 1,
        "updatedReplicas": 1, "readyReplicas": 1, "availableReplicas": 1}))
    .unwrap();
    let outcome = report(&obs, &cert, Some(&d));
    assert_eq!(outcome.status.conditions[0].status, "True");
    assert_eq!(
        outcome.status.deployment_name.as_deref(),
        Some("marin3r-envoydeployment-kuard")
    );
    assert_eq!(
        outcome
            .status
            .deployment_status
            .as_ref()
            .unwrap()
            .ready_replicas,
        Some(1)
    );
}

#[test]
fn turning_dynamic_hands_the_replica_count_over_once() {
    let d = |manager: &str, fields: serde_json::Value| -> Deployment {
        serde_json::from_value(json!({
            "metadata": {"name": "marin3r-envoydeployment-kuard", "namespace": "shop",
                "managedFields": [{"manager": manager, "operation": "Apply",
                    "apiVersion": "apps/v1", "fieldsType": "FieldsV1", "fieldsV1": fields}]},
            "spec": {"replicas": 3, "selector": {}, "template": {}},
        }))
        .unwrap()
    };
    let replicas = json!({"f:spec": {"f:replicas": {}, "f:template": {}}});
    let handover = super::super::build::replicas_handover(
        &d("marin3r-operator", replicas.clone()),
        "marin3r-operator",
    )
    .expect("the operator's apply owns the count");
    assert_eq!(handover["spec"], json!({"replicas": 3}));
    assert_eq!(
        handover["metadata"]["name"],
        "marin3r-envoydeployment-kuard"
    );
    // Once handed over (or set by someone else), nothing more to do.
    let without = json!({"f:spec": {"f:template": {}}});
    assert!(
        super::super::build::replicas_handover(&d("marin3r-operator", without), "marin3r-operator")
            .is_none()
    );
    assert!(
        super::super::build::replicas_handover(&d("kubectl", replicas), "marin3r-operator")
            .is_none()
    );
}

/// The pod template's annotations for a gateway annotated `annotation` (if any) whose
/// DiscoveryService has `spec.sidecar` `sidecar`.
fn template_annotations(
    annotation: Option<&str>,
    sidecar: serde_json::Value,
) -> Result<serde_json::Value, NotReady> {
    let mut ed = mk_ed(json!({}));
    if let Some(value) = annotation {
        ed.metadata.annotations =
            Some([(PROMETHEUS_ANNOTATIONS.to_owned(), value.to_owned())].into());
    }
    let mut obs = observed(&ed);
    let mut ds = json_of(&mk_ds());
    ds["spec"]["sidecar"] = sidecar;
    obs.discovery_service = Some(serde_json::from_value(ds).unwrap());
    let children = decide(&obs, token)?;
    Ok(json_of(&children.deployment)["spec"]["template"]["metadata"]["annotations"].clone())
}

#[test]
fn prometheus_annotations_follow_the_gateway_then_its_discovery_service() {
    let annotated = json!({
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "9902",
        "prometheus.io/path": "/stats/prometheus",
    });
    let off = json!({"prometheusAnnotations": false});
    let on = json!({"prometheusAnnotations": true});
    for (annotation, sidecar, want) in [
        (None, json!({}), &annotated),
        (None, on.clone(), &annotated),
        (None, off.clone(), &serde_json::Value::Null),
        (Some("false"), json!({}), &serde_json::Value::Null),
        (Some("false"), on, &serde_json::Value::Null),
        (Some("true"), off.clone(), &annotated),
        (Some("1"), off, &annotated),
    ] {
        let got = template_annotations(annotation, sidecar.clone()).unwrap();
        assert_eq!(&got, want, "{annotation:?} {sidecar}");
    }
    let err = template_annotations(Some("no"), json!({})).unwrap_err();
    assert_eq!(err.reason, Reason::InvalidSpec);
    assert_eq!(
        err.message,
        r#"metadata.annotations[marin3r.3scale.net/prometheus-annotations]: "no": must be true or false"#
    );
}
