//! marin3r's PKI: issuing self-signed CAs and CA-signed server and client certificates,
//! reading PEM, verifying chains and keys, and the two numbers the controllers live by:
//! the certificate hash and the renewal instant (80% of the validity).
//!
//! Certificates are input (anyone who can write a Secret picks their validity, up to the year
//! 9999), and a panic in the operator stops every renewal: no arithmetic here may overflow.
// The 80-line bar on functions (the workspace's `too_many_lines`) is the product's: unit
// tests may run past it.
#![cfg_attr(test, allow(clippy::too_many_lines))]
#![cfg_attr(not(test), deny(clippy::arithmetic_side_effects))]

#[cfg(feature = "kube")]
pub mod api;
#[cfg(feature = "kube")]
pub mod controller;
mod error;
mod inspect;
mod issue;
mod keys;
pub mod names;
mod pem;
#[cfg(feature = "reload")]
pub mod reload;
mod verify;

pub use error::CertError;
pub use inspect::{
    CertificateInfo, RENEWAL_FRACTION_PERCENT, SubjectAltName, certificate_hash, renewal_instant,
};
pub use issue::{
    CertificateAuthority, CertificateRequest, IssuedCertificate, KeyAlgorithm, Usage,
    issue_self_signed, latest_issuance, subject_alt_name,
};
pub use keys::key_matches;
pub use names::{is_dns_label, is_dns_subdomain};
pub use pem::{blocks_labelled, private_key_der};
pub use verify::{check_validity, verify_self_signed, verify_signed_by};

/// The trust domain of the SPIFFE URIs marin3r issues and accepts.
pub const TRUST_DOMAIN: &str = "cluster.local";

/// The SPIFFE URI a proxy's client certificate carries: the namespace is its identity.
pub fn spiffe_id(trust_domain: &str, namespace: &str) -> String {
    format!("spiffe://{trust_domain}/ns/{namespace}")
}

/// The namespace named by a SPIFFE URI of the form `spiffe://<trust domain>/ns/<namespace>`.
pub fn namespace_from_spiffe_id(uri: &str) -> Option<&str> {
    spiffe_parts(uri).map(|(_, namespace)| namespace)
}

/// The trust domain and namespace of a SPIFFE URI `spiffe://<trust domain>/ns/<namespace>`.
pub fn spiffe_parts(uri: &str) -> Option<(&str, &str)> {
    let rest = uri.strip_prefix("spiffe://")?;
    let (domain, path) = rest.split_once('/')?;
    let namespace = path.strip_prefix("ns/")?;
    let valid = !domain.is_empty()
        && !namespace.is_empty()
        && namespace
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    valid.then_some((domain, namespace))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spiffe_ids_round_trip_and_bad_ones_are_refused() {
        let id = spiffe_id("cluster.local", "team-a");
        assert_eq!(id, "spiffe://cluster.local/ns/team-a");
        assert_eq!(namespace_from_spiffe_id(&id), Some("team-a"));
        for bad in [
            "spiffe://cluster.local/ns/",
            "spiffe:///ns/a",
            "spiffe://cluster.local/sa/a",
            "https://cluster.local/ns/a",
            "spiffe://cluster.local/ns/a/sa/b",
            "spiffe://cluster.local/ns/A",
        ] {
            assert_eq!(namespace_from_spiffe_id(bad), None, "{bad}");
        }
    }
}
