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

/// The rollout guide's commands (`docs/rollouts.md`), run in its order by its end-to-end
/// test (`e2e/tests/it/rollout_guide_e2e.rs`) on the real cluster with nothing but
/// `manifests/` installed, in the test's own namespace instead of `rollout`.
pub const ROLLOUT_APPLY_NAMESPACE: &str = "kubectl apply -f docs/examples/rollout/namespace.yaml";
pub const ROLLOUT_APPLY_DISCOVERY_SERVICE: &str =
    "kubectl apply -f docs/examples/rollout/discoveryservice.yaml";
pub const ROLLOUT_WAIT_DISCOVERY_SERVICE: &str =
    "kubectl wait discoveryservice/instance -n rollout --for=condition=Ready --timeout=120s";
pub const ROLLOUT_APPLY_V1: &str = "kubectl apply -f docs/examples/rollout/envoyconfig.yaml";
pub const ROLLOUT_APPLY_WEB: &str = "kubectl apply -f docs/examples/rollout/web.yaml";
pub const ROLLOUT_WAIT_WEB: &str =
    "kubectl rollout status deployment/web -n rollout --timeout=120s";
pub const ROLLOUT_APPLY_CLIENT: &str = "kubectl apply -f docs/examples/rollout/client.yaml";
pub const ROLLOUT_CLIENT_LOGS: &str = "kubectl logs web-client -n rollout --tail=1";
pub const ROLLOUT_APPLY_V2: &str = "kubectl apply -f docs/examples/rollout/envoyconfig-v2.yaml";
pub const ROLLOUT_STATUS: &str = "marin3r rollout status web -n rollout";
pub const ROLLOUT_PROXY_STATUS: &str = "marin3r proxy-status -n rollout";
/// Waits until no step is under way; exit code 0 only when the version is published.
pub const ROLLOUT_WATCH: &str = "marin3r rollout status web -n rollout --watch";
pub const ROLLOUT_APPLY_BROKEN: &str =
    "kubectl apply -f docs/examples/rollout/envoyconfig-broken.yaml";
pub const ROLLOUT_HISTORY: &str = "marin3r rollout history web -n rollout";

/// Every command of the rollout guide, in its order (a command may come more than once).
pub const ROLLOUT: &[&str] = &[
    ROLLOUT_APPLY_NAMESPACE,
    ROLLOUT_APPLY_DISCOVERY_SERVICE,
    ROLLOUT_WAIT_DISCOVERY_SERVICE,
    ROLLOUT_APPLY_V1,
    ROLLOUT_APPLY_WEB,
    ROLLOUT_WAIT_WEB,
    ROLLOUT_APPLY_CLIENT,
    ROLLOUT_CLIENT_LOGS,
    ROLLOUT_APPLY_V2,
    ROLLOUT_STATUS,
    ROLLOUT_PROXY_STATUS,
    ROLLOUT_WATCH,
    ROLLOUT_APPLY_BROKEN,
    ROLLOUT_WATCH,
    ROLLOUT_HISTORY,
    ROLLOUT_APPLY_V2,
];

/// Every command above but the guides'.
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
    let tools = Tools {
        repo,
        kubectl,
        kubeconfig,
        marin3r,
    };
    let out = tools
        .output(command, std::time::Duration::from_secs(30))
        .await?;
    if !out.status.success() {
        bail!(
            "`{command}` failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Where documented commands run: the repository, and the tools `kubectl` and `marin3r`
/// stand for.
pub struct Tools<'a> {
    pub repo: &'a Path,
    pub kubectl: &'a Kubectl,
    pub kubeconfig: &'a Path,
    pub marin3r: &'a Path,
}

impl Tools<'_> {
    /// Runs one documented command, whatever its exit status, for at most `timeout`.
    pub async fn output(
        &self,
        command: &str,
        timeout: std::time::Duration,
    ) -> anyhow::Result<std::process::Output> {
        let words: Vec<&str> = command.split_whitespace().collect();
        let (program, args) = words.split_first().context("an empty command")?;
        let mut cmd = match *program {
            "kubectl" => self.kubectl.command(args)?,
            "marin3r" => {
                let mut c = tokio::process::Command::new(self.marin3r);
                c.args(args)
                    .env("KUBECONFIG", self.kubeconfig)
                    .kill_on_drop(true);
                c
            }
            other => bail!("{command}: the demo runs only kubectl and marin3r, not {other}"),
        };
        tokio::time::timeout(
            timeout,
            cmd.current_dir(self.repo)
                .stdin(std::process::Stdio::null())
                .output(),
        )
        .await
        .with_context(|| format!("`{command}` did not finish within {timeout:?}"))?
        .with_context(|| format!("running `{command}`"))
    }
}
