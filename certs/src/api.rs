//! The `DiscoveryServiceCertificate` resource (`operator.marin3r.3scale.net/v1alpha1`,
//! short name `dsc`): field names and defaults as in the original MARIN3R, plus an optional
//! key algorithm and the renewal instant in status.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::KeyAlgorithm;

/// The annotation that requests a manual renewal: each new value reissues the certificate once
/// (`marin3r certs renew` sets it to the current time).
pub const RENEW_ANNOTATION: &str = "marin3r.3scale.net/renew";
/// Labels on every Secret the controller writes, naming the certificate that owns it (the
/// name as [`owner_name_label`] writes it).
pub const OWNER_NAME_LABEL: &str = "marin3r.3scale.net/dsc-name";
pub const OWNER_NAMESPACE_LABEL: &str = "marin3r.3scale.net/dsc-namespace";

/// The longest label value the API server takes.
const MAX_LABEL_VALUE: usize = 63;

/// The value of [`OWNER_NAME_LABEL`] for the certificate `name`: the name itself when it fits
/// a label value (63 characters), else its first 46 characters, `-`, and 16 hex digits of the
/// SHA-256 of the whole name. A certificate's name may have 253 characters, and the operator's
/// client certificates are named `marin3r-client-<discovery service>-<namespace>`, which a
/// namespace of 40 characters already takes over 63: the API server refused their Secrets.
pub fn owner_name_label(name: &str) -> String {
    if name.len() <= MAX_LABEL_VALUE {
        return name.to_owned();
    }
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(name.as_bytes());
    let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    // Object names are ASCII (DNS subdomains): the prefix cuts no character.
    let keep = MAX_LABEL_VALUE.saturating_sub(hex.len().saturating_add(1));
    let prefix: String = name.chars().take(keep).collect();
    format!("{prefix}-{hex}")
}
/// The condition type the controller maintains.
pub const READY_CONDITION: &str = "Ready";

/// A certificate that marin3r issues into a `kubernetes.io/tls` Secret and keeps renewed.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "operator.marin3r.3scale.net",
    version = "v1alpha1",
    kind = "DiscoveryServiceCertificate",
    namespaced,
    shortname = "dsc",
    category = "marin3r",
    doc = "A certificate that marin3r issues into a kubernetes.io/tls Secret (tls.crt, tls.key and the issuer's ca.crt) and renews at 80% of its lifetime.",
    status = "DiscoveryServiceCertificateStatus",
    derive = "PartialEq",
    printcolumn = r#"{"name":"Ready","type":"boolean","jsonPath":".status.ready"}"#,
    printcolumn = r#"{"name":"Not Before","type":"string","format":"date-time","jsonPath":".status.notBefore"}"#,
    // Timestamps, not `date`: kubectl renders `date` columns as an age, which a future
    // instant has none of (a real API server prints `<invalid>`).
    printcolumn = r#"{"name":"Not After","type":"string","format":"date-time","jsonPath":".status.notAfter"}"#,
    printcolumn = r#"{"name":"Renewal","type":"string","format":"date-time","jsonPath":".status.renewalTime"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveryServiceCertificateSpec {
    /// The certificate's subject common name.
    pub common_name: String,
    /// Issue with the server-auth usage (otherwise client-auth).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<bool>,
    /// Issue a CA certificate.
    #[serde(default, rename = "isCA", skip_serializing_if = "Option::is_none")]
    pub is_ca: Option<bool>,
    /// Validity in seconds.
    #[schemars(range(min = 1))]
    pub valid_for: i64,
    /// DNS names, IP addresses and URIs (such as SPIFFE IDs); defaults to `[commonName]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hosts: Option<Vec<String>>,
    /// Who signs the certificate: exactly one of `selfSigned` or `caSigned`.
    pub signer: Signer,
    /// The Secret to write (`kubernetes.io/tls` with `tls.crt`, `tls.key`, `ca.crt`).
    pub secret_ref: SecretReference,
    /// Renewal at 80% of the validity; enabled unless set to false. With renewal off the
    /// certificate is kept until it expires (then Ready=False, reason Expired), and is still
    /// reissued when its Secret is missing or broken, the spec or the issuer changes, or a
    /// renewal is asked for by hand (`marin3r certs renew`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_renewal: Option<CertificateRenewal>,
    /// The original MARIN3R v0.6 name of `certificateRenewal`, with the same meaning:
    /// `enabled: false` turns renewal off. `certificateRenewal` wins when both are set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_renewal_notification: Option<CertificateRenewal>,
    /// `ecdsa-p256` (default), `rsa-2048` or `rsa-4096`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["ecdsa-p256", "rsa-2048", "rsa-4096"]))]
    pub key_algorithm: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "has(self.selfSigned) != has(self.caSigned)",
    "message": "set exactly one of selfSigned or caSigned",
}]))]
pub struct Signer {
    /// The certificate signs itself (`{}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub self_signed: Option<SelfSigned>,
    /// A CA whose certificate and key are in a Secret signs the certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_signed: Option<CaSigned>,
}

