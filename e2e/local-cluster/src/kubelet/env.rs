//! A container's environment and argv as the kubelet computes them: `env` values, the
//! downward API, Secret and ConfigMap keys, `envFrom`, and `$(VAR)` expansion in env values,
//! `command` and `args` (`$$` escapes a `$`; unknown references stay as written).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, EnvVarSource, Pod};

use super::Objects;
use super::images::ImageBinary;

/// Expands `$(NAME)` references with `lookup`, exactly as Kubernetes does.
pub fn expand(input: &str, lookup: &dyn Fn(&str) -> Option<String>) -> String {
    let bytes = input.as_bytes();
    let mut out = String::with_capacity(input.len());
    let mut checkpoint = 0;
    let mut cursor = 0;
    while cursor < bytes.len() {
        if bytes[cursor] == b'$' && cursor + 1 < bytes.len() {
            out.push_str(&input[checkpoint..cursor]);
            let rest = &input[cursor + 1..];
            let advance = match rest.as_bytes()[0] {
                b'$' => {
                    out.push('$');
                    1
                }
                b'(' => match rest.find(')') {
                    Some(close) => {
                        let name = &rest[1..close];
                        match lookup(name) {
                            Some(value) => out.push_str(&value),
                            None => out.push_str(&format!("$({name})")),
                        }
                        close + 1
                    }
                    None => {
                        out.push_str("$(");
                        1
                    }
                },
                _ => {
                    // `$x`: both characters kept. `x` may be multi-byte.
                    let ch = rest.chars().next().map_or(1, char::len_utf8);
                    out.push('$');
                    out.push_str(&rest[..ch]);
                    ch
                }
            };
            cursor += advance + 1;
            checkpoint = cursor;
        } else {
            cursor += 1;
        }
    }
    out.push_str(&input[checkpoint.min(input.len())..]);
    out
}

/// Where the pod runs, as the downward API reports it.
#[derive(Clone, Copy, Debug)]
pub struct Placement<'a> {
    pub pod_ip: &'a str,
    pub host_ip: &'a str,
    pub node_name: &'a str,
}

/// Why a container cannot be configured (the kubelet's `CreateContainerConfigError`).
pub type ConfigError = String;

/// The container's environment in Kubernetes order (`envFrom` first, then `env`), with
/// `$(VAR)` references in `env` values expanded against what precedes them.
pub fn container_env(
    pod: &Pod,
    container: &Container,
    at: &Placement<'_>,
    objects: &dyn Objects,
) -> Result<Vec<(String, String)>, ConfigError> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    let mut set = |env: &mut BTreeMap<String, String>, k: String, v: String| {
        if !order.contains(&k) {
            order.push(k.clone());
        }
        env.insert(k, v);
    };
    for from in container.env_from.iter().flatten() {
        let prefix = from.prefix.clone().unwrap_or_default();
        if let Some(r) = &from.config_map_ref {
            match objects.config_map(namespace, &r.name) {
                Some(cm) => {
                    for (k, v) in cm.data.unwrap_or_default() {
                        set(&mut env, format!("{prefix}{k}"), v);
                    }
                }
                None if r.optional == Some(true) => {}
                None => return Err(format!("configmap {:?} not found", r.name)),
            }
        }
        if let Some(r) = &from.secret_ref {
            match objects.secret(namespace, &r.name) {
                Some(s) => {
                    for (k, v) in s.data.unwrap_or_default() {
                        set(&mut env, format!("{prefix}{k}"), bytes_to_string(&v.0));
                    }
                    for (k, v) in s.string_data.unwrap_or_default() {
                        set(&mut env, format!("{prefix}{k}"), v);
                    }
                }
                None if r.optional == Some(true) => {}
                None => return Err(format!("secret {:?} not found", r.name)),
            }
        }
    }
    for var in container.env.iter().flatten() {
        let value = match (&var.value, &var.value_from) {
            (Some(value), _) => {
                let lookup = |name: &str| env.get(name).cloned();
                expand(value, &lookup)
            }
            (None, Some(source)) => match value_from(pod, container, source, at, objects)? {
                Some(v) => v,
                None => continue,
            },
            (None, None) => String::new(),
        };
        set(&mut env, var.name.clone(), value);
    }
    Ok(order
        .into_iter()
        .filter_map(|k| env.remove(&k).map(|v| (k, v)))
        .collect())
}

