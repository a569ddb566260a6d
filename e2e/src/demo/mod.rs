//! The quick start behind `hack/demo`: on a real cluster, install `manifests/`, create a
//! DiscoveryService, an EnvoyConfig and an annotated Deployment from `manifests/examples/`, and
//! narrate each step of the story as the Kubernetes API and the proxies show it happening.

pub mod narrate;

use marin3r_api::envoy_config::CacheState;
use marin3r_testkit::commands;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret};
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use marin3r_api::EnvoyConfig;
use marin3r_api::discovery_service::DiscoveryService;
use marin3r_certs::api::DiscoveryServiceCertificate;

use marin3r_testkit::kubectl::Kubectl;
pub use narrate::{Narrator, wait_for};

/// The files the story applies, relative to the repository (the same ones the user guide
/// shows).
pub const DISCOVERY_SERVICE: &str = "manifests/examples/discoveryservice.yaml";
pub const ENVOY_CONFIG: &str = "manifests/examples/envoyconfig.yaml";
pub const REJECTED_CONFIG: &str = "docs/examples/envoyconfig-rejected.yaml";

/// The body the first config answers with, and the one the update switches to.
pub const FIRST_BODY: &str = "hello from marin3r";
pub const UPDATED_BODY: &str = "hello again from marin3r";

const NAMESPACE: &str = "demo";
const NODE_ID: &str = "demo-proxy";
const APP_LABEL: &str = "app=demo";
const SIDECAR: &str = "envoy-sidecar";
const LISTENER_PORT: u16 = 8080;

/// What the story needs from its surroundings.
pub struct Demo {
    pub client: kube::Client,
    pub kubectl: Kubectl,
    pub kubeconfig: PathBuf,
    /// The repository root (`manifests/`, `docs/examples/`).
    pub repo: PathBuf,
    /// The `marin3r` binary, to show `marin3r proxy-status`.
    pub marin3r: PathBuf,
    /// How long one step may take.
    pub step_timeout: Duration,
    /// Install from this rendered `install.yaml` (`hack/render-install`) instead of
    /// `kubectl apply -k manifests/`.
    pub install_yaml: Option<PathBuf>,
    /// marin3r is installed already (by helm, say): the story only waits for it.
    pub installed: bool,
}

impl Demo {
    fn file(&self, relative: &str) -> anyhow::Result<String> {
        let path = self.repo.join(relative);
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
    }

    async fn apply(&self, yaml: &str) -> anyhow::Result<String> {
        self.kubectl.ok_with(&["apply", "-f", "-"], yaml).await
    }

    /// Runs a command exactly as the user guide shows it.
    async fn doc(&self, command: &str) -> anyhow::Result<String> {
        commands::run(
            command,
            &self.repo,
            &self.kubectl,
            &self.kubeconfig,
            &self.marin3r,
        )
        .await
    }

