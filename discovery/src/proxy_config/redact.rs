//! Secret fields never leave the discovery pod, and are never printed from a proxy's dump:
//! every value under one of these keys becomes `"[redacted]"`, at any depth, on both sides of
//! a comparison (Envoy already redacts private keys in its own dump, in its own way).

/// The fields whose values are secret: TLS private keys and their passwords, session ticket
/// keys, HMAC secrets, generic secrets, OAuth2 and other credential fields.
const SECRET_KEYS: [&str; 8] = [
    "private_key",
    "password",
    "session_ticket_keys",
    "hmac_secret",
    "secret",
    "token_secret",
    "client_secret",
    "private_key_provider",
];

pub const REDACTED: &str = "[redacted]";

/// Replaces every secret value in `value`, in place.
pub fn redact(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, v) in map.iter_mut() {
                if SECRET_KEYS.contains(&key.as_str()) && !v.is_null() {
                    *v = serde_json::Value::String(REDACTED.to_owned());
                } else {
                    redact(v);
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(redact),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
        let text = secret.to_string();
        for leaked in ["a2V5", "hunter2", "AAAA", "token", "\"x\""] {
            assert!(!text.contains(leaked), "{leaked} in {text}");
        }
        assert_eq!(
            secret["tls_certificate"]["certificate_chain"]["inline_bytes"],
            "Y2VydA=="
        );
        assert_eq!(secret["tls_certificate"]["private_key"], REDACTED);
        assert_eq!(secret["listeners"][0]["private_key"], REDACTED);
    }
}