fn bytes_to_string(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// One `valueFrom`; `None` when an optional source is missing (the variable is left unset).
fn value_from(
    pod: &Pod,
    container: &Container,
    source: &EnvVarSource,
    at: &Placement<'_>,
    objects: &dyn Objects,
) -> Result<Option<String>, ConfigError> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    if let Some(field) = &source.field_ref {
        return field_value(pod, &field.field_path, at).map(Some);
    }
    if let Some(sel) = &source.secret_key_ref {
        let optional = sel.optional == Some(true);
        let Some(secret) = objects.secret(namespace, &sel.name) else {
            return if optional {
                Ok(None)
            } else {
                Err(format!("secret {:?} not found", sel.name))
            };
        };
        let value = secret
            .data
            .as_ref()
            .and_then(|d| d.get(&sel.key))
            .map(|b| bytes_to_string(&b.0))
            .or_else(|| {
                secret
                    .string_data
                    .as_ref()
                    .and_then(|d| d.get(&sel.key))
                    .cloned()
            });
        return match value {
            Some(v) => Ok(Some(v)),
            None if optional => Ok(None),
            None => Err(format!(
                "couldn't find key {} in Secret {namespace}/{}",
                sel.key, sel.name
            )),
        };
    }
    if let Some(sel) = &source.config_map_key_ref {
        let optional = sel.optional == Some(true);
        let Some(cm) = objects.config_map(namespace, &sel.name) else {
            return if optional {
                Ok(None)
            } else {
                Err(format!("configmap {:?} not found", sel.name))
            };
        };
        return match cm.data.as_ref().and_then(|d| d.get(&sel.key)) {
            Some(v) => Ok(Some(v.clone())),
            None if optional => Ok(None),
            None => Err(format!(
                "couldn't find key {} in ConfigMap {namespace}/{}",
                sel.key, sel.name
            )),
        };
    }
    Err(format!(
        "container {:?}: this valueFrom source is not supported by the local cluster",
        container.name
    ))
}

/// The downward API's `fieldRef` paths.
pub fn field_value(pod: &Pod, path: &str, at: &Placement<'_>) -> Result<String, ConfigError> {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    let indexed = |prefix: &str, map: Option<&BTreeMap<String, String>>| {
        let key = path.strip_prefix(prefix)?.strip_suffix("']")?;
        Some(map.and_then(|m| m.get(key)).cloned().unwrap_or_default())
    };
    let value = match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_else(|| "default".into()),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "status.podIP" | "status.podIPs" => at.pod_ip.to_owned(),
        "status.hostIP" | "status.hostIPs" => at.host_ip.to_owned(),
        "spec.nodeName" => spec
            .and_then(|s| s.node_name.clone())
            .unwrap_or_else(|| at.node_name.to_owned()),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_else(|| "default".into()),
        _ => indexed("metadata.labels['", meta.labels.as_ref())
            .or_else(|| indexed("metadata.annotations['", meta.annotations.as_ref()))
            .ok_or_else(|| format!("fieldRef {path:?} is not supported"))?,
    };
    Ok(value)
}

/// The argv a container runs: `command` replaces the image's entrypoint, `args` its default
/// arguments, and both are `$(VAR)`-expanded. A `command[0]` naming the image's binary (by
/// file name) runs the mapped binary; any other command runs as given on this host.
/// Whether `cmd` (a path inside the image, or a bare name) names the image's own binary,
/// which the local cluster runs from the host.
pub fn is_image_binary(cmd: &str, image: &ImageBinary) -> bool {
    let name = |p: &str| p.rsplit('/').next().unwrap_or(p).to_owned();
    let binary = image.path.to_string_lossy();
    name(cmd) == name(&binary)
        || (image.envoy_entrypoint && name(cmd) == "envoy")
        || name(cmd) == "marin3r" && name(&binary).starts_with("marin3r")
}

/// An exec handler's command (a probe's or a hook's) as it runs here: the image's binary,
/// named by its path in the image, is the host binary the image maps to.
pub fn exec_command(command: &[String], image: &ImageBinary) -> Vec<String> {
    let mut command = command.to_vec();
    if let Some(first) = command.first_mut().filter(|f| is_image_binary(f, image)) {
        *first = image.path.to_string_lossy().into_owned();
    }
    command
}