/// Self-signed: the certificate is its own issuer (a CA, typically).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct SelfSigned {}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CaSigned {
    /// The Secret holding the CA's `tls.crt` and `tls.key`.
    pub ca_secret_ref: SecretReference,
}

/// A Secret by name; the namespace defaults to the certificate's own.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct SecretReference {
    /// The Secret's name.
    pub name: String,
    /// The Secret's namespace; only the operator's trusted namespaces may name another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct CertificateRenewal {
    /// Whether the option is on.
    pub enabled: bool,
}

/// What was issued, and whether it is valid and matches the spec.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveryServiceCertificateStatus {
    /// The certificate in the Secret is valid now and matches the spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<bool>,
    /// The issued certificate's Not Before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before: Option<Time>,
    /// The issued certificate's Not After.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_after: Option<Time>,
    /// When the certificate will be renewed (80% of its validity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renewal_time: Option<Time>,
    /// The certificate hash (see `marin3r certs inspect`); changes with every issuance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_hash: Option<String>,
    /// The hash of the certificates in the Secret's `ca.crt` (what its holder trusts); it
    /// changes when a CA rotation adds the next CA or drops the previous one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trust_bundle_hash: Option<String>,
    /// For a CA being rotated: which step the rotation is at and what it waits for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotation: Option<String>,
    /// The last value of the renew annotation that was acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_renewal_request: Option<String>,
    /// The generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`, with the reason when it is not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// A spec turned into what the PKI needs, or the reason it cannot be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidSpec {
    pub request: crate::CertificateRequest,
    pub ca_secret: Option<(String, String)>,
    pub secret: (String, String),
    pub renewal_enabled: bool,
}

/// Why a certificate's spec cannot be issued from (the status reason `InvalidSpec`): the field,
/// and what is wrong with it or the PKI's error about its value.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("{field}: {problem}")]
    Field { field: String, problem: String },
    #[error("{field}")]
    Value {
        field: String,
        #[source]
        source: crate::CertError,
    },
}

impl SpecError {
    fn field(field: impl Into<String>, problem: impl Into<String>) -> Self {
        Self::Field {
            field: field.into(),
            problem: problem.into(),
        }
    }
}

impl DiscoveryServiceCertificateSpec {
    /// Checks the spec and resolves defaults. `namespace` is the resource's own namespace.
    pub fn validate(&self, namespace: &str) -> Result<ValidSpec, SpecError> {
        if self.common_name.trim().is_empty() {
            return Err(SpecError::field("spec.commonName", "must not be empty"));
        }
        let valid_for = u64::try_from(self.valid_for)
            .ok()
            .filter(|s| *s > 0)
            .ok_or_else(|| {
                let problem = format!("must be positive, got {}", self.valid_for);
                SpecError::field("spec.validFor", problem)
            })?;
        let value = |field: String| move |source| SpecError::Value { field, source };
        let key_algorithm = match &self.key_algorithm {
            None => KeyAlgorithm::default(),
            Some(alg) => alg.parse().map_err(value("spec.keyAlgorithm".into()))?,
        };
        let hosts = self
            .hosts
            .clone()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| vec![self.common_name.clone()]);
        for (i, host) in hosts.iter().enumerate() {
            crate::subject_alt_name(host).map_err(value(format!("spec.hosts[{i}]")))?;
        }
        let ca_secret = match (&self.signer.self_signed, &self.signer.ca_signed) {
            (Some(_), None) => None,
            (None, Some(ca)) => Some(resolve(&ca.ca_secret_ref, namespace, "caSecretRef")?),
            (Some(_), Some(_)) => {
                let problem = "sets both selfSigned and caSigned; set exactly one";
                return Err(SpecError::field("spec.signer", problem));
            }
            (None, None) => {
                let problem = "sets neither selfSigned nor caSigned; set exactly one";
                return Err(SpecError::field("spec.signer", problem));
            }
        };
        let secret = resolve(&self.secret_ref, namespace, "secretRef")?;
        let usage = if self.server.unwrap_or(false) {
            crate::Usage::Server
        } else {
            crate::Usage::Client
        };
        let request = crate::CertificateRequest {
            common_name: self.common_name.clone(),
            hosts,
            is_ca: self.is_ca.unwrap_or(false),
            usage,
            valid_for: std::time::Duration::from_secs(valid_for),
            key_algorithm,
        };
        Ok(ValidSpec {
            request,
            ca_secret,
            secret,
            renewal_enabled: self.renewal_disabled_by().is_none(),
        })
    }

    /// The field that turns renewal off, if one does: `certificateRenewal` when set, else the
    /// v0.6 name `certificateRenewalNotification`; renewal is on when neither says false.
    pub fn renewal_disabled_by(&self) -> Option<&'static str> {
        match (
            &self.certificate_renewal,
            &self.certificate_renewal_notification,
        ) {
            (Some(r), _) => (!r.enabled).then_some("spec.certificateRenewal.enabled"),
            (None, Some(n)) => {
                (!n.enabled).then_some("spec.certificateRenewalNotification.enabled")
            }
            (None, None) => None,
        }
    }
}