    /// Runs the whole story; every step is printed, the first failure ends it.
    pub async fn story(&self, n: &mut Narrator) {
        let t = self.step_timeout;
        let what = match &self.install_yaml {
            _ if self.installed => "marin3r is installed already: waiting for it".to_owned(),
            Some(file) => format!(
                "installing {} (kubectl apply --server-side -f)",
                file.display()
            ),
            None => "installing manifests/ (kubectl apply -k manifests/)".to_owned(),
        };
        let installed = n
            .step(&what, async {
                let out = match &self.install_yaml {
                    _ if self.installed => String::new(),
                    Some(file) => {
                        let file = file.to_string_lossy();
                        self.kubectl
                            .ok(&["apply", "--server-side", "-f", &file])
                            .await?
                    }
                    None => self.doc(commands::INSTALL).await?,
                };
                let objects = out.lines().count();
                let ready = wait_for("every Deployment available", t, || async {
                    all_deployments_ready(&self.client).await
                })
                .await?;
                let made = (!self.installed).then(|| format!("{objects} objects; "));
                Ok(((), format!("{}running {ready}", made.unwrap_or_default())))
            })
            .await;
        if installed.is_none() {
            return;
        }

        let Some(()) = n
            .step(
                "creating the DiscoveryService; waiting until it is Ready",
                async {
                    let text = self.file(DISCOVERY_SERVICE)?;
                    let ds: DiscoveryService =
                        serde_saphyr::from_str(&text).with_context(|| {
                            format!("{DISCOVERY_SERVICE} is not a DiscoveryService")
                        })?;
                    let ns = ds.namespace().unwrap_or_default();
                    for namespace in [ns.as_str(), NAMESPACE] {
                        ensure_namespace(&self.client, namespace).await?;
                    }
                    self.doc(commands::APPLY_DISCOVERY_SERVICE).await?;
                    let api: Api<DiscoveryService> = Api::namespaced(self.client.clone(), &ns);
                    let name = ds.name_any();
                    let message = wait_for("condition Ready=True", t, || async {
                        let ds = api.get(&name).await?;
                        let ready = ds.status.as_ref().and_then(|s| {
                            s.conditions
                                .iter()
                                .find(|c| c.type_ == "Ready" && c.status == "True")
                        });
                        Ok(ready.map(|c| c.message.clone()))
                    })
                    .await?;
                    Ok(((), format!("{ns}/{name}: {message}")))
                },
            )
            .await
        else {
            return;
        };

        let enabled = n
            .step(
                "enabling namespace demo (enabledNamespaces, and the label); waiting for it",
                async {
                    self.doc(commands::LABEL_NAMESPACE).await?;
                    wait_for("namespace demo enabled", t, || async {
                        namespace_enabled(&self.client, NAMESPACE).await
                    })
                    .await?;
                    Ok((
                        (),
                        "marin3r.3scale.net/status=enabled, Secret envoy-sidecar-client-cert, \
                         ConfigMap envoy-sidecar-bootstrap"
                            .to_owned(),
                    ))
                },
            )
            .await;
        if enabled.is_none() {
            return;
        }

        let configs: Api<EnvoyConfig> = Api::namespaced(self.client.clone(), NAMESPACE);
        let Some(first_version) = n
            .step(
                "applying the EnvoyConfig demo/demo-proxy; waiting until InSync",
                async {
                    self.doc(commands::APPLY_ENVOY_CONFIG).await?;
                    let v = wait_for("cacheState InSync", t, || async {
                        in_sync_version(&configs.get(NODE_ID).await?)
                    })
                    .await?;
                    Ok((v.clone(), format!("published version {v}")))
                },
            )
            .await
        else {
            return;
        };

        let Some(pod) = n
            .step(
                "starting the annotated Deployment; waiting for the injected pod",
                async {
                    self.doc(commands::APPLY_DEPLOYMENT).await?;
                    let pods: Api<Pod> = Api::namespaced(self.client.clone(), NAMESPACE);
                    let pod = wait_for("a pod of app=demo with the sidecar", t, || async {
                        let list = pods.list(&ListParams::default().labels(APP_LABEL)).await?;
                        Ok(list.items.into_iter().find(has_sidecar))
                    })
                    .await?;
                    let name = pod.name_any();
                    Ok((name.clone(), format!("{name} has the {SIDECAR} container")))
                },
            )
            .await
        else {
            return;
        };

        let Some(pod_ip) = n
            .step(
                "Envoy connected and synced (pod Ready, marin3r proxy-status)",
                async {
                    let pods: Api<Pod> = Api::namespaced(self.client.clone(), NAMESPACE);
                    let ip = wait_for("the pod Ready", t, || async {
                        Ok(ready_ip(&pods.get(&pod).await?))
                    })
                    .await?;
                    // Through the API server: a port-forward to the discovery pod's
                    // loopback admin port, as a user runs it.
                    let table = wait_for("the proxy synced in marin3r proxy-status", t, || async {
                        let table = self.doc(commands::PROXY_STATUS).await?;
                        Ok(proxy_synced(&table).then_some(table))
                    })
                    .await?;
                    Narrator::show(&format!("$ {}", commands::PROXY_STATUS));
                    Narrator::show(&table);
                    let detail = format!("pod IP {ip}");
                    Ok((ip, detail))
                },
            )
            .await
        else {
            return;
        };
        let endpoint = format!("http://{pod_ip}:{LISTENER_PORT}/");

        let answered = n
            .step(
                "a request through the sidecar returns the configured body",
                async {
                    let body = wait_for("the configured body", t, || async {
                        Ok(get(&endpoint).await?.filter(|b| b == FIRST_BODY))
                    })
                    .await?;
                    Ok(((), format!("GET {endpoint} -> {:?}", body.trim_end())))
                },
            )
            .await;
        if answered.is_none() {
            return;
        }

        let updated = n
            .step(
                "updating the EnvoyConfig; waiting for Envoy to serve it",
                async {
                    let text = self.file(ENVOY_CONFIG)?.replace(FIRST_BODY, UPDATED_BODY);
                    if !text.contains(UPDATED_BODY) {
                        bail!("{ENVOY_CONFIG} no longer holds the body {FIRST_BODY:?}");
                    }
                    self.apply(&text).await?;
                    let v = wait_for("a new version InSync", t, || async {
                        let v = in_sync_version(&configs.get(NODE_ID).await?)?;
                        Ok(v.filter(|v| *v != first_version))
                    })
                    .await?;
                    wait_for("the new body", t, || async {
                        Ok(get(&endpoint).await?.filter(|b| b == UPDATED_BODY))
                    })
                    .await?;
                    Ok((
                        (),
                        format!("version {v}; GET -> {:?}", UPDATED_BODY.trim_end()),
                    ))
                },
            )
            .await;
        if updated.is_none() {
            return;
        }

        n.step(
            "applying a config Envoy rejects; waiting for the rollback",
            async {
                self.apply(&self.file(REJECTED_CONFIG)?).await?;
                let nack = wait_for("cacheState Rollback", t, || async {
                    let ec = configs.get(NODE_ID).await?;
                    let status = ec.status.unwrap_or_default();
                    Ok((status.cache_state == Some(CacheState::Rollback))
                        .then(|| status.last_nack_message.unwrap_or_default()))
                })
                .await?;
                let body = get(&endpoint).await?.unwrap_or_default();
                if body != UPDATED_BODY {
                    bail!("after the rollback Envoy answers {body:?}, not {UPDATED_BODY:?}");
                }
                Narrator::show(&format!("Envoy said: {nack}"));
                for command in [commands::GET_CONFIGS, commands::DESCRIBE_CONFIG] {
                    let out = self.doc(command).await?;
                    Narrator::show(&format!("$ {command}"));
                    Narrator::show(&out);
                }
                Ok(((), "still serving the previous version".to_owned()))
            },
        )
        .await;
        if n.failed.is_empty() {
            self.certificates(n).await;
        }
        if n.failed.is_empty() {
            self.convergence(n).await;
        }
    }

