//! The local cluster is as strict as a real API server where marin3r depends on it:
//! structural-schema pruning, defaulting and validation of custom resources; name, label and
//! annotation validation; request and object size limits; authentication and RBAC for
//! service-account tokens, including the escalation check on Roles and bindings. Each case
//! would pass on a lenient server and fails here, with the error a real server gives.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Api, Client};
use marin3r_local_cluster::apiserver::{ApiServer, ApiServerConfig};
use serde_json::{Value, json};

const CRD: &str = r#"{
  "apiVersion": "apiextensions.k8s.io/v1",
  "kind": "CustomResourceDefinition",
  "metadata": {"name": "gadgets.strict.marin3r.io"},
  "spec": {
    "group": "strict.marin3r.io",
    "scope": "Namespaced",
    "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget"},
    "versions": [{
      "name": "v1", "served": true, "storage": true,
      "subresources": {"status": {}},
      "schema": {"openAPIV3Schema": {
        "type": "object",
        "properties": {
          "spec": {
            "type": "object",
            "required": ["nodeID"],
            "properties": {
              "nodeID": {"type": "string", "maxLength": 10, "pattern": "^[a-z]+$"},
              "mode": {"type": "string", "enum": ["json", "yaml"], "default": "json"},
              "port": {"type": "integer", "minimum": 1, "maximum": 65535},
              "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
              "byName": {"type": "object", "additionalProperties": {"type": "object", "properties": {"value": {"type": "string"}}}},
              "target": {"x-kubernetes-int-or-string": true},
              "template": {"type": "object", "x-kubernetes-embedded-resource": true, "properties": {"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}},
              "signer": {"type": "object", "minProperties": 1, "maxProperties": 1, "properties": {"a": {"type": "object"}, "b": {"type": "object"}}},
              "nested": {"type": "object", "default": {}, "properties": {"enabled": {"type": "boolean", "default": true}}}
            }
          },
          "status": {"type": "object", "properties": {"ready": {"type": "boolean"}}}
        }
      }}
    }]
  }
}"#;

async fn setup() -> (ApiServer, Client, String) {
    let server = ApiServer::start(ApiServerConfig::default()).await.unwrap();
    let client = server.kube_client().await.unwrap();
    let ns = format!("strict-{}", uuid::Uuid::new_v4().simple());
    let nss: Api<Namespace> = Api::all(client.clone());
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
    )
    .await
    .unwrap();
    (server, client, ns)
}

