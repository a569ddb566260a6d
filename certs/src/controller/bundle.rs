//! The trust bundle as Secrets hold it, pure: reading a CA Secret and the Secrets it signs
//! into what [`super::rotation`] decides on, and the Secret writes each step asks for.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use serde_json::{Map, Value};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::rotation::{
    Ca, CaState, DISTRIBUTED_ANNOTATION, Leaf, NEXT_CERT_KEY, NEXT_KEY_KEY, split_certificates,
};
use super::triggers::TlsFiles;
use crate::api::RENEW_ANNOTATION;
use crate::{CertificateAuthority, CertificateInfo, IssuedCertificate};

/// One certificate of a bundle: compared by its DER, written as its PEM.
#[derive(Debug, Clone)]
pub struct Cert {
    pub der: Vec<u8>,
    pub pem: String,
}

impl PartialEq for Cert {
    fn eq(&self, other: &Self) -> bool {
        self.der == other.der
    }
}

impl Eq for Cert {}

/// The certificates of a PEM text, in order; blocks that do not parse are left out.
pub fn parse(pem: &str) -> Vec<Ca<Cert>> {
    split_certificates(pem)
        .into_iter()
        .filter_map(|block| {
            let info = CertificateInfo::from_pem(&block).ok()?;
            Some(Ca {
                id: Cert {
                    der: info.der,
                    pem: block,
                },
                not_before: info.not_before,
                not_after: info.not_after,
            })
        })
        .collect()
}

/// A bundle's PEM text.
pub fn to_pem(cas: &[Ca<Cert>]) -> String {
    cas.iter().map(|c| c.id.pem.as_str()).collect()
}

/// Whether two PEM texts hold the same certificates, in any order.
pub fn same_certificates(a: &str, b: &str) -> bool {
    let (a, b) = (parse(a), parse(b));
    a.len() == b.len() && a.iter().all(|x| b.contains(x)) && b.iter().all(|x| a.contains(x))
}

/// What every certificate signed from a CA Secret must trust, and what the webhook's
/// `caBundle` holds: its `ca.crt` when that holds the CA itself (the bundle of a self-signed
/// CA, with the next or the previous CA during a rotation), else the CA's certificate alone
/// (an intermediate CA's `ca.crt` is its own issuer). None without a certificate.
pub fn trust_bundle(files: &TlsFiles) -> Option<String> {
    let signer = parse(files.cert.as_deref()?).into_iter().next()?;
    let bundle = files.ca.as_deref().map(parse).unwrap_or_default();
    if bundle.iter().any(|c| c.id == signer.id) {
        Some(to_pem(&bundle))
    } else {
        Some(signer.id.pem)
    }
}

/// A TLS Secret's data from its files (`tls.crt`, `tls.key`, `ca.crt` and the like).
pub fn secret_data<'a>(
    files: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> BTreeMap<String, ByteString> {
    files
        .into_iter()
        .map(|(k, v)| (k.to_owned(), ByteString(v.as_bytes().to_vec())))
        .collect()
}

fn text(secret: &Secret, key: &str) -> Option<String> {
    let bytes = secret.data.as_ref()?.get(key)?;
    String::from_utf8(bytes.0.clone()).ok()
}

/// A self-signed CA's Secret as the rotation sees it; None when `tls.crt` holds no CA.
pub fn ca_state(secret: &Secret, files: &TlsFiles) -> Option<CaState<Cert>> {
    let cert = files.cert.as_deref()?;
    if !CertificateInfo::from_pem(cert).ok()?.is_ca {
        return None;
    }
    let signer = parse(cert).into_iter().next()?;
    // A next CA without its key (or with another's) could never sign: it is not one.
    let next = match (text(secret, NEXT_CERT_KEY), text(secret, NEXT_KEY_KEY)) {
        (Some(c), Some(k)) if CertificateAuthority::from_pem(&c, &k).is_ok() => {
            parse(&c).into_iter().next().filter(|n| n.id != signer.id)
        }
        _ => None,
    };
    let trusted = files.ca.as_deref().map(parse).unwrap_or_default();
    let distributed_at = secret
        .annotations()
        .get(DISTRIBUTED_ANNOTATION)
        .and_then(|t| OffsetDateTime::parse(t, &Rfc3339).ok());
    Some(CaState {
        signer,
        next,
        trusted,
        distributed_at,
    })
}

/// Whether a CA Secret is in the middle of a rotation (a next CA, or more than one CA
/// trusted), so that the Secrets it signs are worth reading.
pub fn rotating(secret: &Secret) -> bool {
    let has_next = secret
        .data
        .as_ref()
        .is_some_and(|d| d.contains_key(NEXT_CERT_KEY));
    let bundled = text(secret, "ca.crt").is_some_and(|ca| split_certificates(&ca).len() > 1);
    has_next || bundled
}

