//! The local cluster's Deployment controller: Pods owned directly by their Deployment (no
//! ReplicaSets), named `<deployment>-<template hash>-<suffix>` and labelled
//! `pod-template-hash`. A changed template gets its new Pods first; the old ones are deleted
//! only once the new ones are Ready (`maxUnavailable: 0`), or first with `Recreate`.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{Deployment, DeploymentCondition, DeploymentStatus};
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::Store;
use serde_json::json;
use tokio::sync::Notify;

use crate::tasks::{AbortOnDrop, watch_into_store};

use crate::kubelet::sync::merge_diff;

const HASH_LABEL: &str = "pod-template-hash";
/// Kubernetes' alphabet for generated name parts: no vowels, no confusable characters.
const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

fn encode(mut n: u64, len: usize) -> String {
    (0..len)
        .map(|_| {
            let c = ALPHABET[(n % ALPHABET.len() as u64) as usize] as char;
            n /= ALPHABET.len() as u64;
            c
        })
        .collect()
}

/// A stable hash of a pod template (FNV-1a over its JSON), as the label value.
pub fn template_hash(template: &PodTemplateSpec) -> String {
    let text = serde_json::to_string(template).unwrap_or_default();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    encode(h, 10)
}

fn random_suffix() -> String {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    encode(h.finish(), 5)
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn owned_by(pod: &Pod, uid: &str) -> bool {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|r| r.uid == uid && r.controller == Some(true))
}

