//! docs/install.md's table of supported versions names the versions the tests run with, as
//! the scripts that install them pin them.

use std::path::Path;

/// `NAME=VALUE` of a shell script, without a trailing comment.
fn pinned(script: &str, name: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let text = std::fs::read_to_string(root.join(script)).unwrap();
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("{script} pins no {name}"));
    line.split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn the_support_matrix_names_the_versions_the_tests_install() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let page = std::fs::read_to_string(root.join("docs/install.md")).unwrap();
    let start = page.find("## Supported versions").expect("the section");
    let section = &page[start..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |i| i + 3)];
    let row = |part: &str| {
        section
            .lines()
            .find(|l| l.starts_with(&format!("| {part} |")))
            .unwrap_or_else(|| panic!("no row for {part}"))
            .to_owned()
    };
    let kubernetes = row("Kubernetes");
    for name in [
        "KUBERNETES_VERSION",
        "ETCD_VERSION",
        "CONTAINERD_VERSION",
        "COREDNS_VERSION",
    ] {
        let version = pinned("hack/install-cluster-tools", name);
        assert!(
            kubernetes.contains(&version),
            "{name} {version}: {kubernetes}"
        );
    }
    let envoy = pinned("hack/install-tools", "ENVOY_VERSION");
    assert!(row("Envoy").contains(&format!("| {envoy} (")), "{envoy}");
    let kubectl = pinned("hack/install-tools", "KUBECTL_WHEEL_VERSION");
    let minor = kubectl
        .rsplit_once('.')
        .map_or(kubectl.as_str(), |(m, _)| m);
    assert!(
        row("kubectl").contains(&format!("| {minor} (")),
        "{kubectl}"
    );
    let prometheus = pinned("hack/install-cluster-tools", "PROMETHEUS_VERSION");
    assert!(
        row("Prometheus").contains(&format!("| {} (", prometheus.trim_start_matches('v'))),
        "{prometheus}"
    );
    let helm = pinned("hack/install-cluster-tools", "HELM_VERSION");
    assert!(
        row("Helm").contains(&format!("| {} (", helm.trim_start_matches('v'))),
        "{helm}"
    );
    let olm = pinned(
        "hack/install-olm-validate",
        "OPERATOR_FRAMEWORK_API_VERSION",
    );
    assert!(row("OLM bundle format").contains(&olm), "{olm}");
    // The oldest Kubernetes the table names is the one `check --pre` enforces.
    let oldest = marin3r_discovery::cli::OLDEST_KUBERNETES_MINOR;
    assert!(
        kubernetes.contains(&format!("1.{oldest} or newer")),
        "{kubernetes}"
    );
}