    /// The end: the sidecar's own configuration, in sync with what the control plane serves
    /// it, and the `SYNCED` column of the EnvoyConfig.
    async fn convergence(&self, n: &mut Narrator) {
        let t = self.step_timeout;
        n.step(
            "what the sidecar holds (marin3r proxy-config) and the SYNCED column",
            async {
                // Exit code 0 only when the proxy holds what the discovery pod serves it.
                let config = wait_for("the proxy's config in sync", t, || async {
                    let out = self.doc(commands::PROXY_CONFIG).await?;
                    Ok(out.contains("In sync").then_some(out))
                })
                .await?;
                Narrator::show(&format!("$ {}", commands::PROXY_CONFIG));
                Narrator::show(&config);
                let table = wait_for("SYNCED 1/1", t, || async {
                    let out = self.doc(commands::GET_CONFIG_SYNCED).await?;
                    Ok((synced_column(&out).as_deref() == Some("1/1")).then_some(out))
                })
                .await?;
                Narrator::show(&format!("$ {}", commands::GET_CONFIG_SYNCED));
                Narrator::show(&table);
                // `marin3r check` passes on the demo's cluster (the rolled-back config is a
                // warning, not a failure).
                let checked = wait_for("marin3r check to pass", t, || async {
                    Ok(Some(self.doc(commands::CHECK).await?))
                })
                .await?;
                Narrator::show(&format!("$ {}", commands::CHECK));
                Narrator::show(&checked);
                Ok(((), "the proxy holds what is served; SYNCED 1/1".to_owned()))
            },
        )
        .await;
    }

