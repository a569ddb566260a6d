//! Secret fields never leave the discovery pod, and are never printed from a proxy's dump:
//! their values become `"[redacted]"`, at any depth, on both sides of a comparison (Envoy
//! already redacts private keys in its own dump, in its own way).
//!
//! A field is secret for what it is, not for its name alone: a TLS `Secret`
//! or `TlsCertificate` keeps only its public parts, an HTTP header value is redacted when its
//! name says it carries credentials, `api_key_auth` keys and `basic_auth` users are redacted
//! in their filters' configs; and any field whose name looks secret (`*secret*`,
//! `*password*`, `*token*`, `*private_key*`, `*_key`, `*_keys`, but not `*public*` nor a
//! reference to an SDS secret) is redacted wherever it is, as a safety net for the
//! extensions not named here.

use serde_json::{Map, Value};

pub const REDACTED: &str = "[redacted]";

/// What a TLS certificate (`TlsCertificate`, alone or in a `Secret`) shows: the rest (the
/// private key, its password, a PKCS#12 bundle, a key provider's config) is redacted.
const TLS_CERTIFICATE_PUBLIC: [&str; 4] = [
    "certificate_chain",
    "ocsp_staple",
    "signed_certificate_timestamp",
    "watched_directory",
];

/// What a `Secret` shows as it is: its name and the CA it validates peers with. Its TLS
/// certificate shows its public parts; anything else (session ticket keys, a generic secret)
/// is redacted.
const SECRET_PUBLIC: [&str; 3] = [
    "name",
    "validation_context",
    "validation_context_sds_secret_config",
];

/// Header names whose values are credentials (lowercase).
const SECRET_HEADERS: [&str; 6] = [
    "authorization",
    "proxy-authorization",
    "cookie",
    "set-cookie",
    "x-api-key",
    "x-auth-token",
];

/// Field names the pattern would redact that name no secret: references to SDS secrets (a
/// name and where to fetch it), rate limits' token buckets, runtime and metadata keys.
fn named_but_not_secret(key: &str) -> bool {
    key.contains("sds_secret_config")
        || key.contains("public")
        || matches!(
            key,
            "token_bucket"
                | "max_tokens"
                | "tokens_per_fill"
                | "token_endpoint"
                | "forward_bearer_token"
                | "use_refresh_token"
                | "runtime_key"
                | "metadata_key"
                | "descriptor_key"
                | "filter_state_key"
        )
}

/// The safety net: a field whose name looks like it holds a secret.
fn secret_by_name(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    if named_but_not_secret(&key) {
        return false;
    }
    ["secret", "password", "passwd", "token", "private_key"]
        .iter()
        .any(|part| key.contains(part))
        || key.ends_with("_key")
        || key.ends_with("_keys")
}

/// Replaces every secret value in `value`, a resource in proto3 JSON with the proto field
/// names, in place.
pub fn redact(value: &mut Value) {
    walk(value, None);
}

/// Redacts `config`, a resource of the `proxy-config` section `kind` (`secrets` are `Secret`
/// messages without their `@type`).
pub fn redact_resource(kind: &str, config: &mut Value) {
    if kind == "secrets" {
        secret(config);
    }
    redact(config);
}

fn hide(value: &mut Value) {
    if !value.is_null() {
        *value = Value::String(REDACTED.to_owned());
    }
}

/// Keeps `public` fields of `map` and redacts the rest.
fn keep_only(map: &mut Map<String, Value>, public: &[&str]) {
    for (key, value) in map.iter_mut() {
        if !public.contains(&key.as_str()) && key != "@type" {
            hide(value);
        }
    }
}

/// An `envoy.extensions.transport_sockets.tls.v3.Secret`.
fn secret(value: &mut Value) {
    let Some(map) = value.as_object_mut() else {
        return;
    };
    for (key, field) in map.iter_mut() {
        match key.as_str() {
            "tls_certificate" => tls_certificate(field),
            k if SECRET_PUBLIC.contains(&k) || k == "@type" => {}
            _ => hide(field),
        }
    }
}

fn tls_certificate(value: &mut Value) {
    if let Some(map) = value.as_object_mut() {
        keep_only(map, &TLS_CERTIFICATE_PUBLIC);
    }
}

/// The message type of a JSON object, from its `@type` (`Any` values and typed configs).
fn type_of(map: &Map<String, Value>) -> Option<&str> {
    map.get("@type")?.as_str()?.rsplit('/').next()
}

fn walk(value: &mut Value, parent_type: Option<&str>) {
    match value {
        Value::Object(map) => object(map, parent_type),
        Value::Array(items) => items.iter_mut().for_each(|v| walk(v, parent_type)),
        _ => {}
    }
}

