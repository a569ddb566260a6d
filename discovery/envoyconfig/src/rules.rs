//! Why an EnvoyConfig is refused, written once for the three places that judge one: the
//! EnvoyConfig controller (before it publishes), the validating webhook (at admission) and
//! `marin3r validate` (offline). Unknown fields, fields of the wrong type, every conversion
//! error with its field path, and what only the discovery service's settings decide: Secrets
//! referenced in another namespace. The revision loader applies the same Secret rule.

use marin3r_webhook::EnvoyConfigValidator;
use serde_json::Value;

use crate::convert::{self, SecretSource};
use marin3r_api::EnvoyConfigSpec;
use marin3r_api::envoy_config::MAX_NACK_THRESHOLD;

/// Reads an EnvoyConfig spec strictly: the spec, and every field the types do not know
/// (`spec.<path>: unknown field ...`), or the first field that does not deserialize.
///
/// The spec types accept unknown fields, as an API server that prunes them does (so a typo in
/// one EnvoyConfig never stops the controller from reading the others); offline and at
/// admission every unknown field is an error, since the API server would silently drop it.
pub fn read_spec(spec: Value) -> Result<(EnvoyConfigSpec, Vec<String>), String> {
    let mut unknown = Vec::new();
    let mut on_unknown = |path: serde_ignored::Path<'_>| unknown.push(field_path(&path));
    let lenient = serde_ignored::Deserializer::new(spec, &mut on_unknown);
    let spec: EnvoyConfigSpec = serde_path_to_error::deserialize(lenient).map_err(|e| {
        // The root's path is "." (a field missing from `spec` itself).
        match e.path().to_string().as_str() {
            "." => format!("spec: {}", e.inner()),
            path => format!("spec.{path}: {}", e.inner()),
        }
    })?;
    let unknown = unknown
        .into_iter()
        .map(|path| format!("spec.{path}: unknown field (the API server would drop it)"))
        .collect();
    Ok((spec, unknown))
}

/// `path` as a field path: `rollout.blastRadius.x`, `resources[2].value` (serde_ignored
/// writes an optional field's value as `?`, which names nothing the user wrote).
fn field_path(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", field_path(parent)),
        Path::Map { parent, key } => match field_path(parent) {
            p if p.is_empty() => key.clone(),
            p => format!("{p}.{key}"),
        },
        Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => field_path(parent),
    }
}

/// Why a spec cannot be published: every problem, each naming its field path.
pub fn problems(spec: &EnvoyConfigSpec, namespace: &str, cross_namespace: bool) -> Vec<String> {
    let mut out: Vec<String> = match convert::validate_config(spec) {
        Ok(_) => Vec::new(),
        Err(errors) => errors.iter().map(ToString::to_string).collect(),
    };
    out.extend(
        convert::secret_sources(&spec.envoy_resources, &spec.resources)
            .iter()
            .filter_map(|source| foreign_secret(source, namespace, cross_namespace)),
    );
    if let Some(n) = spec.nack_threshold
        && !(1..=MAX_NACK_THRESHOLD).contains(&n)
    {
        out.push(format!(
            "spec.nackThreshold: {n} is not from 1 to {MAX_NACK_THRESHOLD}"
        ));
    }
    if let Some(rollout) = &spec.rollout {
        out.extend(marin3r_api::rollout::step_problems(&rollout.steps));
        if let Some(analysis) = &rollout.analysis {
            out.extend(analysis.problems());
        }
    }
    if let Some(n) = spec
        .rollout
        .as_ref()
        .and_then(|r| r.blast_radius.as_ref())
        .and_then(|b| b.max_removed_percent)
        && !(1..=100).contains(&n)
    {
        out.push(format!(
            "spec.rollout.blastRadius.maxRemovedPercent: {n} is not from 1 to 100 (100 \
             never holds a version for what it removes)"
        ));
    }
    out
}

/// The cross-namespace Secret rule: a config in namespace `own` may have Secrets of other
/// namespaces served only when the discovery service allows it (off by default, so that a
/// namespace cannot have another's certificates served). `None` when `source` may be read;
/// otherwise why not, naming the field.
pub fn foreign_secret(source: &SecretSource, own: &str, allowed: bool) -> Option<String> {
    let ns = source
        .namespace
        .as_deref()
        .filter(|ns| *ns != own && !allowed)?;
    Some(format!(
        "{}.namespace: Secret {ns}/{} is in another namespace; only Secrets of namespace {own} \
         may be referenced",
        source.path, source.secret_name
    ))
}