    /// The user guide's certificate commands: a CA and a certificate it signs, issued,
    /// inspected and renewed twice (by `marin3r certs renew` and by the annotation).
    async fn certificates(&self, n: &mut Narrator) {
        let t = self.step_timeout;
        let api: Api<DiscoveryServiceCertificate> = Api::namespaced(self.client.clone(), NAMESPACE);
        let hash = || async {
            let dsc = api.get("example-server").await?;
            let status = dsc.status.unwrap_or_default();
            if status.ready != Some(true) {
                bail!("example-server not ready yet");
            }
            Ok(status.certificate_hash)
        };
        let Some(first) = n
            .step(
                "issuing a certificate of your own (manifests/examples/certificate.yaml)",
                async {
                    self.doc(commands::APPLY_CERTIFICATE).await?;
                    let h = wait_for("example-server Ready", t, hash).await?;
                    let out = self.doc(commands::CERTIFICATE_STATUS).await?;
                    Narrator::show(&format!("$ {}", commands::CERTIFICATE_STATUS));
                    Narrator::show(&out);
                    Ok((h.clone(), format!("hash {h}")))
                },
            )
            .await
        else {
            return;
        };
        let Some(second) = n
            .step("renewing it with marin3r certs renew", async {
                self.doc(commands::RENEW).await?;
                let h = wait_for("a new certificate hash", t, || async {
                    Ok(hash().await?.filter(|h| *h != first))
                })
                .await?;
                Ok((h.clone(), format!("hash {first} -> {h}")))
            })
            .await
        else {
            return;
        };
        n.step("renewing it with the annotation", async {
            self.doc(commands::RENEW_BY_ANNOTATION).await?;
            let h = wait_for("a new certificate hash", t, || async {
                Ok(hash().await?.filter(|h| *h != second))
            })
            .await?;
            let out = self.doc(commands::GET_CERTIFICATES).await?;
            Narrator::show(&format!("$ {}", commands::GET_CERTIFICATES));
            Narrator::show(&out);
            Ok(((), format!("hash {second} -> {h}")))
        })
        .await;
    }
}

pub async fn ensure_namespace(client: &kube::Client, name: &str) -> anyhow::Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    if api.get_opt(name).await?.is_none() {
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name}
        }))?;
        api.create(&Default::default(), &ns)
            .await
            .with_context(|| format!("creating namespace {name}"))?;
    }
    Ok(())
}

/// `Some("<ready>/<total> deployments")` once every Deployment has all replicas ready.
pub async fn all_deployments_ready(client: &kube::Client) -> anyhow::Result<Option<String>> {
    let api: Api<Deployment> = Api::all(client.clone());
    let list = api.list(&ListParams::default()).await?;
    if list.items.is_empty() {
        bail!("no Deployment yet");
    }
    let mut waiting = Vec::new();
    for d in &list.items {
        let want = d.spec.replicas.unwrap_or(1);
        let ready = d
            .status
            .as_ref()
            .and_then(|s| s.ready_replicas)
            .unwrap_or(0);
        if ready < want {
            waiting.push(format!(
                "{}/{} {ready}/{want}",
                d.namespace().unwrap_or_default(),
                d.name_any()
            ));
        }
    }
    if waiting.is_empty() {
        let names: Vec<String> = list
            .items
            .iter()
            .map(|d| format!("{}/{}", d.namespace().unwrap_or_default(), d.name_any()))
            .collect();
        Ok(Some(names.join(", ")))
    } else {
        bail!("waiting for {}", waiting.join(", "))
    }
}

pub async fn namespace_enabled(client: &kube::Client, name: &str) -> anyhow::Result<Option<()>> {
    let ns = Api::<Namespace>::all(client.clone()).get(name).await?;
    let label = ns
        .labels()
        .get("marin3r.3scale.net/status")
        .map(String::as_str);
    if label != Some("enabled") {
        bail!("label marin3r.3scale.net/status is {label:?}");
    }
    let secrets: Api<Secret> = Api::namespaced(client.clone(), name);
    if secrets
        .get_opt("envoy-sidecar-client-cert")
        .await?
        .is_none()
    {
        bail!("no Secret envoy-sidecar-client-cert yet");
    }
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), name);
    if maps.get_opt("envoy-sidecar-bootstrap").await?.is_none() {
        bail!("no ConfigMap envoy-sidecar-bootstrap yet");
    }
    Ok(Some(()))
}

