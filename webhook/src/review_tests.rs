//! The AdmissionReview codec: what is a bad request, what is answered, and that it never panics.

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
    // Envoy, its two volumes, the `injected` marker, the three `prometheus.io/*`.
    assert_eq!(patch.0.len(), 6);
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

/// Found by `arbitrary_reviews_never_panic`: the typed fast path read an array as the
/// `kind` struct (serde takes a struct's fields in order from an array) and let the pod
/// through as "not a Pod", while the JSON-tree path decided on the pod.
#[test]
fn arrays_in_place_of_objects_decide_as_the_tree_path_does() {
    let mut body = request(pod(json!({"marin3r.3scale.net/ports": "http:99999"})));
    body["request"]["kind"] = json!(["", "v1", "Deployment"]);
    let body = body.to_string();
    let config = InjectionConfig::default();
    let (out, outcome) = review(body.as_bytes(), &config).unwrap();
    assert!(matches!(outcome, Outcome::Denied(_)), "{out}");
    assert_eq!(
        review_tree(body.as_bytes(), &config).unwrap(),
        (out, outcome)
    );
    let top_level = json!([
        "admission.k8s.io/v1",
        "AdmissionReview",
        request(json!(null))["request"]
    ]);
    let err = review(top_level.to_string().as_bytes(), &config).unwrap_err();
    assert!(err.0.contains("not a JSON object"), "{err}");
}

/// Found by `arbitrary_reviews_never_panic`: serde_json skips the fields the typed path does
/// not read without checking their UTF-8 or surrogate escapes, so the typed path decided on
/// bodies the JSON tree refuses as not JSON.
#[test]
fn invalid_strings_in_unread_fields_are_bad_requests_on_both_paths() {
    let config = InjectionConfig::default();
    let good = request(pod(json!({}))).to_string();
    let mut bad_utf8 = good.replace("\"shop\"", "\"sh_p\"").into_bytes();
    let at = bad_utf8.windows(4).position(|w| w == b"sh_p").unwrap() + 2;
    bad_utf8[at] = 0x80;
    let lone_surrogate = good.replace("\"shop\"", "\"sh\\uDC00p\"").into_bytes();
    for body in [bad_utf8, lone_surrogate] {
        let err = review(&body, &config).unwrap_err();
        assert!(err.0.contains("not JSON"), "{err}");
        assert_eq!(review_tree(&body, &config), Err(err));
    }
    // A surrogate pair is valid JSON and decided as usual.
    let pair = good.replace("\"shop\"", "\"sh\\uD83D\\uDE00p\"");
    assert!(review(pair.as_bytes(), &config).is_ok());
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

/// A field that is usually `valid`, sometimes missing, sometimes any JSON value.
fn field(valid: Value) -> impl Strategy<Value = Option<Value>> {
    prop_oneof![
        4 => Just(Some(valid)),
        1 => Just(None),
        1 => json_value().prop_map(Some),
    ]
}

fn object_of(fields: Vec<(&'static str, Option<Value>)>) -> Value {
    Value::Object(
        fields
            .into_iter()
            .filter_map(|(k, v)| Some((k.to_owned(), v?)))
            .collect(),
    )
}

/// A pod as the API server sends it, with arbitrary marin3r annotations and labels, or any
/// JSON value in its place.
fn pod_document() -> impl Strategy<Value = Value> {
    let annotations = prop::collection::btree_map(
        prop::sample::select(vec![
            "marin3r.3scale.net/node-id",
            "marin3r.3scale.net/ports",
            "marin3r.3scale.net/host-port-mappings",
            "marin3r.3scale.net/envoy-image",
            "marin3r.3scale.net/admin.port",
            "marin3r.3scale.net/envoy-extra-args",
            "marin3r.3scale.net/resources.limits.memory",
            "marin3r.3scale.net/shutdown-manager.enabled",
            "marin3r.3scale.net/injected",
            "other/annotation",
        ]),
        prop_oneof!["[ -~]{0,24}", "[a-z0-9:,.=-]{0,24}"],
        0..5,
    );
    let status = prop::sample::select(vec!["enabled", "disabled", "", "ENABLED"]);
    prop_oneof![
        4 => (annotations, status, field(json!([{"name": "app", "image": "kuard"}])))
            .prop_map(|(annotations, status, containers)| {
                json!({
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "generateName": "kuard-",
                        "labels": {"marin3r.3scale.net/status": status},
                        "annotations": annotations,
                    },
                    "spec": object_of(vec![("containers", containers)]),
                })
            }),
        1 => json_value(),
    ]
}

fn review_document() -> impl Strategy<Value = Value> {
    let uid = prop_oneof![
        Just(json!("705ab4f5-6393-11e8-b7cc-42010a800002")),
        Just(json!("")),
        "[ -~]{0,40}".prop_map(Value::String),
    ];
    let operation = prop::sample::select(vec!["CREATE", "UPDATE", "DELETE", "CONNECT", "create"])
        .prop_map(|s| json!(s));
    let request = (
        field(json!("uid")).prop_flat_map(move |u| {
            let uid = uid.clone();
            uid.prop_map(move |v| if u.is_some() { Some(v) } else { None })
        }),
        field(json!({"group": "", "version": "v1", "kind": "Pod"})),
        field(json!({"group": "", "version": "v1", "resource": "pods"})),
        field(json!("shop")),
        prop_oneof![3 => operation.prop_map(Some), 1 => field(json!("CREATE"))],
        prop_oneof![4 => pod_document().prop_map(Some), 1 => Just(None)],
        field(json!(false)),
    )
        .prop_map(
            |(uid, kind, resource, namespace, operation, object, dry_run)| {
                object_of(vec![
                    ("uid", uid),
                    ("kind", kind),
                    ("resource", resource),
                    ("namespace", namespace),
                    ("operation", operation),
                    ("object", object),
                    ("dryRun", dry_run),
                ])
            },
        );
    (
        field(json!("admission.k8s.io/v1")),
        field(json!("AdmissionReview")),
        prop_oneof![5 => request.prop_map(Some), 1 => field(json!({}))],
    )
        .prop_map(|(api_version, kind, request)| {
            object_of(vec![
                ("apiVersion", api_version),
                ("kind", kind),
                ("request", request),
            ])
        })
}

/// What is done to the serialized document's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum BytesMutation {
    None,
    /// Cut at this fraction (per mille) of its length.
    Truncate(usize),
    /// Set the byte at this fraction (per mille) of its length.
    Replace(usize, u8),
}