/// Every reason the discovery service would refuse `object`, an EnvoyConfig in `namespace`,
/// each naming its field path; empty when it would serve it.
pub fn envoy_config_problems(
    namespace: &str,
    object: &Value,
    allow_cross_namespace_secrets: bool,
) -> Vec<String> {
    let Some(spec) = object.get("spec").cloned() else {
        return vec!["spec: missing".into()];
    };
    match read_spec(spec) {
        Err(e) => vec![e],
        Ok((spec, mut out)) => {
            out.extend(problems(&spec, namespace, allow_cross_namespace_secrets));
            out
        }
    }
}

/// The validator the discovery service's webhook judges EnvoyConfigs with, warning about
/// what Envoy accepts but will not work ([`crate::warnings`]).
pub fn validator(allow_cross_namespace_secrets: bool) -> EnvoyConfigValidator {
    validator_with(allow_cross_namespace_secrets, None)
}

/// [`validator`], with `judge` (real Envoy) judging what passes our own checks. When Envoy
/// cannot run (a timeout, a missing binary) the config is admitted on our checks alone, with
/// a log line: the NACK and the rollback still protect the fleet, and admission stays up.
pub fn validator_with(
    allow_cross_namespace_secrets: bool,
    judge: Option<crate::judge::EnvoyJudge>,
) -> EnvoyConfigValidator {
    EnvoyConfigValidator::new(move |namespace, object| {
        let problems = envoy_config_problems(namespace, object, allow_cross_namespace_secrets);
        let Some(judge) = judge.as_ref().filter(|_| problems.is_empty()) else {
            return problems;
        };
        let Some((spec, _)) = object.get("spec").cloned().and_then(|s| read_spec(s).ok()) else {
            return problems;
        };
        match judge.judge(&spec) {
            Ok(()) => Vec::new(),
            Err(crate::judge::JudgeError::Refused(refused)) => refused,
            Err(crate::judge::JudgeError::Unavailable(why)) => {
                tracing::warn!(%namespace, %why, "Envoy could not judge an EnvoyConfig; admitted on marin3r's own checks");
                Vec::new()
            }
        }
    })
    .with_warnings(|_, object| envoy_config_warnings(object))
}

