//! The EnvoyConfig validation review, with a validator standing in for the binary's.

use serde_json::json;

use super::*;

/// A validator that refuses every object whose `spec.nodeID` is not "good", naming the path.
fn validator() -> EnvoyConfigValidator {
    EnvoyConfigValidator::new(|namespace, object| {
        match object.pointer("/spec/nodeID").and_then(Value::as_str) {
            Some("good") => Vec::new(),
            _ => vec![
                format!("spec.nodeID: not good (namespace {namespace})"),
                "spec.resources[2].value: unknown field \"x\"".into(),
            ],
        }
    })
}

fn envoy_config(node_id: &str) -> Value {
    json!({
        "apiVersion": "marin3r.3scale.net/v1alpha1",
        "kind": "EnvoyConfig",
        "metadata": {"name": "ec", "namespace": "shop"},
        "spec": {"nodeID": node_id},
    })
}

fn request(operation: &str, object: Value, old: Value) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "kind": {"group": "marin3r.3scale.net", "version": "v1alpha1", "kind": "EnvoyConfig"},
            "resource": {"group": "marin3r.3scale.net", "version": "v1alpha1", "resource": "envoyconfigs"},
            "namespace": "shop",
            "operation": operation,
            "object": object,
            "oldObject": old,
        }
    })
}

