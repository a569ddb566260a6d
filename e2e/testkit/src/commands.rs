//! The commands the user guide shows that need a cluster, exactly as written there. The demo
//! runs each of them (from the repository root, against the real cluster), and
//! `discovery/tests/it/docs_commands.rs` fails when the docs show a cluster command not listed
//! here.

use std::path::Path;

use anyhow::{Context, bail};

use crate::kubectl::Kubectl;

pub const INSTALL: &str = "kubectl apply -k manifests/";
pub const APPLY_DISCOVERY_SERVICE: &str =
    "kubectl apply -f manifests/examples/discoveryservice.yaml";
pub const LABEL_NAMESPACE: &str =
    "kubectl label namespace demo marin3r.3scale.net/discovery-service=instance";
pub const APPLY_ENVOY_CONFIG: &str = "kubectl apply -f manifests/examples/envoyconfig.yaml";
pub const APPLY_DEPLOYMENT: &str = "kubectl apply -f manifests/examples/deployment.yaml";
pub const GET_CONFIGS: &str = "kubectl get envoyconfigs,envoyconfigrevisions -n demo";
pub const DESCRIBE_CONFIG: &str = "kubectl describe envoyconfig demo-proxy -n demo";
pub const APPLY_CERTIFICATE: &str = "kubectl apply -f manifests/examples/certificate.yaml";
pub const GET_CERTIFICATES: &str = "kubectl get dsc -A";
pub const CERTIFICATE_STATUS: &str = "marin3r certs status example-server -n demo";
pub const RENEW: &str = "marin3r certs renew example-server -n demo";
pub const RENEW_BY_ANNOTATION: &str =
    "kubectl annotate dsc example-server -n demo marin3r.3scale.net/renew=now --overwrite";
/// Through the API server (a pod port-forward to the discovery pod), with the current
/// kubeconfig.
pub const PROXY_STATUS: &str = "marin3r proxy-status -n demo";
/// The listeners the demo pod's Envoy holds (its `/config_dump` through a port-forward),
/// compared with what the discovery pod serves it.
pub const PROXY_CONFIG: &str = "marin3r proxy-config -n demo deployment/demo listeners";
/// The `SYNCED` column: how many connected proxies acknowledged the published version.
pub const GET_CONFIG_SYNCED: &str = "kubectl get envoyconfig demo-proxy -n demo";
/// The installation checked part by part; exit code 0 only when every check passes.
pub const CHECK: &str = "marin3r check";

/// The EnvoyDeployment guide's commands (`docs/envoydeployment.md`), run in its order by the
/// gateway end-to-end test (`e2e/tests/it/envoy_deployment_e2e.rs`) on the real cluster with
/// nothing but `manifests/` installed, in the test's own namespace instead of `gateway`.
pub const GATEWAY_APPLY_NAMESPACE: &str = "kubectl apply -f docs/examples/gateway/namespace.yaml";
pub const GATEWAY_APPLY_BACKEND: &str = "kubectl apply -f docs/examples/gateway/backend.yaml";
pub const GATEWAY_APPLY_DISCOVERY_SERVICE: &str =
    "kubectl apply -f docs/examples/gateway/discoveryservice.yaml";
pub const GATEWAY_WAIT_DISCOVERY_SERVICE: &str =
    "kubectl wait discoveryservice/instance -n gateway --for=condition=Ready --timeout=120s";
pub const GATEWAY_APPLY_ENVOY_CONFIG: &str =
    "kubectl apply -f docs/examples/gateway/envoyconfig.yaml";
pub const GATEWAY_APPLY_ENVOY_DEPLOYMENT: &str =
    "kubectl apply -f docs/examples/gateway/envoydeployment.yaml";
pub const GATEWAY_APPLY_SERVICE: &str = "kubectl apply -f docs/examples/gateway/service.yaml";
pub const GATEWAY_GET: &str = "kubectl get envoydeployments -n gateway";
pub const GATEWAY_GET_CHILDREN: &str =
    "kubectl get deployments,poddisruptionbudgets,dsc -n gateway";
pub const GATEWAY_APPLY_CLIENT: &str = "kubectl apply -f docs/examples/gateway/client.yaml";
/// The client's latest line: the backend's answer through the gateway's Service.
pub const GATEWAY_CLIENT_LOGS: &str = "kubectl logs hello-client -n gateway --tail=1";
/// What one gateway pod's Envoy holds, against what its node is served.
pub const GATEWAY_PROXY_CONFIG: &str =
    "marin3r proxy-config -n gateway deployment/marin3r-envoydeployment-front-door listeners";

/// Every command of the EnvoyDeployment guide, in its order.
pub const GATEWAY: &[&str] = &[
    GATEWAY_APPLY_NAMESPACE,
    GATEWAY_APPLY_BACKEND,
    GATEWAY_APPLY_DISCOVERY_SERVICE,
    GATEWAY_WAIT_DISCOVERY_SERVICE,
    GATEWAY_APPLY_ENVOY_CONFIG,
    GATEWAY_APPLY_ENVOY_DEPLOYMENT,
    GATEWAY_APPLY_SERVICE,
    GATEWAY_GET,
    GATEWAY_GET_CHILDREN,
    GATEWAY_APPLY_CLIENT,
    GATEWAY_CLIENT_LOGS,
    GATEWAY_PROXY_CONFIG,
];

/// Every command above but the guide's.
pub const ALL: &[&str] = &[
    INSTALL,
    APPLY_DISCOVERY_SERVICE,
    LABEL_NAMESPACE,
    APPLY_ENVOY_CONFIG,
    APPLY_DEPLOYMENT,
    GET_CONFIGS,
    DESCRIBE_CONFIG,
    APPLY_CERTIFICATE,
    GET_CERTIFICATES,
    CERTIFICATE_STATUS,
    RENEW,
    RENEW_BY_ANNOTATION,
    PROXY_STATUS,
    PROXY_CONFIG,
    GET_CONFIG_SYNCED,
    CHECK,
];

/// Runs one documented command from `repo` (whitespace-separated words, as in the docs),
/// with `kubectl` and `marin3r` bound to the given tools; returns stdout.
pub async fn run(
    command: &str,
    repo: &Path,
    kubectl: &Kubectl,
    kubeconfig: &Path,
    marin3r: &Path,
) -> anyhow::Result<String> {
    let words: Vec<&str> = command.split_whitespace().collect();
    let (program, args) = words.split_first().context("an empty command")?;
    let mut cmd = match *program {
        "kubectl" => kubectl.command(args)?,
        "marin3r" => {
            let mut c = tokio::process::Command::new(marin3r);
            c.args(args)
                .env("KUBECONFIG", kubeconfig)
                .kill_on_drop(true);
            c
        }
        other => bail!("{command}: the demo runs only kubectl and marin3r, not {other}"),
    };
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        cmd.current_dir(repo)
            .stdin(std::process::Stdio::null())
            .output(),
    )
    .await
    .with_context(|| format!("`{command}` did not finish within 30 s"))?
    .with_context(|| format!("running `{command}`"))?;
    if !out.status.success() {
        bail!(
            "`{command}` failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
