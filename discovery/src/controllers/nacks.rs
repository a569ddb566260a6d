//! Taints the revisions Envoy rejects. Policy: the first NACK of a version by any proxy of its
//! (namespace, node id) taints the revision that carried it, with Envoy's message; a taint is
//! permanent for that revision (delete the revision, or change the spec, to try again). The
//! `EnvoyConfig` controller sees the taint and rolls back.

use std::sync::Arc;

use kube::{Api, ResourceExt};
use marin3r_controller::{Note, patch_status, set_condition, status_patch};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::{Context, Error};
use crate::api::EnvoyConfigRevision;
use crate::api::envoy_config_revision::{REVISION_TAINTED, RevisionReason};
use crate::xds::NackEvent;

pub(crate) async fn run(
    ctx: Arc<Context>,
    mut nacks: mpsc::Receiver<NackEvent>,
    shutdown: impl Future<Output = ()> + Send,
) {
    tokio::pin!(shutdown);
    loop {
        let nack = tokio::select! {
            () = &mut shutdown => return,
            nack = nacks.recv() => match nack {
                Some(nack) => nack,
                None => return,
            },
        };
        // A failed write is retried a few times; the NACK is not sent again by Envoy.
        for attempt in 0..5u64 {
            match taint(&ctx, &nack).await {
                Ok(()) => break,
                Err(e) => {
                    warn!(error = %e, attempt, "could not taint the rejected revision");
                    tokio::time::sleep(std::time::Duration::from_millis(200 * (attempt + 1))).await;
                }
            }
        }
    }
}

async fn taint(ctx: &Context, nack: &NackEvent) -> Result<(), Error> {
    let Some(load) = ctx.publisher.revision_of(nack) else {
        debug!(namespace = %nack.namespace, node = %nack.node_id, version = %nack.version, "NACK of a version no revision served; ignored");
        return Ok(());
    };
    let api: Api<EnvoyConfigRevision> = Api::namespaced(ctx.client.clone(), &nack.namespace);
    let Some(revision) = api.get_opt(&load.revision).await? else {
        return Ok(());
    };
    if revision.is_tainted() || revision.spec.version != load.version {
        return Ok(());
    }
    let pod = nack.pod_name.as_deref().unwrap_or("unknown pod");
    let message = format!(
        "Envoy ({pod}) rejected the {} of version {}: {}",
        nack.resource_type, nack.version, nack.message
    );
    let mut status = revision.status.clone().unwrap_or_default();
    status.tainted = Some(true);
    set_condition(
        &mut status.conditions,
        REVISION_TAINTED,
        true,
        RevisionReason::RejectedByEnvoy,
        &message,
        revision.metadata.generation,
        &super::now(),
    );
    let patch = status_patch(&status, &[], revision.metadata.resource_version.as_deref())?;
    patch_status(&api, &revision.name_any(), patch, super::FIELD_MANAGER).await?;
    info!(revision = %revision.name_any(), namespace = %nack.namespace, %message, "tainted");
    ctx.metrics.taints.inc();
    let note = Note::warning(RevisionReason::RevisionTainted, message);
    ctx.events.publish(&revision, &note).await;
    Ok(())
}
