//! Certificate issuance time per key type: key generation plus signing, as the certificate
//! controller does it for every (re)issue.

use std::time::{Duration, Instant};

use marin3r_certs::{
    CertificateAuthority, CertificateRequest, KeyAlgorithm, Usage, issue_self_signed,
};

use super::{Row, Stats, human};

/// How many certificates to issue per key type: RSA-4096 key generation takes seconds.
pub fn default_samples(alg: KeyAlgorithm) -> usize {
    match alg {
        KeyAlgorithm::EcdsaP256 => 500,
        KeyAlgorithm::Rsa2048 => 41,
        KeyAlgorithm::Rsa4096 => 11,
    }
}

/// Issues `samples` CA-signed server certificates with each key type and reports the timings.
/// `scale` multiplies the default sample counts (at least one sample each).
pub fn issuance(scale: f64) -> anyhow::Result<Vec<Row>> {
    let ca = issue_self_signed(&CertificateRequest::ca(
        "bench-ca",
        Duration::from_secs(86_400),
    ))?;
    let ca = CertificateAuthority::from_issued(&ca)?;
    let mut rows = Vec::new();
    for alg in KeyAlgorithm::ALL {
        let samples = ((default_samples(alg) as f64 * scale).round() as usize).max(1);
        let request = CertificateRequest::new("bench", Usage::Server, Duration::from_secs(3600))
            .with_hosts(["marin3r", "marin3r.default.svc", "127.0.0.1"])
            .with_key_algorithm(alg);
        let mut timings = Vec::with_capacity(samples);
        for _ in 0..samples {
            let start = Instant::now();
            let issued = ca.issue(&request)?;
            timings.push(start.elapsed());
            std::hint::black_box(issued);
        }
        if let Some(s) = Stats::of(&timings) {
            rows.push(Row {
                benchmark: "certificate issuance (keygen + CA signature)".into(),
                case: alg.as_str().into(),
                samples,
                result: format!(
                    "median {}, p99 {}, min {}, max {}",
                    human(s.p50),
                    human(s.p99),
                    human(s.min),
                    human(s.max)
                ),
            });
        }
    }
    Ok(rows)
}