pub fn argv(container: &Container, image: &ImageBinary, env: &[(String, String)]) -> Vec<String> {
    let map: BTreeMap<&str, &str> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let lookup = |name: &str| map.get(name).map(|v| (*v).to_owned());
    let expand_all =
        |items: &[String]| -> Vec<String> { items.iter().map(|s| expand(s, &lookup)).collect() };
    let command = expand_all(container.command.as_deref().unwrap_or_default());
    let args = expand_all(container.args.as_deref().unwrap_or_default());
    let binary = image.path.to_string_lossy().into_owned();
    let is_image_binary = |cmd: &str| is_image_binary(cmd, image);
    let mut argv = if let Some((first, rest)) = command.split_first() {
        let first = if is_image_binary(first) {
            binary.clone()
        } else {
            first.clone()
        };
        let mut v = vec![first];
        v.extend(rest.iter().cloned());
        v.extend(args);
        v
    } else if args.is_empty() {
        let mut v = vec![binary.clone()];
        v.extend(image.default_args.iter().cloned());
        v
    } else if image.envoy_entrypoint && !args[0].starts_with('-') {
        // Envoy's image entrypoint runs args that do not start with `-` as a command.
        args
    } else {
        let mut v = vec![binary.clone()];
        v.extend(args);
        v
    };
    if let Some(first) = argv.first_mut().filter(|f| is_image_binary(f)) {
        *first = image.path.to_string_lossy().into_owned();
    }
    argv
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::{
        ConfigMap, ConfigMapKeySelector, EnvVar, ObjectFieldSelector, Secret, SecretKeySelector,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect();
        move |n| map.get(n).cloned()
    }

    #[test]
    fn expansion_follows_kubernetes() {
        let lookup = vars(&[("A", "x"), ("B", "y")]);
        let cases = [
            ("$(A)", "x"),
            ("$(A)$(B)", "xy"),
            ("pre-$(A)-post", "pre-x-post"),
            ("$$(A)", "$(A)"),
            ("$$$(A)", "$x"),
            ("$(C)", "$(C)"),
            ("$(A", "$(A"),
            ("$A", "$A"),
            ("a$", "a$"),
            ("$$", "$"),
            ("$", "$"),
            ("$é$(A)", "$éx"),
            ("", ""),
        ];
        for (input, want) in cases {
            assert_eq!(expand(input, &lookup), want, "{input}");
        }
    }

    const AT: Placement<'static> = Placement {
        pod_ip: "10.200.0.2",
        host_ip: "10.200.0.1",
        node_name: "local",
    };

    fn pod() -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("p1".into()),
                namespace: Some("ns1".into()),
                labels: Some([("app".to_owned(), "web".to_owned())].into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn env_var(name: &str, value: Option<&str>, from: Option<EnvVarSource>) -> EnvVar {
        EnvVar {
            name: name.into(),
            value: value.map(Into::into),
            value_from: from,
        }
    }

    fn field(path: &str) -> Option<EnvVarSource> {
        Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    fn objects() -> super::super::StaticObjects {
        let o = super::super::StaticObjects::default();
        o.put_secret(Secret {
            metadata: ObjectMeta {
                name: Some("s".into()),
                namespace: Some("ns1".into()),
                ..Default::default()
            },
            data: Some([("k".to_owned(), ByteString(b"secret-value".to_vec()))].into()),
            ..Default::default()
        });
        o.put_config_map(ConfigMap {
            metadata: ObjectMeta {
                name: Some("c".into()),
                namespace: Some("ns1".into()),
                ..Default::default()
            },
            data: Some([("k".to_owned(), "cm-value".to_owned())].into()),
            ..Default::default()
        });
        o
    }

    #[test]
    fn env_comes_from_values_the_downward_api_secrets_and_config_maps() {
        let container = Container {
            name: "c".into(),
            env: Some(vec![
                env_var("NAME", None, field("metadata.name")),
                env_var("NS", None, field("metadata.namespace")),
                env_var("IP", None, field("status.podIP")),
                env_var("HOST", None, field("status.hostIP")),
                env_var("APP", None, field("metadata.labels['app']")),
                env_var("GREETING", Some("$(NAME).$(NS) $(LATER) $$(NAME)"), None),
                env_var(
                    "S",
                    None,
                    Some(EnvVarSource {
                        secret_key_ref: Some(SecretKeySelector {
                            name: "s".into(),
                            key: "k".into(),
                            optional: None,
                        }),
                        ..Default::default()
                    }),
                ),
                env_var(
                    "C",
                    None,
                    Some(EnvVarSource {
                        config_map_key_ref: Some(ConfigMapKeySelector {
                            name: "c".into(),
                            key: "k".into(),
                            optional: None,
                        }),
                        ..Default::default()
                    }),
                ),
                env_var("LATER", Some("l"), None),
            ]),
            ..Default::default()
        };
        let env = container_env(&pod(), &container, &AT, &objects()).unwrap();
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("NAME"), Some("p1"));
        assert_eq!(get("NS"), Some("ns1"));
        assert_eq!(get("IP"), Some("10.200.0.2"));
        assert_eq!(get("HOST"), Some("10.200.0.1"));
        assert_eq!(get("APP"), Some("web"));
        assert_eq!(get("GREETING"), Some("p1.ns1 $(LATER) $(NAME)"));
        assert_eq!(get("S"), Some("secret-value"));
        assert_eq!(get("C"), Some("cm-value"));
    }

    #[test]
    fn missing_sources_are_config_errors_unless_optional() {
        let missing = |optional| Container {
            name: "c".into(),
            env: Some(vec![env_var(
                "S",
                None,
                Some(EnvVarSource {
                    secret_key_ref: Some(SecretKeySelector {
                        name: "nope".into(),
                        key: "k".into(),
                        optional,
                    }),
                    ..Default::default()
                }),
            )]),
            ..Default::default()
        };
        let err = container_env(&pod(), &missing(None), &AT, &objects()).unwrap_err();
        assert!(err.contains("\"nope\""), "{err}");
        let env = container_env(&pod(), &missing(Some(true)), &AT, &objects()).unwrap();
        assert!(env.is_empty());
        let bad_field = Container {
            name: "c".into(),
            env: Some(vec![env_var("X", None, field("spec.bogus"))]),
            ..Default::default()
        };
        let err = container_env(&pod(), &bad_field, &AT, &objects()).unwrap_err();
        assert!(err.contains("spec.bogus"), "{err}");
    }

    fn image(envoy: bool) -> ImageBinary {
        ImageBinary {
            path: if envoy { "/t/envoy" } else { "/t/marin3r" }.into(),
            default_args: if envoy {
                vec!["-c".into(), "/etc/envoy/envoy.yaml".into()]
            } else {
                vec![]
            },
            envoy_entrypoint: envoy,
            user: 0,
            files: Vec::new(),
        }
    }

    fn container(command: &[&str], args: &[&str]) -> Container {
        let list =
            |v: &[&str]| (!v.is_empty()).then(|| v.iter().map(|s| (*s).to_owned()).collect());
        Container {
            name: "c".into(),
            command: list(command),
            args: list(args),
            ..Default::default()
        }
    }

    #[test]
    fn argv_applies_command_and_args_like_kubernetes() {
        let env = vec![("PORT".to_owned(), "8080".to_owned())];
        type Case<'a> = (&'a [&'a str], &'a [&'a str], bool, &'a [&'a str]);
        let cases: [Case; 6] = [
            (&[], &[], true, &["/t/envoy", "-c", "/etc/envoy/envoy.yaml"]),
            (
                &[],
                &["-c", "/b.json"],
                true,
                &["/t/envoy", "-c", "/b.json"],
            ),
            (&["envoy"], &["-c", "x"], true, &["/t/envoy", "-c", "x"]),
            (
                &[],
                &["envoy", "-l", "debug"],
                true,
                &["/t/envoy", "-l", "debug"],
            ),
            (
                &[],
                &["serve", "--port=$(PORT)", "$$(PORT)"],
                false,
                &["/t/marin3r", "serve", "--port=8080", "$(PORT)"],
            ),
            (
                &["/bin/sh", "-c"],
                &["echo $(PORT)"],
                false,
                &["/bin/sh", "-c", "echo 8080"],
            ),
        ];
        for (command, args, envoy, want) in cases {
            assert_eq!(
                argv(&container(command, args), &image(envoy), &env),
                want,
                "{command:?} {args:?}"
            );
        }
    }
}
