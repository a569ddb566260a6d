//! The certificates part of `marin3r check`: every DiscoveryServiceCertificate issued, ready,
//! not expired, renewed on time, and (whatever its renewal setting) not near its expiry.
//! Pure: a certificate's status and spec, and the time, give its verdict.

use kube::ResourceExt;
use marin3r_certs::api::DiscoveryServiceCertificate;

/// How long past its renewal time a certificate may go before it counts as not renewed.
const RENEWAL_GRACE_SECONDS: i64 = 10 * 60;

/// Below this share of its lifetime left (in percent), a certificate is near expiry: with
/// renewal on it would have been renewed at 80%.
const NEAR_EXPIRY_PERCENT: i64 = 20;

/// What is wrong with one certificate, and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Problem {
    pub what: String,
    pub fix: String,
}

/// The problem of `dsc` at `now` (Unix seconds), if it has one.
pub(super) fn problem(dsc: &DiscoveryServiceCertificate, now: i64) -> Option<Problem> {
    let (ns, name) = (dsc.namespace().unwrap_or_default(), dsc.name_any());
    let describe = format!("kubectl describe dsc {name} -n {ns} (its Ready condition and Events)");
    let renew = format!("marin3r certs renew {name} -n {ns}");
    let status = dsc.status.clone().unwrap_or_default();
    // Issued means the operator wrote a certificate's validity; a certificate with renewal
    // off has no renewal time, and needs none to be issued.
    let Some(not_after) = status.not_after.map(|t| t.0.as_second()) else {
        return Some(Problem {
            what: "not issued".into(),
            fix: format!("{describe}; check that the operator runs (above)"),
        });
    };
    if not_after <= now {
        return Some(Problem {
            what: "expired".into(),
            fix: format!("{renew}, then {describe}"),
        });
    }
    if status.ready == Some(false) {
        let why = status
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .map(|c| format!(" ({}: {})", c.reason, c.message))
            .unwrap_or_default();
        return Some(Problem {
            what: format!("not ready{why}"),
            fix: describe,
        });
    }
    let left = status
        .not_before
        .map(|t| t.0.as_second())
        .filter(|&from| from < not_after)
        .map(|from| (not_after - now).saturating_mul(100) / (not_after - from));
    let near_expiry = left.is_some_and(|pct| pct < NEAR_EXPIRY_PERCENT);
    let left_text = left
        .map(|pct| format!("{pct}% of its lifetime left, "))
        .unwrap_or_default();
    match (dsc.spec.renewal_disabled_by(), status.renewal_time) {
        (Some(field), _) if near_expiry => Some(Problem {
            what: format!("near expiry: {left_text}and its renewal is off ({field}: false)"),
            fix: format!("renew it before it expires: {renew}; or set {field}: true"),
        }),
        (Some(_), _) => None,
        (None, Some(due)) if due.0.as_second() + RENEWAL_GRACE_SECONDS < now => Some(Problem {
            what: format!("past its renewal time, not renewed ({left_text}renewal was due at 80%)"),
            fix: format!("{describe}; {renew}"),
        }),
        (None, Some(_)) => None,
        (None, None) => Some(Problem {
            what: "renewal is on but it has no renewal time".into(),
            fix: format!("{describe}; check that the operator runs (above)"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const HOUR: i64 = 3600;
    /// 2026-11-27T00:00:00Z.
    const NOW: i64 = 1_795_737_600;

    fn rfc3339(unix: i64) -> String {
        time::OffsetDateTime::from_unix_timestamp(unix)
            .unwrap()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap()
    }

    /// A certificate valid from `from` to `to`, renewal on (renewal at 80%) unless `renewal`
    /// is false; `ready` as its status says.
    fn mk_dsc(from: i64, to: i64, renewal: bool, ready: bool) -> DiscoveryServiceCertificate {
        let mut status = json!({
            "ready": ready,
            "notBefore": rfc3339(from),
            "notAfter": rfc3339(to),
        });
        if renewal {
            status["renewalTime"] = json!(rfc3339(from + (to - from) * 8 / 10));
        }
        if !ready {
            status["conditions"] = json!([{
                "type": "Ready", "status": "False", "reason": "IssuanceFailed",
                "message": "the CA Secret is missing", "lastTransitionTime": rfc3339(from),
            }]);
        }
        serde_json::from_value(json!({
            "apiVersion": "operator.marin3r.3scale.net/v1alpha1",
            "kind": "DiscoveryServiceCertificate",
            "metadata": {"name": "c", "namespace": "n"},
            "spec": {
                "commonName": "c", "validFor": to - from,
                "signer": {"selfSigned": {}}, "secretRef": {"name": "c"},
                "certificateRenewal": {"enabled": renewal},
            },
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn a_certificate_with_renewal_off_is_issued_without_a_renewal_time() {
        // 100 hours of life, 50 left: fine whatever its renewal setting.
        let off = mk_dsc(NOW - 50 * HOUR, NOW + 50 * HOUR, false, true);
        assert!(off.status.as_ref().unwrap().renewal_time.is_none());
        assert_eq!(problem(&off, NOW), None);
        let on = mk_dsc(NOW - 50 * HOUR, NOW + 50 * HOUR, true, true);
        assert_eq!(problem(&on, NOW), None);
    }

    #[test]
    fn near_expiry_is_flagged_with_renewal_off_and_what_to_do() {
        // 100 hours of life, 19 left.
        let off = mk_dsc(NOW - 81 * HOUR, NOW + 19 * HOUR, false, true);
        let p = problem(&off, NOW).expect("near expiry");
        assert_eq!(
            p.what,
            "near expiry: 19% of its lifetime left, and its renewal is off (spec.certificateRenewal.enabled: false)"
        );
        assert!(p.fix.contains("marin3r certs renew c -n n"), "{}", p.fix);
        // 21 left: not yet.
        let off = mk_dsc(NOW - 79 * HOUR, NOW + 21 * HOUR, false, true);
        assert_eq!(problem(&off, NOW), None);
    }

    #[test]
    fn renewal_on_is_late_only_past_its_renewal_time_and_the_grace() {
        // Renewal due at 80 h, now at 81 h: 19% left and an hour late.
        let late = mk_dsc(NOW - 81 * HOUR, NOW + 19 * HOUR, true, true);
        let p = problem(&late, NOW).expect("late");
        assert!(
            p.what
                .starts_with("past its renewal time, not renewed (19% of its lifetime left"),
            "{}",
            p.what
        );
        // Due 5 minutes ago: within the grace, the operator is renewing it.
        let due = mk_dsc(NOW - 80 * HOUR - 300, NOW + 20 * HOUR - 300, true, true);
        assert_eq!(problem(&due, NOW), None);
    }

    #[test]
    fn not_issued_expired_and_not_ready_are_named() {
        let mut none = mk_dsc(NOW - HOUR, NOW + HOUR, false, true);
        none.status = None;
        assert_eq!(problem(&none, NOW).unwrap().what, "not issued");
        let expired = mk_dsc(NOW - 2 * HOUR, NOW - HOUR, false, true);
        assert_eq!(problem(&expired, NOW).unwrap().what, "expired");
        let broken = mk_dsc(NOW - HOUR, NOW + 9 * HOUR, true, false);
        assert_eq!(
            problem(&broken, NOW).unwrap().what,
            "not ready (IssuanceFailed: the CA Secret is missing)"
        );
    }
}
