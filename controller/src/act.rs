//! Writing what a plan decided: server-side apply of children, deletes that tolerate a
//! missing object, and status patches.

use std::fmt::Debug;

use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Creates or updates `obj` with server-side apply, forcing `field_manager`'s ownership; a
/// no-op write changes nothing.
pub async fn apply<K, E>(api: &Api<K>, obj: &K, field_manager: &str) -> Result<K, E>
where
    K: Resource<DynamicType = ()> + Serialize + DeserializeOwned + Clone + Debug,
    E: From<kube::Error> + From<serde_json::Error>,
{
    let mut value = serde_json::to_value(obj)?;
    value["apiVersion"] = K::api_version(&()).into();
    value["kind"] = K::kind(&()).into();
    let params = PatchParams::apply(field_manager).force();
    Ok(api
        .patch(&obj.name_any(), &params, &Patch::Apply(value))
        .await?)
}

/// Deletes `name`; returns whether it existed.
pub async fn delete_ignoring_missing<K>(api: &Api<K>, name: &str) -> Result<bool, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

/// A status as a merge patch that also removes the optional fields it leaves unset (a plain
/// merge patch of a struct with skipped `None`s would keep their old values). With
/// `resource_version`, the patch carries the version it was computed from: where several
/// writers share an object's conditions, and a list in a merge patch replaces the whole list,
/// a write based on a stale read must fail with a conflict and be redone.
pub fn status_patch<S: Serialize>(
    status: &S,
    optional: &[&str],
    resource_version: Option<&str>,
) -> Result<serde_json::Value, serde_json::Error> {
    let mut value = serde_json::to_value(status)?;
    if let Some(map) = value.as_object_mut() {
        for key in optional {
            map.entry(*key).or_insert(serde_json::Value::Null);
        }
    }
    let mut patch = serde_json::json!({ "status": value });
    if let Some(rv) = resource_version {
        patch["metadata"] = serde_json::json!({ "resourceVersion": rv });
    }
    Ok(patch)
}

/// Writes `patch` (see [`status_patch`]) to the status subresource of `name`.
pub async fn patch_status<K>(
    api: &Api<K>,
    name: &str,
    patch: serde_json::Value,
    field_manager: &str,
) -> Result<(), kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let params = PatchParams {
        field_manager: Some(field_manager.into()),
        ..Default::default()
    };
    api.patch_status(name, &params, &Patch::Merge(patch))
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Status {
        #[serde(skip_serializing_if = "Option::is_none")]
        a: Option<u8>,
        b: u8,
    }

    #[test]
    fn unset_optional_fields_are_removed_and_the_version_is_carried() {
        let patch = status_patch(&Status { a: None, b: 1 }, &["a"], Some("7")).unwrap();
        assert_eq!(
            patch,
            serde_json::json!({ "status": { "a": null, "b": 1 }, "metadata": { "resourceVersion": "7" } })
        );
        let patch = status_patch(&Status { a: Some(2), b: 1 }, &["a"], None).unwrap();
        assert_eq!(patch, serde_json::json!({ "status": { "a": 2, "b": 1 } }));
    }
}