/// The warnings of an EnvoyConfig object whose spec reads (see [`crate::warnings`]).
pub fn envoy_config_warnings(object: &Value) -> Vec<String> {
    object
        .get("spec")
        .cloned()
        .and_then(|spec| read_spec(spec).ok())
        .map(|(spec, _)| crate::warnings::warnings(&spec))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use marin3r_api::{EnvoySecretResource, SecretReference};

    fn object(spec: Value) -> Value {
        json!({
            "apiVersion": "marin3r.3scale.net/v1alpha1",
            "kind": "EnvoyConfig",
            "metadata": {"name": "ec", "namespace": "shop"},
            "spec": spec,
        })
    }

    #[test]
    fn secrets_of_other_namespaces_are_refused_as_the_controller_refuses_them() {
        let obj = object(json!({"nodeID": "proxy", "envoyResources": {"secrets": [
            {"name": "cert", "ref": {"name": "cert", "namespace": "elsewhere"}},
        ]}}));
        assert_eq!(
            envoy_config_problems("shop", &obj, false),
            [
                "spec.envoyResources.secrets[0].ref.namespace: Secret elsewhere/cert is in another \
              namespace; only Secrets of namespace shop may be referenced"
            ]
        );
        assert_eq!(
            envoy_config_problems("shop", &obj, true),
            Vec::<String>::new()
        );
        assert_eq!(
            validator(false).problems("elsewhere", &obj),
            Vec::<String>::new()
        );
    }

    #[test]
    fn cross_namespace_secrets_are_refused_unless_allowed() {
        let mut spec = EnvoyConfigSpec {
            node_id: "n".into(),
            ..Default::default()
        };
        spec.envoy_resources.secrets.push(EnvoySecretResource {
            name: "cert".into(),
            secret_ref: Some(SecretReference {
                name: "s".into(),
                namespace: Some("other".into()),
            }),
        });
        let p = problems(&spec, "mine", false);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(
            p[0].starts_with("spec.envoyResources.secrets[0].ref.namespace:"),
            "{p:?}"
        );
        assert!(problems(&spec, "mine", true).is_empty());
        spec.envoy_resources.secrets[0]
            .secret_ref
            .as_mut()
            .unwrap()
            .namespace = Some("mine".into());
        assert!(problems(&spec, "mine", false).is_empty());
    }

    #[test]
    fn a_nack_threshold_is_from_1_to_10() {
        for (n, ok) in [
            (0u8, false),
            (1, true),
            (10, true),
            (11, false),
            (255, false),
        ] {
            let obj = object(json!({"nodeID": "proxy", "nackThreshold": n}));
            let p = envoy_config_problems("shop", &obj, false);
            assert_eq!(p.is_empty(), ok, "{n}: {p:?}");
            if !ok {
                assert_eq!(p, [format!("spec.nackThreshold: {n} is not from 1 to 10")]);
            }
        }
        let p = envoy_config_problems(
            "shop",
            &object(json!({"nodeID": "p", "nackThreshold": 300})),
            false,
        );
        assert!(p[0].starts_with("spec.nackThreshold: "), "{p:?}");
        let p = envoy_config_problems(
            "shop",
            &object(json!({"nodeID": "p", "nackThreshold": -1})),
            false,
        );
        assert!(p[0].starts_with("spec.nackThreshold: "), "{p:?}");
    }

    #[test]
    fn a_rollout_strategy_is_read_strictly_and_its_share_is_from_1_to_100() {
        let ok = object(json!({"nodeID": "p", "rollout": {}}));
        assert!(envoy_config_problems("shop", &ok, false).is_empty());
        let ok = object(json!({"nodeID": "p", "rollout": {"blastRadius": {
            "maxRemovedPercent": 100, "holdEmptiedListeners": false}}}));
        assert!(envoy_config_problems("shop", &ok, false).is_empty());
        let zero =
            object(json!({"nodeID": "p", "rollout": {"blastRadius": {"maxRemovedPercent": 0}}}));
        let p = envoy_config_problems("shop", &zero, false);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(
            p[0].starts_with("spec.rollout.blastRadius.maxRemovedPercent: 0 is not from 1 to 100"),
            "{p:?}"
        );
        let typo = object(json!({"nodeID": "p", "rollout": {"blastRadious": {}}}));
        let p = envoy_config_problems("shop", &typo, false);
        assert!(
            p.iter()
                .any(|p| p.starts_with("spec.rollout.blastRadious: unknown field")),
            "{p:?}"
        );
        let steps = object(json!({"nodeID": "p", "rollout": {"steps": [
            {"proxies": 1, "bake": "30s"}, {"percent": 50}, {"percent": 0},
            {"proxies": 1, "percent": 5}, {}, {"percent": 5, "bake": "25h"},
            {"percent": 5, "bake": "soon"}, {"proxies": 0}
        ]}}));
        let p = envoy_config_problems("shop", &steps, false);
        assert_eq!(
            p,
            [
                "spec.rollout.steps[2].percent: 0 is not from 1 to 100",
                "spec.rollout.steps[3]: name either proxies or percent",
                "spec.rollout.steps[4]: name either proxies or percent",
                "spec.rollout.steps[5].bake: \"25h\" is longer than 24h",
                "spec.rollout.steps[6].bake: invalid duration \"soon\": \"soon\" does not start with a number",
                "spec.rollout.steps[7].proxies: must be at least 1",
            ]
        );
        let many: Vec<_> = (0..11).map(|_| json!({"percent": 10})).collect();
        let many = object(json!({"nodeID": "p", "rollout": {"steps": many}}));
        assert_eq!(
            envoy_config_problems("shop", &many, false),
            ["spec.rollout.steps: 11 steps; at most 10"]
        );
        let big =
            object(json!({"nodeID": "p", "rollout": {"blastRadius": {"maxRemovedPercent": 101}}}));
        assert_eq!(envoy_config_problems("shop", &big, false).len(), 1);
        let analysis = object(
            json!({"nodeID": "p", "rollout": {"steps": [{"percent": 10}],
            "analysis": {"minRequests": 0, "max5xxPercentagePoints": 101,
                "maxUpstreamFailurePercentagePoints": 100, "minRequestRatePercent": 0}}}),
        );
        assert_eq!(
            envoy_config_problems("shop", &analysis, false),
            [
                "spec.rollout.analysis.minRequests: must be at least 1",
                "spec.rollout.analysis.max5xxPercentagePoints: 101 is not from 0 to 100",
            ]
        );
        let typo = object(json!({"nodeID": "p", "rollout": {"analysis": {"max5xxPercent": 1}}}));
        let p = envoy_config_problems("shop", &typo, false);
        assert!(
            p.iter()
                .any(|p| p.starts_with("spec.rollout.analysis.max5xxPercent: unknown field")),
            "{p:?}"
        );
    }

    /// The webhook warns with the same words `marin3r validate` prints.
    #[test]
    fn admission_warns_about_references_the_config_does_not_define() {
        let obj = object(json!({"nodeID": "proxy", "resources": [
            {"type": "route", "value": {"name": "r", "virtual_hosts": [{"name": "v", "domains": ["*"], "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "nowhere"}}]}]}},
        ]}));
        let v = validator(false);
        assert!(v.problems("shop", &obj).is_empty());
        let warnings = v.warnings("shop", &obj);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].starts_with("spec.resources[0].value: virtual_hosts[0].routes[0].route.cluster: no cluster named \"nowhere\""),
            "{warnings:?}"
        );
    }
}