/// The Pod a Deployment's template describes.
pub fn pod_from_template(deployment: &Deployment, hash: &str) -> Option<Pod> {
    let name = deployment.metadata.name.clone()?;
    let uid = deployment.metadata.uid.clone()?;
    let template = deployment.spec.template.clone();
    let meta = template.metadata.unwrap_or_default();
    let mut labels = meta.labels.unwrap_or_default();
    labels.insert(HASH_LABEL.into(), hash.into());
    Some(Pod {
        metadata: ObjectMeta {
            name: Some(format!("{name}-{hash}-{}", random_suffix())),
            namespace: deployment.metadata.namespace.clone(),
            labels: Some(labels),
            annotations: meta.annotations,
            owner_references: Some(vec![OwnerReference {
                api_version: "apps/v1".into(),
                kind: "Deployment".into(),
                name,
                uid,
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..Default::default()
        },
        spec: template.spec,
        status: None,
    })
}

/// What to do for one Deployment, given the pods it owns (a pure decision).
#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    pub create: usize,
    pub delete: Vec<String>,
    pub status: DeploymentStatus,
}

pub fn plan(deployment: &Deployment, owned: &[&Pod], previous: Option<&DeploymentStatus>) -> Plan {
    let spec = deployment.spec.clone();
    let replicas = spec.replicas.unwrap_or(1).max(0) as usize;
    let hash = template_hash(&spec.template);
    let alive: Vec<&Pod> = owned
        .iter()
        .copied()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    let is_new =
        |p: &&&Pod| p.metadata.labels.as_ref().and_then(|l| l.get(HASH_LABEL)) == Some(&hash);
    let (new, old): (Vec<&Pod>, Vec<&Pod>) = alive.iter().partition(is_new);
    let new_ready = new.iter().filter(|p| is_ready(p)).count();
    let name = |p: &&Pod| p.metadata.name.clone().unwrap_or_default();
    let recreate = spec.strategy.as_ref().and_then(|s| s.type_.as_deref()) == Some("Recreate");
    let mut out = Plan::default();
    if recreate && !old.is_empty() {
        out.delete.extend(old.iter().map(name));
    } else {
        out.create = replicas.saturating_sub(new.len());
        if new.len() > replicas {
            let mut extra: Vec<&&Pod> = new.iter().collect();
            extra.sort_by_key(|p| is_ready(p));
            out.delete
                .extend(extra.iter().take(new.len() - replicas).map(|p| name(p)));
        }
        if new_ready >= replicas {
            out.delete.extend(old.iter().map(name));
        }
    }
    let ready = alive.iter().filter(|p| is_ready(p)).count() as i32;
    let available = ready >= replicas as i32;
    let complete = new_ready >= replicas && old.is_empty() && new.len() == replicas;
    let now = jiff::Timestamp::now();
    let condition = |type_: &str, ok: bool, reason: &str, message: String| {
        let status = if ok { "True" } else { "False" };
        let prev = previous.and_then(|s| s.conditions.as_ref()).and_then(|cs| {
            cs.iter().find(|c| {
                c.type_.as_deref() == Some(type_)
                    && c.status.as_deref() == Some(status)
                    && c.reason.as_deref() == Some(reason)
            })
        });
        DeploymentCondition {
            type_: Some(type_.into()),
            status: Some(status.into()),
            reason: Some(reason.into()),
            message: Some(message),
            last_transition_time: prev
                .and_then(|c| c.last_transition_time.clone())
                .or(Some(Time(now))),
            last_update_time: prev
                .and_then(|c| c.last_update_time.clone())
                .or(Some(Time(now))),
        }
    };
    let dname = deployment.metadata.name.clone().unwrap_or_default();
    out.status = DeploymentStatus {
        observed_generation: deployment.metadata.generation,
        replicas: Some(alive.len() as i32),
        updated_replicas: Some(new.len() as i32),
        ready_replicas: Some(ready),
        available_replicas: Some(ready),
        unavailable_replicas: Some((replicas as i32 - ready).max(0)),
        conditions: Some(vec![
            if available {
                condition(
                    "Available",
                    true,
                    "MinimumReplicasAvailable",
                    "Deployment has minimum availability.".into(),
                )
            } else {
                condition(
                    "Available",
                    false,
                    "MinimumReplicasUnavailable",
                    "Deployment does not have minimum availability.".into(),
                )
            },
            if complete {
                condition(
                    "Progressing",
                    true,
                    "NewReplicaSetAvailable",
                    format!("Deployment {dname:?} has successfully progressed."),
                )
            } else {
                condition(
                    "Progressing",
                    true,
                    "ReplicaSetUpdated",
                    format!("Deployment {dname:?} is progressing."),
                )
            },
        ]),
        ..Default::default()
    };
    out
}

/// The running controller; stops when dropped.
pub struct DeploymentController {
    _tasks: Vec<AbortOnDrop>,
}

/// Pods created but not yet seen in the cache, so a slow cache does not double them.
type Expectations = HashMap<String, (Vec<String>, Instant)>;

impl DeploymentController {
    pub async fn start(client: Client) -> anyhow::Result<Self> {
        let trigger = Arc::new(Notify::new());
        let mut tasks = Vec::new();
        let deployments: Store<Deployment> = watch_into_store(
            Api::all(client.clone()),
            trigger.clone(),
            &mut tasks,
            "deployment controller",
        );
        let pods: Store<Pod> = watch_into_store(
            Api::all(client.clone()),
            trigger.clone(),
            &mut tasks,
            "deployment controller",
        );
        tokio::time::timeout(Duration::from_secs(30), async {
            deployments.wait_until_ready().await?;
            pods.wait_until_ready().await
        })
        .await
        .map_err(|_| {
            anyhow::anyhow!("the deployment controller's watches did not sync within 30 s")
        })??;
        tasks.push(AbortOnDrop(tokio::spawn(async move {
            let mut expectations = Expectations::new();
            loop {
                for d in deployments.state() {
                    if let Err(e) = reconcile(&client, &d, &pods, &mut expectations).await {
                        tracing::warn!(deployment = ?d.metadata.name, "reconcile: {e}");
                    }
                }
                // Events wake us; the timeout retries what failed or waited on expectations.
                let _ = tokio::time::timeout(Duration::from_secs(2), trigger.notified()).await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })));
        Ok(Self { _tasks: tasks })
    }
}

async fn reconcile(
    client: &Client,
    d: &Deployment,
    pods: &Store<Pod>,
    expectations: &mut Expectations,
) -> anyhow::Result<()> {
    if d.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let (Some(uid), Some(name), Some(ns)) =
        (&d.metadata.uid, &d.metadata.name, &d.metadata.namespace)
    else {
        return Ok(());
    };
    let all = pods.state();
    let owned: Vec<&Pod> = all
        .iter()
        .map(|p| p.as_ref())
        .filter(|p| p.metadata.namespace.as_ref() == Some(ns) && owned_by(p, uid))
        .collect();
    let seen: Vec<String> = owned
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    if let Some((names, since)) = expectations.get(uid) {
        if names.iter().all(|n| seen.contains(n)) || since.elapsed() > Duration::from_secs(10) {
            expectations.remove(uid);
        } else {
            return Ok(());
        }
    }
    let plan = plan(d, &owned, d.status.as_ref());
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let hash = template_hash(&d.spec.template);
    let mut created = Vec::new();
    for _ in 0..plan.create {
        let Some(pod) = pod_from_template(d, &hash) else {
            break;
        };
        let pod = api.create(&PostParams::default(), &pod).await?;
        tracing::info!(deployment = %name, pod = ?pod.metadata.name, "created");
        created.extend(pod.metadata.name);
    }
    if !created.is_empty() {
        expectations.insert(uid.clone(), (created, Instant::now()));
    }
    for pod in &plan.delete {
        tracing::info!(deployment = %name, pod = %pod, "deleting");
        match api.delete(pod, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    let current = d
        .status
        .as_ref()
        .and_then(|s| serde_json::to_value(s).ok())
        .unwrap_or_else(|| json!({}));
    let next = serde_json::to_value(&plan.status)?;
    if let Some(diff) = merge_diff(&current, &next) {
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
        deployments
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": diff })),
            )
            .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::{DeploymentSpec, DeploymentStrategy};
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
    use std::collections::BTreeMap;

    fn deployment(image: &str, strategy: Option<&str>) -> Deployment {
        Deployment {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("ns".into()),
                uid: Some("d-uid".into()),
                generation: Some(2),
                ..Default::default()
            },
            spec: DeploymentSpec {
                template: PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some(BTreeMap::from([("app".to_owned(), "web".to_owned())])),
                        ..Default::default()
                    }),
                    spec: Some(k8s_openapi::api::core::v1::PodSpec {
                        containers: vec![k8s_openapi::api::core::v1::Container {
                            name: "c".into(),
                            image: Some(image.into()),
                            ..Default::default()
                        }],
                        ..Default::default()
                    }),
                },
                strategy: strategy.map(|s| DeploymentStrategy {
                    type_: Some(s.into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            status: None,
        }
    }

    fn pod_of(d: &Deployment, ready: bool) -> Pod {
        let hash = template_hash(&d.spec.template);
        let mut pod = pod_from_template(d, &hash).unwrap();
        pod.status = Some(PodStatus {
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        pod
    }

    fn cond(s: &DeploymentStatus, t: &str) -> (String, Option<String>) {
        let c = s
            .conditions
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.type_.as_deref() == Some(t))
            .unwrap();
        (c.status.clone().unwrap(), c.reason.clone())
    }

    #[test]
    fn pods_are_named_labelled_and_owned() {
        let d = deployment("a", None);
        let hash = template_hash(&d.spec.template);
        assert_eq!(hash.len(), 10);
        let pod = pod_from_template(&d, &hash).unwrap();
        let name = pod.metadata.name.unwrap();
        assert!(
            name.starts_with(&format!("web-{hash}-")) && name.len() == "web-".len() + 10 + 6,
            "{name}"
        );
        assert_eq!(pod.metadata.labels.unwrap()[HASH_LABEL], hash);
        let owner = &pod.metadata.owner_references.unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("Deployment", "d-uid", Some(true))
        );
        assert_ne!(hash, template_hash(&deployment("b", None).spec.template));
    }

    #[test]
    fn a_new_template_keeps_the_old_pod_until_the_new_one_is_ready() {
        let v1 = deployment("a", None);
        let old = pod_of(&v1, true);
        let v2 = deployment("b", None);
        let p = plan(&v2, &[&old], None);
        assert_eq!((p.create, p.delete.len()), (1, 0));
        assert_eq!(cond(&p.status, "Available").0, "True");
        let new = pod_of(&v2, false);
        let p = plan(&v2, &[&old, &new], None);
        assert_eq!((p.create, p.delete.len()), (0, 0));
        assert_eq!(
            cond(&p.status, "Progressing").1.as_deref(),
            Some("ReplicaSetUpdated")
        );
        let new = pod_of(&v2, true);
        let p = plan(&v2, &[&old, &new], None);
        assert_eq!(p.delete, [old.metadata.name.clone().unwrap()]);
        let p = plan(&v2, &[&new], None);
        assert_eq!((p.create, p.delete.len()), (0, 0));
        assert_eq!(
            cond(&p.status, "Progressing").1.as_deref(),
            Some("NewReplicaSetAvailable")
        );
        assert_eq!(p.status.observed_generation, Some(2));
        assert_eq!(
            (p.status.ready_replicas, p.status.updated_replicas),
            (Some(1), Some(1))
        );
    }

    #[test]
    fn recreate_deletes_first_and_no_pods_means_unavailable() {
        let old = pod_of(&deployment("a", None), true);
        let v2 = deployment("b", Some("Recreate"));
        let p = plan(&v2, &[&old], None);
        assert_eq!((p.create, p.delete.len()), (0, 1));
        let p = plan(&v2, &[], None);
        assert_eq!(p.create, 1);
        assert_eq!(
            cond(&p.status, "Available"),
            ("False".into(), Some("MinimumReplicasUnavailable".into()))
        );
    }
}