fn resolve(
    r: &SecretReference,
    namespace: &str,
    field: &str,
) -> Result<(String, String), SpecError> {
    if r.name.trim().is_empty() {
        let field = format!("spec.{field}.name");
        return Err(SpecError::field(field, "must not be empty"));
    }
    if let Some(why) = object_name_problem(&r.name) {
        return Err(SpecError::field(format!("spec.{field}.name"), why));
    }
    let ns = r.namespace.clone().filter(|n| !n.is_empty());
    if let Some(why) = ns.as_deref().and_then(namespace_name_problem) {
        return Err(SpecError::field(format!("spec.{field}.namespace"), why));
    }
    Ok((ns.unwrap_or_else(|| namespace.to_owned()), r.name.clone()))
}

pub use crate::names::{
    is_dns_label, is_dns_subdomain, namespace_name_problem, object_name_problem,
};

#[cfg(test)]
mod tests {
    use super::*;

    /// What the API server takes as a label value: at most 63 characters, alphanumerics,
    /// `-`, `_` and `.`, beginning and ending with an alphanumeric.
    fn is_label_value(v: &str) -> bool {
        let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
        v.len() <= 63
            && v.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && alnum(v.chars().next())
            && alnum(v.chars().last())
    }

    #[test]
    fn a_long_certificate_name_labels_its_secret_with_a_valid_distinct_value() {
        let short = "marin3r-client-instance-demo";
        assert_eq!(owner_name_label(short), short);
        // A client certificate of a namespace of 40 characters and more.
        let ns = format!("team-{}", "a".repeat(40));
        let long = format!("marin3r-client-instance-{ns}");
        let value = owner_name_label(&long);
        assert!(is_label_value(&value), "{value}");
        assert!(long.starts_with(&value[..46]), "{value}");
        // Names that share the kept prefix still differ, and the value is stable.
        let other = format!("{long}-b");
        assert_ne!(owner_name_label(&other), value);
        assert_eq!(owner_name_label(&long), value);
        // The longest object name, and a prefix ending on a dash.
        for name in [
            "a".repeat(253),
            format!("{}-{}", "b".repeat(45), "c".repeat(30)),
        ] {
            let value = owner_name_label(&name);
            assert!(is_label_value(&value), "{value}");
        }
    }

    fn spec() -> DiscoveryServiceCertificateSpec {
        serde_json::from_value(serde_json::json!({
            "commonName": "marin3r-server",
            "server": true,
            "validFor": 3600,
            "hosts": ["marin3r", "marin3r.default.svc"],
            "signer": {"caSigned": {"caSecretRef": {"name": "ca"}}},
            "secretRef": {"name": "server-cert", "namespace": "default"},
        }))
        .unwrap()
    }