fn object(map: &mut Map<String, Value>, parent_type: Option<&str>) {
    let own = type_of(map).map(str::to_owned);
    let ty = own.as_deref().or(parent_type);
    if own
        .as_deref()
        .is_some_and(|t| t.ends_with(".tls.v3.Secret"))
    {
        let mut whole = Value::Object(std::mem::take(map));
        secret(&mut whole);
        if let Value::Object(m) = whole {
            *map = m;
        }
    }
    header_value(map);
    for (key, field) in map.iter_mut() {
        match key.as_str() {
            // The bootstrap's `static_resources.secrets`: `Secret`s without their `@type`.
            "secrets" if field.is_array() => {
                for item in field.as_array_mut().into_iter().flatten() {
                    secret(item);
                    walk(item, ty);
                }
            }
            _ if secret_by_name(key) => hide(field),
            "tls_certificate" => tls_certificate(field),
            "tls_certificates" => {
                for cert in field.as_array_mut().into_iter().flatten() {
                    tls_certificate(cert);
                }
            }
            // `basic_auth`: `users` is an htpasswd file, inline.
            "users" if ty.is_some_and(|t| t.contains(".basic_auth.")) => hide(field),
            // `api_key_auth`: each credential's key (the `client` it names is not secret).
            "credentials" if ty.is_some_and(|t| t.contains(".api_key_auth.")) => {
                for credential in field.as_array_mut().into_iter().flatten() {
                    if let Some(key) = credential.get_mut("key") {
                        hide(key);
                    }
                }
            }
            _ => walk(field, ty),
        }
    }
}

