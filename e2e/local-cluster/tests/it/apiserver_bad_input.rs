//! Bad requests get a clear Status error naming what is wrong, never a hang or a crash:
//! raw HTTP to the plain loopback port, so nothing in a client library hides the answer.

use std::time::Duration;

use marin3r_local_cluster::apiserver::{ApiServer, ApiServerConfig};
use serde_json::Value;

/// (status code, Status reason, Status message) of one request.
fn call(
    base: &str,
    method: &str,
    path: &str,
    content_type: &str,
    body: &str,
) -> (u16, String, String) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    let url = format!("{base}{path}");
    let mut response = match method {
        "GET" => agent.get(&url).call(),
        "POST" => agent
            .post(&url)
            .header("content-type", content_type)
            .send(body),
        "PATCH" => agent
            .patch(&url)
            .header("content-type", content_type)
            .send(body),
        "PUT" => agent
            .put(&url)
            .header("content-type", content_type)
            .send(body),
        other => panic!("{other}"),
    }
    .unwrap();
    let code = response.status().as_u16();
    let text = response.body_mut().read_to_string().unwrap();
    let status: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    let field = |k: &str| status[k].as_str().unwrap_or("").to_owned();
    (code, field("reason"), field("message"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_clear_errors() {
    let server = ApiServer::start(ApiServerConfig {
        plain_http: true,
        ..ApiServerConfig::default()
    })
    .await
    .unwrap();
    let base = server.http_url().unwrap();
    tokio::task::spawn_blocking(move || {
        let cms = "/api/v1/namespaces/default/configmaps";
        let json = "application/json";
        let check = |got: (u16, String, String), code: u16, reason: &str, says: &str| {
            assert_eq!((got.0, got.1.as_str()), (code, reason), "{got:?}");
            assert!(got.2.contains(says), "{:?} should mention {says:?}", got.2);
        };

        check(
            call(&base, "GET", "/apis/nope.example.com/v1/things", "", ""),
            404,
            "NotFound",
            "could not find the requested resource",
        );
        check(
            call(
                &base,
                "GET",
                &format!("{cms}?labelSelector=app%20in%20web"),
                "",
                "",
            ),
            400,
            "BadRequest",
            "unable to parse requirement",
        );
        check(
            call(
                &base,
                "GET",
                &format!("{cms}?fieldSelector=metadata.name"),
                "",
                "",
            ),
            400,
            "BadRequest",
            "invalid selector",
        );
        check(
            call(
                &base,
                "GET",
                &format!("{cms}?watch=true&resourceVersion=abc"),
                "",
                "",
            ),
            400,
            "BadRequest",
            "invalid resourceVersion",
        );
        check(
            call(&base, "POST", cms, json, "{not json"),
            400,
            "BadRequest",
            "could not be decoded",
        );
        check(
            call(&base, "POST", cms, json, "[1, 2]"),
            400,
            "BadRequest",
            "must be an object",
        );
        check(
            call(
                &base,
                "POST",
                cms,
                json,
                r#"{"kind": "Secret", "metadata": {"name": "a"}}"#,
            ),
            400,
            "BadRequest",
            "does not match",
        );
        check(
            call(&base, "POST", cms, json, r#"{"metadata": {}}"#),
            422,
            "Invalid",
            "name or generateName is required",
        );
        check(
            call(
                &base,
                "POST",
                cms,
                json,
                r#"{"metadata": {"name": "UPPER"}}"#,
            ),
            422,
            "Invalid",
            "RFC 1123",
        );
        check(
            call(
                &base,
                "POST",
                cms,
                json,
                r#"{"metadata": {"name": "a", "namespace": "other"}}"#,
            ),
            400,
            "BadRequest",
            "does not match the namespace",
        );
        check(
            call(
                &base,
                "POST",
                cms,
                "application/vnd.kubernetes.protobuf",
                "k8s\0",
            ),
            415,
            "UnsupportedMediaType",
            "kubectl apply -f",
        );
        check(
            call(&base, "POST", &format!("{cms}/a"), json, "{}"),
            405,
            "MethodNotAllowed",
            "POST",
        );

        let ok = call(
            &base,
            "POST",
            cms,
            json,
            r#"{"metadata": {"name": "a"}, "data": {"k": "v"}}"#,
        );
        assert_eq!(ok.0, 201, "{ok:?}");
        let a = format!("{cms}/a");
        check(
            call(&base, "PATCH", &a, "text/plain", "{}"),
            415,
            "UnsupportedMediaType",
            "text/plain",
        );
        check(
            call(
                &base,
                "PATCH",
                &a,
                "application/json-patch+json",
                r#"{"op": "add"}"#,
            ),
            422,
            "Invalid",
            "array of operations",
        );
        check(
            call(
                &base,
                "PATCH",
                &a,
                "application/json-patch+json",
                r#"[{"op": "remove", "path": "/data/missing"}]"#,
            ),
            422,
            "Invalid",
            "missing",
        );
        check(
            call(
                &base,
                "PATCH",
                &a,
                "application/apply-patch+yaml",
                "apiVersion: v1\nkind: ConfigMap\n",
            ),
            400,
            "BadRequest",
            "fieldManager",
        );
        check(
            call(
                &base,
                "PATCH",
                &format!("{a}?fieldManager=t"),
                "application/apply-patch+yaml",
                "apiVersion: v1\nkind: Secret\n",
            ),
            400,
            "BadRequest",
            "apiVersion",
        );
        check(
            call(&base, "PUT", &a, json, r#"{"metadata": {"name": "b"}}"#),
            400,
            "BadRequest",
            "does not match the name",
        );
        check(
            call(
                &base,
                "PUT",
                &a,
                json,
                r#"{"metadata": {"name": "a", "resourceVersion": "1"}}"#,
            ),
            409,
            "Conflict",
            "has been modified",
        );
        check(
            call(&base, "GET", &format!("{a}/status"), "", ""),
            404,
            "NotFound",
            "configmaps/status",
        );
        check(
            call(&base, "GET", "/api/v1/configmaps/a", "", ""),
            404,
            "NotFound",
            "namespaced",
        );
    })
    .await
    .unwrap();
}
