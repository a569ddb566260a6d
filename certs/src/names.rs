//! Kubernetes object-name rules (RFC 1123), shared by everything that turns user input into
//! an object name or an API path: the certificate API, the EnvoyConfig checks and the
//! injection webhook. No kube dependency, so the webhook and the xDS server can use it.

/// RFC 1123 label: what namespace and Service names must be (at most 63 lowercase letters,
/// digits and '-', alphanumeric at both ends).
pub fn is_dns_label(s: &str) -> bool {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    !s.is_empty()
        && s.len() <= 63
        && s.chars().all(|c| alnum(c) || c == '-')
        && s.starts_with(alnum)
        && s.ends_with(alnum)
}

/// RFC 1123 subdomain: what Secret and ConfigMap names must be.
pub fn is_dns_subdomain(name: &str) -> bool {
    name.len() <= 253 && name.split('.').all(is_dns_label)
}

/// Why `name` cannot name a Secret (or most other objects), if it cannot: a DNS-1123
/// subdomain, as the API server requires. Names reach API paths as they are (kube does not
/// escape them), so `../` or `/` in one must never get that far.
pub fn object_name_problem(name: &str) -> Option<String> {
    (!is_dns_subdomain(name)).then(|| {
        format!(
            "{name:?} is not a valid object name: at most 253 lowercase letters, digits, '-' \
             and '.', each dot-separated part starting and ending with a letter or digit"
        )
    })
}

/// Why `name` cannot name a namespace, if it cannot: a DNS-1123 label.
pub fn namespace_name_problem(name: &str) -> Option<String> {
    (!is_dns_label(name)).then(|| {
        format!(
            "{name:?} is not a valid namespace name: at most 63 lowercase letters, digits \
             and '-', starting and ending with a letter or digit"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_subdomains() {
        for good in ["a", "a-b", "0", &"a".repeat(63)] {
            assert!(is_dns_label(good), "{good}");
        }
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", &"a".repeat(64)] {
            assert!(!is_dns_label(bad), "{bad}");
        }
        assert!(is_dns_subdomain("a.b-c.d"));
        for bad in ["a..b", ".a", "a.", "a/b", "../x", &"a.".repeat(127)] {
            assert!(!is_dns_subdomain(bad), "{bad}");
        }
        assert!(
            object_name_problem("../x")
                .unwrap()
                .contains("not a valid object name")
        );
        assert!(
            namespace_name_problem("a.b")
                .unwrap()
                .contains("not a valid namespace name")
        );
    }
}
