//! Secrets this controller wrote that someone marked `immutable: true`: no change can be
//! written into them (a CA rotation's `ca.crt`, a reissue), which would hold a CA rotation,
//! or a renewal, until the certificate expires. Such a Secret is deleted and created again
//! with the change; one the controller did not write is left alone (the write fails).

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{DeleteParams, ObjectMeta, PostParams, Preconditions};
use kube::{Api, ResourceExt};
use tracing::warn;

use super::bundle::SecretUpdate;
use super::written_for;
use crate::api::DiscoveryServiceCertificate;
use marin3r_controller::Error;

/// Whether a write failed because the Secret is immutable (the API server answers 422).
pub fn refused_as_immutable(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(e) if e.code == 422 && e.message.contains("immutable"))
}

/// Deletes the Secret `name` if it is immutable and `dsc` wrote it (and it is still the one
/// read: a precondition on its uid and version); returns what it held.
pub async fn unfreeze(
    secrets: &Api<Secret>,
    name: &str,
    dsc: &DiscoveryServiceCertificate,
) -> Result<Option<Secret>, Error> {
    let Some(secret) = secrets.get_opt(name).await? else {
        return Ok(None);
    };
    if secret.immutable != Some(true) || !written_for(&secret, dsc) {
        return Ok(None);
    }
    let preconditions = Preconditions {
        uid: secret.uid(),
        resource_version: secret.resource_version(),
    };
    let params = DeleteParams {
        preconditions: Some(preconditions),
        ..DeleteParams::default()
    };
    secrets.delete(name, &params).await?;
    warn!(secret = %name, namespace = ?secret.namespace(), certificate = %dsc.name_any(), "the certificate's Secret was made immutable; deleted to be written again");
    Ok(Some(secret))
}

/// Creates again the Secret `old` held, with `update`, and mutable.
pub async fn recreate(
    secrets: &Api<Secret>,
    old: &Secret,
    update: &SecretUpdate,
) -> Result<(), Error> {
    secrets
        .create(&PostParams::default(), &recreated(old, update))
        .await?;
    Ok(())
}

/// `old` with `update` applied, `immutable` unset, and no server-set metadata.
pub fn recreated(old: &Secret, update: &SecretUpdate) -> Secret {
    let mut data = old.data.clone().unwrap_or_default();
    for (key, value) in &update.data {
        match value {
            Some(v) => data.insert(key.clone(), ByteString(v.as_bytes().to_vec())),
            None => data.remove(key),
        };
    }
    let mut annotations = old.metadata.annotations.clone().unwrap_or_default();
    for (key, value) in &update.annotations {
        match value {
            Some(v) => annotations.insert(key.clone(), v.clone()),
            None => annotations.remove(key),
        };
    }
    Secret {
        metadata: ObjectMeta {
            name: old.metadata.name.clone(),
            namespace: old.metadata.namespace.clone(),
            labels: old.metadata.labels.clone(),
            annotations: Some(annotations).filter(|a| !a.is_empty()),
            owner_references: old.metadata.owner_references.clone(),
            ..ObjectMeta::default()
        },
        type_: old.type_.clone(),
        data: Some(data),
        immutable: None,
        ..Secret::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_update(key: &str, value: Option<&str>) -> SecretUpdate {
        SecretUpdate {
            data: [(key.to_owned(), value.map(str::to_owned))].into(),
            annotations: Default::default(),
        }
    }

    #[test]
    fn a_recreated_secret_takes_the_change_and_is_mutable() {
        let mut old = Secret::default();
        old.metadata.name = Some("client".into());
        old.metadata.uid = Some("u1".into());
        old.metadata.resource_version = Some("7".into());
        old.immutable = Some(true);
        old.type_ = Some("kubernetes.io/tls".into());
        old.data = Some(
            [
                ("ca.crt".to_owned(), ByteString(b"old".to_vec())),
                ("tls.crt".to_owned(), ByteString(b"cert".to_vec())),
            ]
            .into(),
        );
        let new = recreated(&old, &mk_update("ca.crt", Some("bundle")));
        assert_eq!(new.immutable, None);
        assert_eq!(
            (new.metadata.uid, new.metadata.resource_version),
            (None, None)
        );
        let data = new.data.unwrap();
        assert_eq!(data["ca.crt"].0, b"bundle");
        assert_eq!(data["tls.crt"].0, b"cert");
        assert_eq!(new.type_.as_deref(), Some("kubernetes.io/tls"));
    }

    #[test]
    fn only_an_immutability_refusal_counts() {
        let api = |code: u16, message: &str| {
            kube::Error::Api(
                kube::core::Status::failure(message, "Invalid")
                    .with_code(code)
                    .boxed(),
            )
        };
        let msg =
            "Secret \"c\" is invalid: data: Forbidden: field is immutable when `immutable` is set";
        assert!(refused_as_immutable(&api(422, msg)));
        assert!(!refused_as_immutable(&api(422, "data: Invalid value")));
        assert!(!refused_as_immutable(&api(409, msg)));
    }
}