fn api_error(e: kube::Error) -> (u16, String, String) {
    match e {
        kube::Error::Api(s) => (s.code, s.reason, s.message),
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn gadgets(client: &Client, ns: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("strict.marin3r.io", "v1", "Gadget");
    Api::namespaced_with(client.clone(), ns, &ApiResource::from_gvk(&gvk))
}

fn gadget(value: Value) -> DynamicObject {
    let mut v = json!({"apiVersion": "strict.marin3r.io/v1", "kind": "Gadget"});
    for (k, x) in value.as_object().unwrap() {
        v[k] = x.clone();
    }
    serde_json::from_value(v).unwrap()
}

async fn install_crd(server: &ApiServer) {
    let crd: CustomResourceDefinition = serde_json::from_str(CRD).unwrap();
    server.install_crds([crd]).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_resources_are_pruned_defaulted_and_validated() {
    let (server, client, ns) = setup().await;
    install_crd(&server).await;
    let api = gadgets(&client, &ns);

    // Unknown fields go (in spec, at the root and in metadata); known ones, preserved
    // subtrees, map values, int-or-string and embedded resources stay; defaults fill in.
    let created = api
        .create(
            &PostParams::default(),
            &gadget(json!({
                "metadata": {"name": "g"},
                "spec": {
                    "nodeID": "abc",
                    "unknownField": 1,
                    "free": {"anything": {"goes": [1]}},
                    "byName": {"x": {"value": "v", "dropped": true}},
                    "target": "50%",
                    "template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "junk": 1}, "spec": {"kept": 1}, "other": 2},
                    "signer": {"a": {}},
                },
                "topLevelJunk": {"x": 1},
            })),
        )
        .await
        .unwrap();
    let spec = &created.data["spec"];
    assert_eq!(
        *spec,
        json!({
            "nodeID": "abc",
            "mode": "json",
            "free": {"anything": {"goes": [1]}},
            "byName": {"x": {"value": "v"}},
            "target": "50%",
            "template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"kept": 1}},
            "signer": {"a": {}},
            "nested": {"enabled": true},
        }),
        "{created:?}"
    );
    assert!(created.data.get("topLevelJunk").is_none());

    // metadata is pruned to ObjectMeta (sent raw: typed clients cannot even say this).
    let raw = json!({"apiVersion": "strict.marin3r.io/v1", "kind": "Gadget", "metadata": {"name": "m", "bogus": "x"}, "spec": {"nodeID": "m"}});
    let req = http::Request::post(format!(
        "/apis/strict.marin3r.io/v1/namespaces/{ns}/gadgets"
    ))
    .header("content-type", "application/json")
    .body(serde_json::to_vec(&raw).unwrap())
    .unwrap();
    let stored: Value = client.request(req).await.unwrap();
    assert!(stored["metadata"].get("bogus").is_none(), "{stored}");

    // Patches and server-side apply are pruned too.
    let patched = api
        .patch(
            "g",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"port": 8080, "sneaky": true}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.data["spec"]["port"], 8080);
    assert!(patched.data["spec"].get("sneaky").is_none());
    let applied = api
        .patch(
            "a",
            &PatchParams::apply("strict-test"),
            &Patch::Apply(gadget(
                json!({"metadata": {"name": "a"}, "spec": {"nodeID": "a", "applyJunk": 1}}),
            )),
        )
        .await
        .unwrap();
    assert!(applied.data["spec"].get("applyJunk").is_none());
    assert_eq!(applied.data["spec"]["mode"], "json");

    // The status subresource is pruned against the schema's status.
    let status = api
        .patch_status(
            "g",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"ready": true, "extra": "x"}})),
        )
        .await
        .unwrap();
    assert_eq!(status.data["status"], json!({"ready": true}));

    // Invalid objects are refused with 422 naming every bad field.
    let err = api
        .create(
            &PostParams::default(),
            &gadget(json!({
                "metadata": {"name": "bad"},
                "spec": {"mode": "xml", "port": 70000, "signer": {"a": {}, "b": {}}, "nested": {"enabled": "yes"}},
            })),
        )
        .await
        .unwrap_err();
    let (code, reason, message) = api_error(err);
    assert_eq!((code, reason.as_str()), (422, "Invalid"), "{message}");
    for want in [
        "Gadget.strict.marin3r.io \"bad\" is invalid: [",
        "spec.nodeID: Required value",
        "spec.mode: Unsupported value: \"xml\": supported values: \"json\", \"yaml\"",
        "spec.port: Invalid value: 70000: spec.port in body should be less than or equal to 65535",
        "spec.signer: Too many: 2: must have at most 1 items",
        "spec.nested.enabled: Invalid value: \"string\": spec.nested.enabled in body must be of type boolean: \"string\"",
    ] {
        assert!(message.contains(want), "{want:?} not in {message}");
    }
    for (spec, want) in [
        (
            json!({"nodeID": "UPPER"}),
            "spec.nodeID: Invalid value: \"UPPER\": spec.nodeID in body should match '^[a-z]+$'",
        ),
        (
            json!({"nodeID": "abcdefghijk"}),
            "spec.nodeID: Too long: may not be more than 10 bytes",
        ),
        (
            json!({"nodeID": "a", "signer": {}}),
            "spec.signer: Invalid value: 0: spec.signer in body should have at least 1 properties",
        ),
        (
            json!({"nodeID": "a", "port": "80"}),
            "spec.port: Invalid value: \"string\": spec.port in body must be of type integer",
        ),
    ] {
        let err = api
            .create(
                &PostParams::default(),
                &gadget(json!({"metadata": {"name": "bad"}, "spec": spec})),
            )
            .await
            .unwrap_err();
        let (code, _, message) = api_error(err);
        assert_eq!(code, 422, "{message}");
        assert!(message.contains(want), "{want:?} not in {message}");
    }
    // An update that breaks the schema is refused and the stored object is unchanged.
    let err = api
        .patch(
            "g",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"port": 0}})),
        )
        .await
        .unwrap_err();
    assert_eq!(api_error(err).0, 422);
    assert_eq!(api.get("g").await.unwrap().data["spec"]["port"], 8080);

    // Defaults added to the schema later show on read of objects stored before.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.patch(
        "gadgets.strict.marin3r.io",
        &PatchParams::default(),
        &Patch::Json::<()>(
            serde_json::from_value(json!([{"op": "add", "path": "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/port/default", "value": 9000}]))
                .unwrap(),
        ),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(api.get("a").await.unwrap().data["spec"]["port"], 9000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_labels_and_annotations_are_validated() {
    let (_server, client, ns) = setup().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let create = |v: Value| {
        let cms = cms.clone();
        async move {
            cms.create(&PostParams::default(), &serde_json::from_value(v).unwrap())
                .await
        }
    };
    let long = "a".repeat(64);
    for (meta, want) in [
        (
            json!({"name": "c1", "labels": {"app": long}}),
            format!("metadata.labels: Invalid value: \"{long}\": must be no more than 63 characters"),
        ),
        (
            json!({"name": "c2", "labels": {"app": "has space"}}),
            "metadata.labels: Invalid value: \"has space\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character".to_owned(),
        ),
        (
            json!({"name": "c3", "labels": {"Bad_Prefix.com/x": "v"}}),
            "metadata.labels: Invalid value: \"Bad_Prefix.com/x\": prefix part a lowercase RFC 1123 subdomain".to_owned(),
        ),
        (
            json!({"name": "c4", "labels": {"-x": "v"}}),
            "metadata.labels: Invalid value: \"-x\": name part must consist of alphanumeric characters".to_owned(),
        ),
        (
            json!({"name": "c5", "annotations": {"big": "x".repeat(256 * 1024)}}),
            "metadata.annotations: Too long: may not be more than 262144 bytes".to_owned(),
        ),
        (
            json!({"name": "Upper"}),
            "metadata.name: Invalid value: \"Upper\": a lowercase RFC 1123 subdomain must consist of".to_owned(),
        ),
    ] {
        let (code, reason, message) = api_error(
            create(json!({"metadata": meta}))
                .await
                .unwrap_err(),
        );
        assert_eq!((code, reason.as_str()), (422, "Invalid"), "{message}");
        assert!(message.starts_with("ConfigMap "), "{message}");
        assert!(message.contains(&want), "{want:?} not in {message}");
    }
    // Empty label values, prefixed keys and 63-character values are fine.
    create(json!({"metadata": {"name": "ok", "labels": {"empty": "", "app.kubernetes.io/name": "a".repeat(63)}}}))
        .await
        .unwrap();
    // A patch that adds a bad label is refused too.
    let err = cms
        .patch(
            "ok",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "a/b"}}})),
        )
        .await
        .unwrap_err();
    assert_eq!(api_error(err).0, 422);

    // Names follow the kind's rule.
    let nss: Api<Namespace> = Api::all(client.clone());
    let err = nss
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "a.b"}})).unwrap(),
        )
        .await
        .unwrap_err();
    let (code, _, message) = api_error(err);
    assert_eq!(code, 422);
    assert!(message.contains("a lowercase RFC 1123 label"), "{message}");
    let svcs: Api<Service> = Api::namespaced(client.clone(), &ns);
    let err = svcs
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "1svc"}, "spec": {"ports": [{"port": 80}]}}),
            )
            .unwrap(),
        )
        .await
        .unwrap_err();
    let (code, _, message) = api_error(err);
    assert_eq!(code, 422);
    assert!(message.contains("a DNS-1035 label"), "{message}");
    // RBAC objects may have colons in their names, like the built-in system: roles.
    let crs: Api<ClusterRole> = Api::all(client.clone());
    crs.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": format!("strict:{ns}")}, "rules": []}))
            .unwrap(),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_and_object_sizes_are_limited() {
    let (server, client, ns) = setup().await;
    install_crd(&server).await;
    // A body over 3 MiB: 413 before anything is decoded.
    let huge = json!({"metadata": {"name": "huge"}, "data": {"x": "x".repeat(3 * 1024 * 1024)}});
    let req = http::Request::post(format!("/api/v1/namespaces/{ns}/configmaps"))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&huge).unwrap())
        .unwrap();
    let (code, reason, message) = api_error(client.request::<Value>(req).await.unwrap_err());
    assert_eq!(
        (code, reason.as_str(), message.as_str()),
        (
            413,
            "RequestEntityTooLarge",
            "Request entity too large: limit is 3145728"
        )
    );
    // A Secret over 1 MiB of data is invalid.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let secret: Secret = serde_json::from_value(
        json!({"metadata": {"name": "s"}, "stringData": {"x": "x".repeat(1024 * 1024 + 1)}}),
    )
    .unwrap();
    let (code, _, message) = api_error(
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 422);
    assert!(
        message.contains("data: Too long: must have at most 1048576 bytes"),
        "{message}"
    );
    // An object over etcd's 1.5 MiB: the body is within 3 MiB, the store refuses it.
    let api = gadgets(&client, &ns);
    let (code, reason, message) = api_error(
        api.create(
            &PostParams::default(),
            &gadget(json!({"metadata": {"name": "big"}, "spec": {"nodeID": "big", "free": {"x": "x".repeat(2 * 1024 * 1024)}}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(
        (code, reason.as_str(), message.as_str()),
        (
            413,
            "RequestEntityTooLarge",
            "etcdserver: request is too large"
        )
    );
    assert_eq!(api_error(api.get("big").await.unwrap_err()).0, 404);
}

/// A client of the cluster authenticating with `token`.
async fn client_with_token(server: &ApiServer, token: &str) -> Client {
    let kubeconfig = server
        .kubeconfig()
        .replace("token: local-cluster", &format!("token: {token}"));
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    Client::try_from(config).unwrap()
}

async fn create<K>(api: &Api<K>, value: Value) -> K
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    api.create(
        &PostParams::default(),
        &serde_json::from_value(value).unwrap(),
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_account_tokens_are_held_to_rbac() {
    let (server, admin, ns) = setup().await;
    let other = format!("{ns}-other");
    let nss: Api<Namespace> = Api::all(admin.clone());
    create(&nss, json!({"metadata": {"name": other}})).await;
    // Every namespace gets its `default` ServiceAccount.
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), &ns);
    sas.get("default").await.unwrap();
    create(&sas, json!({"metadata": {"name": "app"}})).await;
    let token = server.service_account_token(&ns, "app");
    let app = client_with_token(&server, &token).await;
    let user = format!("system:serviceaccount:{ns}:app");

    // No binding yet: 403 with Kubernetes' message.
    let secrets: Api<Secret> = Api::namespaced(app.clone(), &ns);
    let (code, reason, message) = api_error(secrets.list(&Default::default()).await.unwrap_err());
    assert_eq!((code, reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        message,
        format!(
            "secrets is forbidden: User \"{user}\" cannot list resource \"secrets\" in API group \"\" in the namespace \"{ns}\""
        )
    );
    // Discovery is open to every authenticated user, as system:discovery grants.
    app.list_api_groups().await.unwrap();
    app.list_core_api_versions().await.unwrap();
    app.apiserver_version().await.unwrap();

    // A Role bound in the namespace: get/list/watch of Secrets, update of one ConfigMap
    // only, pods/status only.
    let roles: Api<Role> = Api::namespaced(admin.clone(), &ns);
    create(
        &roles,
        json!({"metadata": {"name": "app"}, "rules": [
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "update", "patch"], "resourceNames": ["mine"]},
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
            {"apiGroups": [""], "resources": ["services"], "verbs": ["patch"]},
        ]}),
    )
    .await;
    let bindings: Api<RoleBinding> = Api::namespaced(admin.clone(), &ns);
    create(
        &bindings,
        json!({"metadata": {"name": "app"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "app"}, "subjects": [{"kind": "ServiceAccount", "name": "app", "namespace": ns}]}),
    )
    .await;
    secrets.list(&Default::default()).await.unwrap();
    // Not in another namespace.
    let elsewhere: Api<Secret> = Api::namespaced(app.clone(), &other);
    let (code, _, message) = api_error(elsewhere.list(&Default::default()).await.unwrap_err());
    assert_eq!(code, 403);
    assert!(
        message.contains(&format!("in the namespace \"{other}\"")),
        "{message}"
    );
    // Not other verbs.
    let s: Secret = serde_json::from_value(json!({"metadata": {"name": "s"}})).unwrap();
    let (code, _, message) = api_error(
        secrets
            .create(&PostParams::default(), &s)
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 403);
    assert!(
        message.contains("cannot create resource \"secrets\""),
        "{message}"
    );
    // resourceNames: the named ConfigMap only.
    let cms: Api<ConfigMap> = Api::namespaced(app.clone(), &ns);
    create(&cms, json!({"metadata": {"name": "mine"}})).await;
    create(&cms, json!({"metadata": {"name": "theirs"}})).await;
    let label = Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}}));
    cms.patch("mine", &PatchParams::default(), &label)
        .await
        .unwrap();
    let (code, _, message) = api_error(
        cms.patch("theirs", &PatchParams::default(), &label)
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 403);
    assert_eq!(
        message,
        format!(
            "configmaps \"theirs\" is forbidden: User \"{user}\" cannot patch resource \"configmaps\" in API group \"\" in the namespace \"{ns}\""
        )
    );
    let (code, _, _) = api_error(cms.list(&Default::default()).await.unwrap_err());
    assert_eq!(code, 403);
    // Server-side apply that would create an object needs `create` as well as `patch`.
    let app_svcs: Api<Service> = Api::namespaced(app.clone(), &ns);
    let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"}, "spec": {"ports": [{"port": 80}]}});
    let (code, _, message) = api_error(
        app_svcs
            .patch("web", &PatchParams::apply("app"), &Patch::Apply(&svc))
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 403);
    assert!(
        message.contains("cannot create resource \"services\""),
        "{message}"
    );
    let admin_svcs: Api<Service> = Api::namespaced(admin.clone(), &ns);
    create(
        &admin_svcs,
        json!({"metadata": {"name": "web"}, "spec": {"ports": [{"port": 80}]}}),
    )
    .await;
    app_svcs
        .patch("web", &PatchParams::apply("app"), &Patch::Apply(&svc))
        .await
        .unwrap();

    // Escalation: a Role granting what the subject does not hold is refused; one granting
    // what it holds is fine once it may write Roles.
    create(
        &roles,
        json!({"metadata": {"name": "role-writer"}, "rules": [
            {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles", "rolebindings"], "verbs": ["create"]},
        ]}),
    )
    .await;
    create(
        &bindings,
        json!({"metadata": {"name": "role-writer"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "role-writer"}, "subjects": [{"kind": "ServiceAccount", "name": "app", "namespace": ns}]}),
    )
    .await;
    let app_roles: Api<Role> = Api::namespaced(app.clone(), &ns);
    let wider = json!({"metadata": {"name": "wider"}, "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["delete"]}]});
    let (code, _, message) = api_error(
        app_roles
            .create(
                &PostParams::default(),
                &serde_json::from_value(wider).unwrap(),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 403);
    assert!(
        message.contains("roles.rbac.authorization.k8s.io \"wider\" is forbidden: user attempted to grant extra privileges"),
        "{message}"
    );
    create(
        &app_roles,
        json!({"metadata": {"name": "narrower"}, "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]}),
    )
    .await;
    // Binding a role it does not hold the permissions of is refused too.
    create(
        &roles,
        json!({"metadata": {"name": "admin-like"}, "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]}),
    )
    .await;
    let app_bindings: Api<RoleBinding> = Api::namespaced(app.clone(), &ns);
    let bind = json!({"metadata": {"name": "grab"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "admin-like"}, "subjects": [{"kind": "ServiceAccount", "name": "app", "namespace": ns}]});
    let (code, _, message) = api_error(
        app_bindings
            .create(
                &PostParams::default(),
                &serde_json::from_value(bind).unwrap(),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 403);
    assert!(
        message.contains("attempting to grant RBAC permissions not currently held"),
        "{message}"
    );
    // So is a binding to a role that does not exist.
    let dangling = json!({"metadata": {"name": "dangling"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "no-such-role"}, "subjects": [{"kind": "ServiceAccount", "name": "app", "namespace": ns}]});
    let (code, _, message) = api_error(
        app_bindings
            .create(
                &PostParams::default(),
                &serde_json::from_value(dangling).unwrap(),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 403);
    assert!(
        message.contains("clusterroles.rbac.authorization.k8s.io \"no-such-role\" not found"),
        "{message}"
    );
    // A binding to a role whose permissions it holds is fine.
    create(
        &app_bindings,
        json!({"metadata": {"name": "fine"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "narrower"}, "subjects": [{"kind": "ServiceAccount", "name": "app", "namespace": ns}]}),
    )
    .await;

    // A token nobody issued is 401; so is one whose ServiceAccount is gone.
    let stranger = client_with_token(&server, "not-a-token").await;
    let (code, reason, _) = api_error(stranger.list_api_groups().await.unwrap_err());
    assert_eq!((code, reason.as_str()), (401, "Unauthorized"));
    sas.delete("app", &Default::default()).await.unwrap();
    let (code, _, _) = api_error(secrets.list(&Default::default()).await.unwrap_err());
    assert_eq!(code, 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_shows_the_servers_refusals() {
    let (server, admin, ns) = setup().await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let k = marin3r_testkit::kubectl::Kubectl::new(&kubeconfig).unwrap();
    k.ok(&["-n", &ns, "create", "configmap", "c"])
        .await
        .unwrap();
    // (`kubectl label` checks values itself; a manifest goes to the server as it is.)
    let manifest =
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n  labels:\n    app: not valid!\n";
    let out = k
        .run_with(&["-n", &ns, "apply", "-f", "-"], manifest)
        .await
        .unwrap();
    assert!(!out.success);
    assert!(
        out.stderr.contains("ConfigMap \"c\" is invalid: metadata.labels: Invalid value: \"not valid!\": a valid label must be an empty string"),
        "{}",
        out.stderr
    );
    // kubectl asks for strict field validation: a typo is an error, not a silent prune.
    install_crd(&server).await;
    let typo = "apiVersion: strict.marin3r.io/v1\nkind: Gadget\nmetadata:\n  name: t\nspec:\n  nodeID: t\n  nodeId: typo\n";
    for args in [
        vec!["apply", "-f", "-"],
        vec!["apply", "--server-side", "-f", "-"],
        vec!["create", "-f", "-"],
    ] {
        let mut args = args;
        args.extend(["-n", ns.as_str()]);
        let out = k.run_with(&args, typo).await.unwrap();
        assert!(!out.success, "{args:?}");
        assert!(
            out.stderr.contains("unknown field \"spec.nodeId\""),
            "{args:?}: {}",
            out.stderr
        );
    }
    // Without strict validation the field is pruned, as a real server does.
    let out = k
        .run_with(&["apply", "--validate=false", "-n", &ns, "-f", "-"], typo)
        .await
        .unwrap();
    assert!(out.success, "{}", out.stderr);
    let stored = k
        .ok(&["-n", &ns, "get", "gadget", "t", "-o", "jsonpath={.spec}"])
        .await
        .unwrap();
    assert_eq!(
        stored,
        r#"{"mode":"json","nested":{"enabled":true},"nodeID":"t"}"#
    );

    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), &ns);
    create(&sas, json!({"metadata": {"name": "reader"}})).await;
    let token = server.service_account_token(&ns, "reader");
    let out = k
        .run(&["--token", &token, "-n", &ns, "get", "secrets"])
        .await
        .unwrap();
    assert!(!out.success);
    assert!(
        out.stderr.contains(&format!("Error from server (Forbidden): secrets is forbidden: User \"system:serviceaccount:{ns}:reader\" cannot list resource \"secrets\" in API group \"\" in the namespace \"{ns}\"")),
        "{}",
        out.stderr
    );
}

/// EndpointSlices (for `generateFromEndpointSlices`) are defaulted and validated as a real
/// API server does: the protocol defaults to TCP; addresses must be of the slice's type;
/// port names and numbers are checked; the address type cannot change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_slices_are_defaulted_and_validated() {
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    let (_server, client, ns) = setup().await;
    let slices: Api<EndpointSlice> = Api::namespaced(client, &ns);
    let slice = |name: &str, address_type: &str, address: &str, port: Value| {
        json!({
            "metadata": {"name": name, "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": address_type,
            "endpoints": [{"addresses": [address], "conditions": {"ready": true}}],
            "ports": [{"name": "http", "port": port}],
        })
    };
    let good = create(&slices, slice("web-a", "IPv4", "10.0.0.1", json!(8080))).await;
    assert_eq!(
        good.ports.unwrap()[0].protocol.as_deref(),
        Some("TCP"),
        "the protocol is defaulted"
    );

    let err = slices
        .create(
            &PostParams::default(),
            &serde_json::from_value(slice("web-b", "IPv4", "fd00::1", json!(0))).unwrap(),
        )
        .await
        .unwrap_err();
    let (code, reason, message) = api_error(err);
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
    assert!(
        message.contains(
            "endpoints[0].addresses[0]: Invalid value: \"fd00::1\": must be a valid IPv4 address"
        ),
        "{message}"
    );
    assert!(
        message.contains("ports[0].port: Invalid value: 0: must be between 1 and 65535"),
        "{message}"
    );

    let mut changed: EndpointSlice =
        serde_json::from_value(slice("web-a", "IPv6", "fd00::1", json!(8080))).unwrap();
    changed.metadata.resource_version =
        slices.get("web-a").await.unwrap().metadata.resource_version;
    let err = slices
        .replace("web-a", &PostParams::default(), &changed)
        .await
        .unwrap_err();
    let (code, _, message) = api_error(err);
    assert_eq!(code, 422);
    assert!(
        message.contains("addressType: Invalid value: \"IPv6\": field is immutable"),
        "{message}"
    );
}

/// An immutable Secret or ConfigMap keeps its content (only metadata changes, or deletion),
/// and a Secret keeps its type, with kube-apiserver's words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn immutable_secrets_and_config_maps_keep_their_content() {
    let (_server, client, ns) = setup().await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    create(
        &secrets,
        json!({"metadata": {"name": "frozen"}, "immutable": true, "stringData": {"k": "v"}}),
    )
    .await;
    let patch = |body: Value| async {
        let params = PatchParams::default();
        match secrets.patch("frozen", &params, &Patch::Merge(body)).await {
            Err(kube::Error::Api(s)) => (s.code, s.message),
            other => panic!("expected a refusal, got {other:?}"),
        }
    };
    let (code, message) = patch(json!({"stringData": {"k": "changed"}})).await;
    assert_eq!(code, 422);
    assert_eq!(
        message,
        "Secret \"frozen\" is invalid: data: Forbidden: field is immutable when `immutable` is set"
    );
    let (_, message) = patch(json!({"immutable": false})).await;
    assert!(message.contains("immutable: Forbidden"), "{message}");
    let (_, message) = patch(json!({"type": "kubernetes.io/tls"})).await;
    assert!(
        message.contains("type: Invalid value: \"kubernetes.io/tls\": field is immutable"),
        "{message}"
    );
    // Labels may change; the Secret may go.
    secrets
        .patch(
            "frozen",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
        )
        .await
        .unwrap();
    secrets.delete("frozen", &Default::default()).await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    create(
        &cms,
        json!({"metadata": {"name": "frozen"}, "immutable": true, "data": {"k": "v"}}),
    )
    .await;
    let err = cms
        .patch(
            "frozen",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"k": "w"}})),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("data: Forbidden: field is immutable"), "{err}");
}