    #[test]
    fn original_manifests_parse_and_resolve_defaults() {
        let valid = spec().validate("default").unwrap();
        assert_eq!(valid.request.usage, crate::Usage::Server);
        assert!(!valid.request.is_ca);
        assert_eq!(valid.ca_secret, Some(("default".into(), "ca".into())));
        assert_eq!(valid.secret, ("default".into(), "server-cert".into()));
        assert!(valid.renewal_enabled);
        assert_eq!(valid.request.key_algorithm, KeyAlgorithm::EcdsaP256);

        let ca: DiscoveryServiceCertificateSpec = serde_json::from_value(serde_json::json!({
            "commonName": "ca", "isCA": true, "validFor": 86400,
            "signer": {"selfSigned": {}}, "secretRef": {"name": "ca"},
            "certificateRenewal": {"enabled": false}, "keyAlgorithm": "rsa-2048",
        }))
        .unwrap();
        let valid = ca.validate("ops").unwrap();
        assert!(valid.request.is_ca);
        assert_eq!(valid.request.hosts, vec!["ca".to_owned()]);
        assert_eq!(valid.ca_secret, None);
        assert_eq!(valid.secret, ("ops".into(), "ca".into()));
        assert!(!valid.renewal_enabled);
    }

    #[test]
    fn the_v0_6_renewal_field_is_the_switch_unless_certificate_renewal_is_set() {
        let with = |renewal: serde_json::Value, notification: serde_json::Value| {
            let mut s = serde_json::to_value(spec()).unwrap();
            s["certificateRenewal"] = renewal;
            s["certificateRenewalNotification"] = notification;
            let s: DiscoveryServiceCertificateSpec = serde_json::from_value(s).unwrap();
            let valid = s.validate("default").unwrap();
            assert_eq!(valid.renewal_enabled, s.renewal_disabled_by().is_none());
            s.renewal_disabled_by()
        };
        let (on, off) = (
            serde_json::json!({"enabled": true}),
            serde_json::json!({"enabled": false}),
        );
        let none = serde_json::Value::Null;
        assert_eq!(with(none.clone(), none.clone()), None);
        assert_eq!(
            with(none.clone(), off.clone()),
            Some("spec.certificateRenewalNotification.enabled")
        );
        assert_eq!(with(none.clone(), on.clone()), None);
        assert_eq!(
            with(off.clone(), none),
            Some("spec.certificateRenewal.enabled")
        );
        // The HEAD field wins over the v0.6 one, either way.
        assert_eq!(with(on.clone(), off.clone()), None);
        assert_eq!(with(off, on), Some("spec.certificateRenewal.enabled"));
    }

    #[test]
    fn bad_specs_say_which_field() {
        type Mutation = fn(&mut DiscoveryServiceCertificateSpec);
        let cases: Vec<(Mutation, &str)> = vec![
            (
                |s| s.valid_for = 0,
                "spec.validFor: must be positive, got 0",
            ),
            (
                |s| s.valid_for = -5,
                "spec.validFor: must be positive, got -5",
            ),
            (|s| s.common_name = "".into(), "spec.commonName"),
            (
                |s| s.hosts = Some(vec!["ok".into(), "not ok".into()]),
                "spec.hosts[1]: invalid host \"not ok\"",
            ),
            (
                |s| s.signer = Signer::default(),
                "spec.signer: sets neither",
            ),
            (
                |s| s.signer.self_signed = Some(SelfSigned {}),
                "spec.signer: sets both",
            ),
            (
                |s| s.secret_ref.name = "../../kube-system/secrets/x".into(),
                "spec.secretRef.name: \"../../kube-system/secrets/x\" is not a valid object name",
            ),
            (
                |s| s.secret_ref.namespace = Some("kube-system/secrets".into()),
                "spec.secretRef.namespace: \"kube-system/secrets\" is not a valid namespace name",
            ),
            (
                |s| {
                    s.signer = Signer {
                        ca_signed: Some(CaSigned {
                            ca_secret_ref: SecretReference {
                                name: "CA".into(),
                                namespace: None,
                            },
                        }),
                        ..Default::default()
                    }
                },
                "spec.caSecretRef.name: \"CA\" is not a valid object name",
            ),
            (
                |s| s.key_algorithm = Some("dsa".into()),
                "spec.keyAlgorithm",
            ),
            (|s| s.secret_ref.name = " ".into(), "spec.secretRef.name"),
        ];
        for (mutate, want) in cases {
            let mut s = spec();
            mutate(&mut s);
            let err = marin3r_controller::chain(&s.validate("default").unwrap_err());
            assert!(err.contains(want), "{want}: {err}");
        }
    }
}