fn run(body: &Value) -> (Value, Outcome) {
    let (out, outcome) = review_envoy_config(body.to_string().as_bytes(), &validator()).unwrap();
    assert_eq!(out["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(out["response"]["uid"], "u-1");
    (out["response"].clone(), outcome)
}

#[test]
fn a_valid_config_is_admitted_and_a_bad_one_denied_with_every_path() {
    for op in ["CREATE", "UPDATE"] {
        let (response, outcome) = run(&request(op, envoy_config("good"), Value::Null));
        assert_eq!(
            (response["allowed"].clone(), outcome),
            (json!(true), Outcome::Unchanged)
        );
        let (response, outcome) = run(&request(op, envoy_config("bad"), envoy_config("good")));
        let message =
            "spec.nodeID: not good (namespace shop); spec.resources[2].value: unknown field \"x\"";
        assert_eq!(outcome, Outcome::Denied(message.into()));
        assert_eq!(response["allowed"], false);
        assert_eq!(
            response["status"],
            json!({"status": "Failure", "code": 403, "reason": "Forbidden", "message": message})
        );
    }
}

#[test]
fn an_update_that_keeps_an_invalid_spec_is_admitted_with_warnings() {
    let mut relabelled = envoy_config("bad");
    relabelled["metadata"]["labels"] = json!({"team": "a"});
    let (response, outcome) = run(&request("UPDATE", relabelled, envoy_config("bad")));
    assert_eq!(outcome, Outcome::Unchanged);
    assert_eq!(response["allowed"], true);
    assert_eq!(
        response["warnings"][0],
        "the spec, unchanged by this update, is invalid: spec.nodeID: not good (namespace shop)"
    );
}

#[test]
fn other_kinds_and_operations_pass() {
    let mut pod = request("CREATE", envoy_config("bad"), Value::Null);
    pod["request"]["kind"] = json!({"group": "", "version": "v1", "kind": "Pod"});
    let (response, _) = run(&pod);
    assert_eq!(response["allowed"], true);
    assert_eq!(
        response["warnings"][0],
        "marin3r only validates EnvoyConfigs (marin3r.3scale.net), not \"Pod\" (\"\")"
    );
    for op in ["DELETE", "CONNECT"] {
        let (response, _) = run(&request(op, Value::Null, envoy_config("bad")));
        assert_eq!(response["allowed"], true, "{op}");
    }
}

#[test]
fn a_review_without_an_object_is_denied_and_garbage_is_a_bad_request() {
    for object in [Value::Null, json!("text"), json!([1])] {
        let (response, _) = run(&request("CREATE", object, Value::Null));
        assert_eq!(response["allowed"], false);
        assert_eq!(
            response["status"]["message"],
            "the AdmissionReview request has no object"
        );
    }
    for body in [
        &b"not json"[..],
        b"[]",
        b"{\"apiVersion\": \"admission.k8s.io/v1\", \"kind\": \"AdmissionReview\"}",
        b"{\"apiVersion\": \"admission.k8s.io/v1\", \"kind\": \"AdmissionReview\", \"request\": {\"uid\": \"\"}}",
        b"{\"apiVersion\": \"v1\", \"kind\": \"Pod\"}",
    ] {
        assert!(
            review_envoy_config(body, &validator()).is_err(),
            "{}",
            String::from_utf8_lossy(body)
        );
    }
}

#[test]
fn a_long_list_of_problems_is_cut_and_counted() {
    let many: Vec<String> = (0..1000)
        .map(|i| format!("spec.resources[{i}].value: unknown field \"conect_timeout\""))
        .collect();
    let m = message(&many);
    assert!(m.len() < MAX_MESSAGE_BYTES + 100, "{}", m.len());
    assert!(m.starts_with("spec.resources[0].value"), "{m}");
    assert!(m.ends_with("more problems"), "{m}");
}

#[test]
fn an_admitted_config_carries_the_validators_warnings() {
    let warning = validator().with_warnings(|namespace, object| {
        let node = object.pointer("/spec/nodeID").and_then(Value::as_str);
        vec![format!(
            "spec.resources[0].value: route.cluster: no cluster named \"x\" ({namespace}, {node:?})"
        )]
    });
    let body = request("CREATE", envoy_config("good"), Value::Null).to_string();
    let (out, _) = review_envoy_config(body.as_bytes(), &warning).unwrap();
    assert_eq!(out["response"]["allowed"], true);
    assert_eq!(
        out["response"]["warnings"],
        json!([
            "spec.resources[0].value: route.cluster: no cluster named \"x\" (shop, Some(\"good\"))"
        ])
    );
    // A denial says why; the warnings of a refused object are not added.
    let body = request("CREATE", envoy_config("bad"), Value::Null).to_string();
    let (out, _) = review_envoy_config(body.as_bytes(), &warning).unwrap();
    assert_eq!(out["response"]["allowed"], false);
    assert!(out["response"].get("warnings").is_none());
}

/// A validation's turn is taken by the namespace it is judged in: the head read without the
/// tree agrees with the tree's reading.
#[test]
fn the_head_names_the_namespace_the_object_is_judged_in() {
    let cases = [
        (
            json!({"uid": "a", "namespace": "shop", "object": {"metadata": {"namespace": "x"}}}),
            "a",
            "shop",
        ),
        (
            json!({"uid": "b", "object": {"metadata": {"namespace": "tea"}}}),
            "b",
            "tea",
        ),
        (
            json!({"uid": "c", "namespace": 7, "object": {"metadata": {"namespace": "tea"}}}),
            "c",
            "tea",
        ),
        (
            json!({"uid": "d", "namespace": {"a": [1, {"b": null}]}, "object": {"metadata": {"namespace": ["x"]}}}),
            "d",
            "",
        ),
        (json!({"uid": ["e"], "object": [1, 2]}), "", ""),
    ];
    for (request, uid, namespace) in cases {
        let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request});
        let body = review.to_string();
        let head = head(body.as_bytes());
        assert_eq!(
            (head.uid.as_str(), head.namespace.as_str()),
            (uid, namespace),
            "{body}"
        );
        if let Ok((_, tree)) = request_tree(body.as_bytes()) {
            assert_eq!(super::namespace(&tree), namespace, "{body}");
        }
    }
    for garbage in [
        "",
        "[1,2]",
        "{\"request\": \"x\"}",
        "{\"request\": {\"namespace\": \"a\", \"namespace\": \"b\"}}",
    ] {
        assert_eq!(head(garbage.as_bytes()), Head::default(), "{garbage}");
    }
}

#[test]
fn a_throttled_validation_is_denied_with_429() {
    let out = throttled("u-9", "too many".into());
    assert_eq!(out["response"]["uid"], "u-9");
    assert_eq!(out["response"]["allowed"], false);
    assert_eq!(out["response"]["status"]["code"], 429);
    assert_eq!(out["response"]["status"]["message"], "too many");
}
