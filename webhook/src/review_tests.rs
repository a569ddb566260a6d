use proptest::prelude::*;

use super::*;

fn request(object: Value) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "shop",
            "operation": "CREATE",
            "object": object,
        }
    })
}

fn pod(annotations: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "kuard-",
            "labels": {"marin3r.3scale.net/status": "enabled"},
            "annotations": annotations,
        },
        "spec": {"containers": [{"name": "app", "image": "kuard"}]},
    })
}

fn run(body: &Value) -> Value {
    review(body.to_string().as_bytes(), &InjectionConfig::default())
        .unwrap()
        .0
}

#[test]
fn an_injected_pod_gets_a_base64_json_patch() {
    let (out, outcome) = review(
        request(pod(json!({"marin3r.3scale.net/node-id": "kuard"})))
            .to_string()
            .as_bytes(),
        &InjectionConfig::default(),
    )
    .unwrap();
    assert_eq!(outcome, Outcome::Patched);
    assert_eq!(out["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(out["kind"], "AdmissionReview");
    let response = &out["response"];
    assert_eq!(response["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
    assert_eq!(response["allowed"], true);
    assert_eq!(response["patchType"], "JSONPatch");
    let patch = BASE64.decode(response["patch"].as_str().unwrap()).unwrap();
    let patch: json_patch::Patch = serde_json::from_slice(&patch).unwrap();
    assert_eq!(patch.0.len(), 3);
}

#[test]
fn a_bad_annotation_is_a_denial_naming_it() {
    let out = run(&request(pod(json!({
        "marin3r.3scale.net/node-id": "kuard",
        "marin3r.3scale.net/ports": "http:99999",
    }))));
    assert_eq!(out["response"]["allowed"], false);
    assert_eq!(out["response"]["status"]["code"], 403);
    assert_eq!(
        out["response"]["status"]["message"],
        r#"marin3r.3scale.net/ports: "http:99999": port must be between 1 and 65535"#
    );
    assert!(out["response"].get("patch").is_none());
}

#[test]
fn unselected_pods_other_operations_and_kinds_pass_unchanged() {
    let mut unlabelled = pod(json!({"marin3r.3scale.net/node-id": "kuard"}));
    unlabelled["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("labels");
    let mut update = request(pod(json!({})));
    update["request"]["operation"] = json!("UPDATE");
    let mut service = request(json!({"kind": "Service"}));
    service["request"]["kind"]["kind"] = json!("Service");
    for body in [request(unlabelled), update, service.clone()] {
        let out = run(&body);
        assert_eq!(out["response"]["allowed"], true, "{body}");
        assert!(out["response"].get("patch").is_none());
    }
    assert_eq!(
        run(&service)["response"]["warnings"][0],
        "marin3r sidecar injection only handles Pods, not \"Service\""
    );
}

#[test]
fn a_review_without_a_valid_pod_is_denied() {
    let out = run(&request(Value::Null));
    assert_eq!(
        out["response"]["status"]["message"],
        "the AdmissionReview request has no object"
    );
    let out = run(&request(
        json!({"metadata": {"labels": "nope"}, "spec": {}}),
    ));
    let message = out["response"]["status"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("the object is not a valid Pod: "),
        "{message}"
    );
}

#[test]
fn bodies_that_are_not_admission_reviews_are_bad_requests() {
    let cases: [(&[u8], &str); 7] = [
        (b"", "the body is not JSON: EOF while parsing a value at line 1 column 0"),
        (b"<xml/>", "the body is not JSON: expected value at line 1 column 1"),
        (b"[1,2]", "the body is not a JSON object (expected an AdmissionReview)"),
        (
            br#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview"}"#,
            r#"expected apiVersion "admission.k8s.io/v1" and kind "AdmissionReview", got "admission.k8s.io/v1beta1" and "AdmissionReview""#,
        ),
        (
            br#"{"kind":"Pod"}"#,
            r#"expected apiVersion "admission.k8s.io/v1" and kind "AdmissionReview", got nothing and "Pod""#,
        ),
        (
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#,
            "the AdmissionReview has no request object",
        ),
        (
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":""}}"#,
            "the AdmissionReview request has no uid",
        ),
    ];
    for (body, want) in cases {
        let err = review(body, &InjectionConfig::default()).unwrap_err();
        assert_eq!(err.to_string(), want);
    }
}

#[test]
fn deeply_nested_json_is_refused_not_a_stack_overflow() {
    let body = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let err = review(body.as_bytes(), &InjectionConfig::default()).unwrap_err();
    assert!(err.0.contains("recursion limit"), "{err}");
}

/// Arbitrary JSON values, a few levels deep.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        "[a-zA-Z0-9:./ -]{0,12}".prop_map(Value::String),
        prop::sample::select(vec![
            "Pod",
            "CREATE",
            "enabled",
            "kuard",
            "http:99999",
            "v1"
        ])
        .prop_map(|s| Value::String(s.into())),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(
                prop::sample::select(vec![
                    "metadata",
                    "spec",
                    "containers",
                    "name",
                    "labels",
                    "annotations",
                    "volumes",
                    "image",
                    "marin3r.3scale.net/status",
                    "marin3r.3scale.net/node-id",
                    "marin3r.3scale.net/ports",
                    "kind",
                    "operation",
                    "uid",
                ])
                .prop_map(String::from),
                inner,
                0..5,
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(body in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = review(&body, &InjectionConfig::default());
    }

    /// Structurally plausible reviews with arbitrary objects: always a response or a 400.
    #[test]
    fn arbitrary_objects_never_panic(object in json_value(), op in prop::sample::select(vec!["CREATE", "UPDATE"])) {
        let mut body = request(object);
        body["request"]["operation"] = json!(op);
        let body = body.to_string();
        let result = review(body.as_bytes(), &InjectionConfig::default());
        if let Ok((out, _)) = &result {
            prop_assert!(out["response"]["allowed"].is_boolean());
        }
        // The typed fast path decides exactly as the JSON-tree path does.
        prop_assert_eq!(result, review_tree(body.as_bytes(), &InjectionConfig::default()));
    }

    /// Real pods with arbitrary marin3r annotations: allowed with a patch that applies, or
    /// denied with a message.
    #[test]
    fn arbitrary_annotations_never_panic(
        annotations in prop::collection::btree_map(
            prop::sample::select(vec![
                "marin3r.3scale.net/node-id", "marin3r.3scale.net/ports",
                "marin3r.3scale.net/host-port-mappings", "marin3r.3scale.net/admin.port",
                "marin3r.3scale.net/envoy-extra-args", "marin3r.3scale.net/container-name",
                "marin3r.3scale.net/resources.limits.cpu", "marin3r.3scale.net/injected",
            ]),
            "[a-z0-9:,\" -]{0,16}",
            0..6,
        )
    ) {
        let object = pod(json!(annotations));
        let body = request(object.clone()).to_string();
        let (out, outcome) = review(body.as_bytes(), &InjectionConfig::default()).unwrap();
        prop_assert_eq!(
            review_tree(body.as_bytes(), &InjectionConfig::default()).unwrap(),
            (out.clone(), outcome.clone())
        );
        match outcome {
            Outcome::Patched => {
                let patch = BASE64.decode(out["response"]["patch"].as_str().unwrap()).unwrap();
                let patch: json_patch::Patch = serde_json::from_slice(&patch).unwrap();
                let mut doc = object;
                prop_assert!(json_patch::patch(&mut doc, &patch.0).is_ok());
            }
            Outcome::Unchanged => prop_assert_eq!(&out["response"]["allowed"], &json!(true)),
            Outcome::Denied(m) => prop_assert!(!m.is_empty()),
        }
    }
}