impl BytesMutation {
    fn apply(&self, body: &mut Vec<u8>) {
        let at = |permille: usize| body.len() * permille / 1000;
        match *self {
            Self::None => {}
            Self::Truncate(p) => body.truncate(at(p)),
            Self::Replace(p, b) => {
                let i = at(p);
                if let Some(byte) = body.get_mut(i) {
                    *byte = b;
                }
            }
        }
    }
}

fn bytes_mutation() -> impl Strategy<Value = BytesMutation> {
    prop_oneof![
        6 => Just(BytesMutation::None),
        1 => (0usize..1000).prop_map(BytesMutation::Truncate),
        1 => (0usize..1000, any::<u8>()).prop_map(|(p, b)| BytesMutation::Replace(p, b)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// AdmissionReview-shaped documents whose every field is valid, missing or any JSON value,
    /// sometimes cut short or with a byte changed: they get past the JSON parser into the
    /// envelope checks and the pod decision. Always a response for the request's uid, or a 400
    /// naming the problem; the typed fast path agrees with the JSON-tree path.
    #[test]
    fn arbitrary_reviews_never_panic(doc in review_document(), cut in bytes_mutation()) {
        let mut body = doc.to_string().into_bytes();
        cut.apply(&mut body);
        let config = InjectionConfig::default();
        let result = review(&body, &config);
        match &result {
            Ok((out, _)) => {
                prop_assert_eq!(&out["apiVersion"], &json!("admission.k8s.io/v1"));
                prop_assert!(out["response"]["allowed"].is_boolean());
                if cut == BytesMutation::None {
                    prop_assert_eq!(&out["response"]["uid"], &doc["request"]["uid"]);
                }
            }
            Err(bad) => prop_assert!(!bad.0.is_empty()),
        }
        prop_assert_eq!(result, review_tree(&body, &config));
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

#[test]
fn warnings_of_an_injected_pod_reach_the_response() {
    let (out, outcome) = review(
        request(pod(json!({
            "marin3r.3scale.net/node-id": "kuard",
            "marin3r.3scale.net/init-manager.image": "quay.io/3scale/marin3r:v0.13.0",
        })))
        .to_string()
        .as_bytes(),
        &InjectionConfig::default(),
    )
    .unwrap();
    assert_eq!(outcome, Outcome::Patched);
    let warnings = out["response"]["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 1);
    assert!(
        warnings[0].as_str().unwrap().starts_with(
            "marin3r.3scale.net/init-manager.image=\"quay.io/3scale/marin3r:v0.13.0\" has no effect"
        ),
        "{warnings:?}"
    );
}

#[test]
fn an_injected_pod_with_an_unknown_annotation_is_patched_and_warned() {
    let out = run(&request(pod(json!({
        "marin3r.3scale.net/node-id": "kuard",
        "marin3r.3scale.net/envoy-imgae": "v1",
    }))));
    let response = &out["response"];
    assert_eq!(response["allowed"], true);
    assert_eq!(response["patchType"], "JSONPatch");
    assert_eq!(
        response["warnings"],
        json!([
            "annotation marin3r.3scale.net/envoy-imgae is not a marin3r annotation and has no effect; did you mean marin3r.3scale.net/envoy-image?"
        ])
    );
    // A pod without unknown annotations gets no warnings field at all.
    let clean = run(&request(pod(
        json!({"marin3r.3scale.net/node-id": "kuard"}),
    )));
    assert!(clean["response"].get("warnings").is_none(), "{clean}");
}