/// The published version once the config is `InSync` with it; an error with the state
/// otherwise, so a timeout says where it stood.
pub fn in_sync_version(ec: &EnvoyConfig) -> anyhow::Result<Option<String>> {
    let status = ec.status.clone().unwrap_or_default();
    match (
        status.cache_state,
        &status.published_version,
        &status.desired_version,
    ) {
        (Some(CacheState::InSync), Some(p), Some(d)) if p == d => Ok(Some(p.clone())),
        (state, p, d) => {
            bail!("cacheState {state:?}, published {p:?}, desired {d:?}")
        }
    }
}

fn has_sidecar(pod: &Pod) -> bool {
    pod.spec.as_ref().is_some_and(|s| {
        s.containers
            .iter()
            .chain(s.init_containers.iter().flatten())
            .any(|c| c.name == SIDECAR)
    })
}

/// The pod's IP once its Ready condition is true.
pub fn ready_ip(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    ready.then(|| status.pod_ip.clone()).flatten()
}

/// The `SYNCED` cell of the first row of a `kubectl get envoyconfig` table.
fn synced_column(table: &str) -> Option<String> {
    let mut lines = table.lines();
    let header = lines.next()?;
    let start = header.find("SYNCED")?;
    let row = lines.next()?;
    let cell = row.get(start..)?.split_whitespace().next()?;
    Some(cell.to_owned())
}

/// Whether `marin3r proxy-status` shows the demo proxy with every type acknowledged.
fn proxy_synced(table: &str) -> bool {
    table.lines().any(|line| {
        let cells: Vec<&str> = line.split_whitespace().collect();
        cells.first() == Some(&NAMESPACE)
            && cells.get(1) == Some(&NODE_ID)
            && line.contains("SYNCED")
            && !line.contains("STALE")
            && !line.contains("NACKED")
    })
}

/// GET `url` (5 s at most): `Some(body)` on 200, `None` on another status.
pub async fn get(url: &str) -> anyhow::Result<Option<String>> {
    let url = url.to_owned();
    tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(5)))
            .http_status_as_error(false)
            .build()
            .into();
        let mut response = agent
            .get(&url)
            .call()
            .with_context(|| format!("GET {url}"))?;
        let body = response.body_mut().read_to_string()?;
        Ok((response.status() == 200).then_some(body))
    })
    .await?
}

/// The repository root: the folder holding `manifests/` and `docs/examples/`.
pub fn find_repo(start: &Path) -> anyhow::Result<PathBuf> {
    start
        .ancestors()
        .find(|d| d.join("manifests/examples").is_dir() && d.join("docs/examples").is_dir())
        .map(Path::to_path_buf)
        .with_context(|| {
            format!(
                "no folder with manifests/ and docs/examples/ above {}",
                start.display()
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_update_changes_the_body_the_example_holds() {
        let repo = find_repo(Path::new(env!("CARGO_MANIFEST_DIR"))).unwrap();
        let text = std::fs::read_to_string(repo.join(ENVOY_CONFIG)).unwrap();
        assert!(text.contains(FIRST_BODY));
        assert!(text.contains(&format!("nodeID: {NODE_ID}\n")));
        let rejected = std::fs::read_to_string(repo.join(REJECTED_CONFIG)).unwrap();
        assert!(rejected.contains(&format!("name: {NODE_ID}\n")));
    }

    #[test]
    fn in_sync_needs_the_desired_version_published() {
        let mut ec: EnvoyConfig = serde_saphyr::from_str(
            "apiVersion: marin3r.3scale.net/v1alpha1\nkind: EnvoyConfig\nmetadata: {name: a}\nspec: {nodeID: a}\n",
        )
        .unwrap();
        assert!(in_sync_version(&ec).is_err());
        ec.status = Some(Default::default());
        let status = ec.status.as_mut().unwrap();
        status.cache_state = Some(CacheState::InSync);
        status.published_version = Some("v1".into());
        status.desired_version = Some("v1".into());
        assert_eq!(in_sync_version(&ec).unwrap().as_deref(), Some("v1"));
        ec.status.as_mut().unwrap().desired_version = Some("v2".into());
        assert!(in_sync_version(&ec).is_err());
    }
}