/// A certificate signed from the CA Secret, from its own Secret.
pub fn leaf(name: String, files: &TlsFiles, ca: &CaState<Cert>) -> Leaf<Cert> {
    let cert = files.cert.as_deref();
    let candidates = std::iter::once(&ca.signer)
        .chain(ca.next.as_ref())
        .chain(ca.trusted.iter());
    let mut issuer = None;
    if let Some(cert) = cert {
        for candidate in candidates {
            if crate::verify_signed_by(cert, &candidate.id.pem).is_ok() {
                issuer = Some(candidate.id.clone());
                break;
            }
        }
    }
    // When it was issued, at the latest: notBefore is backdated and truncated to the second.
    let not_before = cert
        .and_then(|c| CertificateInfo::from_pem(c).ok())
        .map_or(OffsetDateTime::UNIX_EPOCH, |i| {
            crate::latest_issuance(i.not_before, i.not_after).unwrap_or(i.not_after)
        });
    Leaf {
        name,
        issuer,
        trusts: files
            .ca
            .as_deref()
            .map(parse)
            .unwrap_or_default()
            .into_iter()
            .map(|c| c.id)
            .collect(),
        not_before,
    }
}

/// Keys of a Secret to set (Some) or remove (None), as a JSON merge patch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SecretUpdate {
    pub data: BTreeMap<String, Option<String>>,
    pub annotations: BTreeMap<String, Option<String>>,
}

impl SecretUpdate {
    fn data(mut self, key: &str, value: Option<&str>) -> Self {
        self.data.insert(key.to_owned(), value.map(str::to_owned));
        self
    }

    fn annotation(mut self, key: &str, value: Option<&str>) -> Self {
        self.annotations
            .insert(key.to_owned(), value.map(str::to_owned));
        self
    }

    /// The merge patch: `data` base64-encoded, a removed key as null.
    pub fn merge_patch(&self) -> Value {
        let mut patch = Map::new();
        if !self.annotations.is_empty() {
            let annotations: Map<String, Value> = self
                .annotations
                .iter()
                .map(|(k, v)| (k.clone(), v.clone().map_or(Value::Null, Value::String)))
                .collect();
            patch.insert(
                "metadata".into(),
                Value::Object(Map::from_iter([(
                    "annotations".to_owned(),
                    Value::Object(annotations),
                )])),
            );
        }
        if !self.data.is_empty() {
            let data: Map<String, Value> = self
                .data
                .iter()
                .map(|(k, v)| {
                    let value = v.as_ref().map_or(Value::Null, |v| {
                        serde_json::to_value(ByteString(v.as_bytes().to_vec()))
                            .unwrap_or(Value::Null)
                    });
                    (k.clone(), value)
                })
                .collect();
            patch.insert("data".into(), Value::Object(data));
        }
        Value::Object(patch)
    }
}

/// `ca.crt` becomes `pem`; the certificate and key stay.
pub fn trust(pem: &str) -> SecretUpdate {
    SecretUpdate::default().data("ca.crt", Some(pem))
}

/// Step 1: the next CA beside the signer, trusted from now on.
pub fn start(
    ca: &CaState<Cert>,
    next: &IssuedCertificate,
    renew_request: Option<&str>,
) -> SecretUpdate {
    let mut bundle = vec![ca.signer.clone()];
    bundle.extend(parse(&next.cert_pem));
    let update = SecretUpdate::default()
        .data(NEXT_CERT_KEY, Some(&next.cert_pem))
        .data(NEXT_KEY_KEY, Some(&next.key_pem))
        .data("ca.crt", Some(&to_pem(&bundle)))
        .annotation(DISTRIBUTED_ANNOTATION, None);
    match renew_request {
        Some(r) => update.annotation(RENEW_ANNOTATION, Some(r)),
        None => update,
    }
}

/// Every certificate trusts the bundle since `now`.
pub fn mark_distributed(now: OffsetDateTime) -> SecretUpdate {
    let at = now.format(&Rfc3339).unwrap_or_default();
    SecretUpdate::default().annotation(DISTRIBUTED_ANNOTATION, Some(&at))
}

/// Step 2: the next CA signs; everything trusted before stays trusted. None without a next
/// CA and its key.
pub fn promote(ca: &CaState<Cert>, secret: &Secret) -> Option<(SecretUpdate, String)> {
    let next = ca.next.as_ref()?;
    let key = text(secret, NEXT_KEY_KEY)?;
    let mut bundle = vec![next.clone()];
    bundle.extend(ca.trusted.iter().filter(|c| c.id != next.id).cloned());
    let bundle = to_pem(&bundle);
    let update = SecretUpdate::default()
        .data("tls.crt", Some(&next.id.pem))
        .data("tls.key", Some(&key))
        .data("ca.crt", Some(&bundle))
        .data(NEXT_CERT_KEY, None)
        .data(NEXT_KEY_KEY, None)
        .annotation(DISTRIBUTED_ANNOTATION, None);
    Some((update, bundle))
}

/// What a freshly issued CA Secret must not keep of an earlier rotation.
pub fn forget_rotation(secret: &Secret) -> Option<SecretUpdate> {
    let data = secret.data.as_ref();
    let stale = [NEXT_CERT_KEY, NEXT_KEY_KEY]
        .iter()
        .any(|k| data.is_some_and(|d| d.contains_key(*k)))
        || secret.annotations().contains_key(DISTRIBUTED_ANNOTATION);
    stale.then(|| {
        SecretUpdate::default()
            .data(NEXT_CERT_KEY, None)
            .data(NEXT_KEY_KEY, None)
            .annotation(DISTRIBUTED_ANNOTATION, None)
    })
}