/// An HTTP header (`HeaderValue`: `key` with `value` or `raw_value`) whose name says it
/// carries credentials: its value is redacted, wherever it is added or matched.
fn header_value(map: &mut Map<String, Value>) {
    let Some(name) = map.get("key").and_then(Value::as_str) else {
        return;
    };
    let name = name.to_ascii_lowercase();
    let secret = SECRET_HEADERS.contains(&name.as_str())
        || ["secret", "password", "token", "api-key", "apikey"]
            .iter()
            .any(|part| name.contains(part))
        || (name.contains("auth") && !name.contains("authority"));
    if secret {
        for field in ["value", "raw_value"] {
            if let Some(v) = map.get_mut(field) {
                hide(v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Every string that must not survive redaction, for the assertions.
    fn leaked<'a>(value: &Value, secrets: &[&'a str]) -> Vec<&'a str> {
        let text = value.to_string();
        secrets
            .iter()
            .copied()
            .filter(|s| text.contains(s))
            .collect()
    }

    #[test]
    fn secret_values_are_replaced_at_any_depth() {
        let mut secret = json!({
            "name": "tls",
            "tls_certificate": {
                "certificate_chain": {"inline_bytes": "Y2VydA=="},
                "private_key": {"inline_bytes": "a2V5"},
                "password": {"inline_string": "hunter2"},
            },
            "session_ticket_keys": {"keys": [{"inline_bytes": "AAAA"}]},
            "generic_secret": {"secret": {"inline_string": "token"}},
            "listeners": [{"private_key": "x"}],
        });
        redact(&mut secret);
        assert_eq!(
            leaked(&secret, &["a2V5", "hunter2", "AAAA", "token", "\"x\""]),
            Vec::<&str>::new()
        );
        assert_eq!(
            secret["tls_certificate"]["certificate_chain"]["inline_bytes"],
            "Y2VydA=="
        );
        assert_eq!(secret["tls_certificate"]["private_key"], REDACTED);
        assert_eq!(secret["listeners"][0]["private_key"], REDACTED);
    }

    /// Secrets under field names no list of keys named, found by what the
    /// field is.
    #[test]
    fn secrets_are_found_by_what_a_field_is() {
        let mut listener = json!({
            "name": "http",
            "filter_chains": [{
                "transport_socket": {"typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
                    "common_tls_context": {
                        "tls_certificates": [{
                            "certificate_chain": {"inline_string": "CHAIN"},
                            "pkcs12": {"inline_bytes": "PKCS12BUNDLE"},
                            "private_key_provider": {"provider_name": "p", "typed_config": {"k": "PROVIDERCFG"}},
                        }],
                        "tls_certificate_sds_secret_configs": [{"name": "server-cert"}],
                    },
                    "session_ticket_keys": {"keys": [{"inline_bytes": "TICKETKEY"}]},
                }},
                "filters": [{"name": "hcm", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                    "http_filters": [
                        {"name": "sigv4", "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.http.aws_request_signing.v3.AwsRequestSigning",
                            "credential_provider": {"inline_credential": {
                                "access_key_id": "AKIDEXAMPLE",
                                "secret_access_key": "SIGV4SECRET",
                                "session_token": "SIGV4SESSION",
                            }},
                        }},
                        {"name": "keys", "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.http.api_key_auth.v3.ApiKeyAuth",
                            "credentials": [{"key": "APIKEY1", "client": "alice"}],
                        }},
                        {"name": "basic", "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.http.basic_auth.v3.BasicAuth",
                            "users": {"inline_string": "alice:{SHA}HTPASSWD"},
                        }},
                        {"name": "oauth", "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.http.oauth2.v3.OAuth2",
                            "config": {"credentials": {
                                "client_id": "app",
                                "token_secret": {"name": "oauth-token"},
                                "hmac_secret": {"name": "oauth-hmac"},
                            }},
                        }},
                        {"name": "router", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}},
                    ],
                    "route_config": {"virtual_hosts": [{"name": "vh", "domains": ["*"],
                        "request_headers_to_add": [
                            {"header": {"key": "Authorization", "value": "Bearer HEADERTOKEN"}},
                            {"header": {"key": "x-api-key", "raw_value": "UkFXS0VZ"}},
                            {"header": {"key": "Cookie", "value": "session=COOKIEVAL"}},
                            {"header": {"key": "x-upstream-token", "value": "OTHERTOKEN"}},
                            {"header": {"key": "x-request-source", "value": "edge"}},
                        ],
                        "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "app",
                            "hash_policy": [{"header": {"header_name": "x-user"}}]}}],
                        "typed_per_filter_config": {"x": {"client_secret": "CLIENTSECRET", "db_password": "DBPASS"}},
                    }]},
                }}],
            }],
        });
        redact(&mut listener);
        let secrets = [
            "PKCS12BUNDLE",
            "PROVIDERCFG",
            "TICKETKEY",
            "SIGV4SECRET",
            "SIGV4SESSION",
            "APIKEY1",
            "HTPASSWD",
            "oauth-token",
            "HEADERTOKEN",
            "UkFXS0VZ",
            "COOKIEVAL",
            "OTHERTOKEN",
            "CLIENTSECRET",
            "DBPASS",
        ];
        assert_eq!(leaked(&listener, &secrets), Vec::<&str>::new());
        // What is not secret stays: certificates, names, a client's name, other headers.
        let kept = [
            "CHAIN",
            "server-cert",
            "alice",
            "x-api-key",
            "edge",
            "x-user",
            "\"client_id\":\"app\"",
        ];
        let text = listener.to_string();
        for k in kept {
            assert!(text.contains(k), "{k} redacted from {text}");
        }
    }

    #[test]
    fn a_secret_resource_keeps_only_its_name_and_public_parts() {
        let mut secret = json!({
            "name": "s",
            "tls_certificate": {
                "certificate_chain": {"inline_string": "CHAIN"},
                "pkcs12": {"inline_bytes": "P12"},
            },
            "generic_secret": {"secrets": {"k": {"inline_string": "GENERIC"}}},
            "session_ticket_keys": {"keys": []},
            "validation_context": {"trusted_ca": {"inline_string": "CA"}},
        });
        redact_resource("secrets", &mut secret);
        assert_eq!(leaked(&secret, &["P12", "GENERIC"]), Vec::<&str>::new());
        assert_eq!(secret["name"], "s");
        assert_eq!(secret["session_ticket_keys"], REDACTED);
        assert_eq!(
            secret["validation_context"]["trusted_ca"]["inline_string"],
            "CA"
        );
        assert_eq!(
            secret["tls_certificate"]["certificate_chain"]["inline_string"],
            "CHAIN"
        );
        // The same in a bootstrap's static secrets, and inside an `Any` anywhere else.
        let mut bootstrap = json!({"static_resources": {"secrets": [
            {"name": "b", "tls_certificate": {"certificate_chain": {"filename": "/c"},
                "private_key": {"inline_string": "BOOTKEY"}}},
        ]}});
        redact(&mut bootstrap);
        assert_eq!(leaked(&bootstrap, &["BOOTKEY"]), Vec::<&str>::new());
        assert_eq!(bootstrap["static_resources"]["secrets"][0]["name"], "b");
        let mut wrapped = json!({"resources": [{
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret",
            "name": "s", "generic_secret": {"secret": {"inline_bytes": "R0VO"}},
        }]});
        redact(&mut wrapped);
        assert_eq!(leaked(&wrapped, &["R0VO"]), Vec::<&str>::new());
    }

    #[test]
    fn names_that_only_look_secret_are_kept() {
        let mut config = json!({
            "token_bucket": {"max_tokens": 10, "tokens_per_fill": 1},
            "runtime_key": "routing.shift",
            "public_key": "PUBKEY",
            "tls_certificate_sds_secret_configs": [{"name": "cert"}],
        });
        let before = config.clone();
        redact(&mut config);
        assert_eq!(config, before);
    }
}
