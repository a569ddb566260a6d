//! The `scale` subresource of Deployments (`autoscaling/v1` Scale), as kubectl scale and a
//! HorizontalPodAutoscaler's controller use it: reading it shows the Deployment's desired
//! and current replicas and its selector; writing it (PUT, or a merge, strategic or JSON
//! patch) changes only `spec.replicas`, through the same admitted write as any update.

use axum::http::header;
use axum::response::Response;
use serde_json::{Value, json};

use super::super::error::ApiError;
use super::super::patch::{self, PatchKind};
use super::super::store::{Target, WriteMode};
use super::{Method, Request, ok};

/// Whether `scale` is served for this resource.
pub(super) fn serves_scale(info: &super::ResourceInfo) -> bool {
    info.group == "apps" && info.plural == "deployments"
}

/// The Scale of a stored Deployment.
fn scale_of(deployment: &Value) -> Value {
    let meta = &deployment["metadata"];
    let selector = deployment
        .pointer("/spec/selector/matchLabels")
        .and_then(Value::as_object)
        .map(|labels| {
            labels
                .iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
            "resourceVersion": meta["resourceVersion"],
            "creationTimestamp": meta["creationTimestamp"],
        },
        "spec": {"replicas": deployment.pointer("/spec/replicas").cloned().unwrap_or(json!(1))},
        "status": {
            "replicas": deployment.pointer("/status/replicas").cloned().unwrap_or(json!(0)),
            "selector": selector,
        },
    })
}

/// The replicas a written Scale asks for: a whole number of at least 0.
fn desired_replicas(scale: &Value) -> Result<i64, String> {
    match scale.pointer("/spec/replicas") {
        None | Some(Value::Null) => Ok(0),
        Some(v) => match v.as_i64() {
            Some(n) if (0..=i64::from(i32::MAX)).contains(&n) => Ok(n),
            Some(n) => Err(format!(
                "spec.replicas: Invalid value: {n}: must be greater than or equal to 0"
            )),
            None => Err(format!(
                "spec.replicas: Invalid value: {v}: must be an integer"
            )),
        },
    }
}

impl Request<'_> {
    pub(super) async fn scale(&self, name: &str, method: &Method) -> Result<Response, ApiError> {
        let store = &self.state.store;
        let current = store.get(&self.info, self.namespace(), name)?;
        let wanted = match *method {
            Method::GET => return Ok(ok(&scale_of(&current))),
            Method::PUT => self.body_object()?,
            Method::PATCH => {
                let ct = self
                    .headers
                    .get(header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("");
                let kind = PatchKind::from_content_type(ct)
                    .filter(|k| *k != PatchKind::Apply)
                    .ok_or_else(|| ApiError::unsupported_media_type(ct))?;
                patch::apply(kind, &scale_of(&current), &self.body)
                    .map_err(|e| ApiError::invalid(&self.info, name, e))?
            }
            _ => {
                return Err(ApiError::method_not_allowed(format!(
                    "{method} is not supported on {}/scale",
                    self.info.qualified()
                )));
            }
        };
        let replicas =
            desired_replicas(&wanted).map_err(|e| ApiError::invalid(&self.info, name, e))?;
        let precondition = wanted
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .filter(|rv| !rv.is_empty())
            .map(str::to_owned);
        let info = self.info.clone();
        let updated = self
            .modify_admitted(
                name,
                WriteMode {
                    target: Target::Main,
                    apply: false,
                    dry_run: self.dry_run(),
                },
                |stored| {
                    let mut d = stored.cloned().unwrap_or_else(|| json!({}));
                    let stored_rv = d.pointer("/metadata/resourceVersion").cloned();
                    if let Some(rv) = &precondition
                        && stored_rv.as_ref().and_then(Value::as_str) != Some(rv.as_str())
                    {
                        return Err(ApiError::conflict(
                            &info,
                            name,
                            "the object has been modified; please apply your changes to the latest version and try again",
                        ));
                    }
                    d["spec"]["replicas"] = json!(replicas);
                    Ok(d)
                },
            )
            .await?;
        Ok(ok(&scale_of(&updated)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scale_shows_the_desired_and_current_replicas_and_the_selector() {
        let d = json!({
            "metadata": {"name": "web", "namespace": "a", "uid": "u", "resourceVersion": "7"},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web", "tier": "edge"}}},
            "status": {"replicas": 2},
        });
        let s = scale_of(&d);
        assert_eq!(s["spec"]["replicas"], 3);
        assert_eq!(
            s["status"],
            json!({"replicas": 2, "selector": "app=web,tier=edge"})
        );
        assert_eq!(s["metadata"]["resourceVersion"], "7");
        assert_eq!(desired_replicas(&json!({"spec": {"replicas": 5}})), Ok(5));
        assert!(desired_replicas(&json!({"spec": {"replicas": -1}})).is_err());
        assert!(desired_replicas(&json!({"spec": {"replicas": "x"}})).is_err());
    }
}
