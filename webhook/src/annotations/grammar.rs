//! The grammar of annotation values: each checker takes one value and says what is wrong with
//! it, in words the user reads after the annotation's name. No checker looks at another
//! annotation; the checks across annotations live with the parser (`mod.rs`).

use std::collections::HashSet;
use std::net::IpAddr;

use super::names::{
    SHUTDOWN_MANAGER_DRAIN_STRATEGY, SHUTDOWN_MANAGER_DRAIN_TIME, SHUTDOWN_MANAGER_ENABLED,
};
use super::{DrainStrategy, PortSpec, Protocol};

/// Arguments the sidecar's command line already sets; `envoy-extra-args` may not repeat them
/// (Envoy refuses a flag given twice, and a second bootstrap would silently win).
const RESERVED_ARGS: [&str; 5] = [
    "-c",
    "--config-path",
    "--service-node",
    "--service-cluster",
    "--config-yaml",
];

/// Envoy flags the sidecar sets when the shutdown manager is enabled (from its annotations).
const DRAIN_ARGS: [(&str, &str); 2] = [
    ("--drain-time-s", SHUTDOWN_MANAGER_DRAIN_TIME),
    ("--drain-strategy", SHUTDOWN_MANAGER_DRAIN_STRATEGY),
];

/// The longest drain Kubernetes can wait for: the pod's terminationGracePeriodSeconds is the
/// drain time plus a margin, and stays well inside what the API server accepts.
pub const MAX_DRAIN_TIME: u32 = 7 * 24 * 3600;

pub(super) fn parse_drain_time(value: &str) -> Result<u32, String> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err("must be a whole number of seconds".into());
    }
    match value.parse::<u32>() {
        Ok(t) if t <= MAX_DRAIN_TIME => Ok(t),
        _ => Err(format!("must be at most {MAX_DRAIN_TIME} seconds (7 days)")),
    }
}

/// `gradual` or `immediate`, in any case.
pub(super) fn parse_drain_strategy(value: &str) -> Result<DrainStrategy, String> {
    match value.to_ascii_lowercase().as_str() {
        "gradual" => Ok(DrainStrategy::Gradual),
        "immediate" => Ok(DrainStrategy::Immediate),
        _ => Err("must be gradual or immediate".into()),
    }
}

/// Container names, comma separated, each kept once in the order given. The error names the
/// first bad one.
pub(super) fn parse_container_names(value: &str) -> Result<Vec<String>, String> {
    let mut names: Vec<String> = Vec::new();
    for name in value.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        dns_label(name).map_err(|e| format!("container name {name:?} {e}"))?;
        if !names.iter().any(|n| n == name) {
            names.push(name.to_owned());
        }
    }
    Ok(names)
}

/// Only `v3` exists in today's Envoy; `v2` gets its own reason.
pub(super) fn envoy_api_version(value: &str) -> Result<(), String> {
    match value {
        "v3" => Ok(()),
        "v2" => Err("Envoy's v2 API is gone from Envoy; only v3 is supported".into()),
        _ => Err("unknown Envoy API version; only v3 is supported".into()),
    }
}

/// The forms Go's `strconv.ParseBool` takes, as the original read the annotation.
pub fn parse_bool(value: &str) -> Result<bool, String> {
    match value {
        "1" | "t" | "T" | "true" | "True" | "TRUE" => Ok(true),
        "0" | "f" | "F" | "false" | "False" | "FALSE" => Ok(false),
        _ => Err("must be true or false".into()),
    }
}

/// Any string Envoy can take as one argument (a process argument cannot hold a NUL).
pub(super) fn command_line_arg(value: &str) -> Result<(), String> {
    if value.contains('\0') {
        return Err("must not contain a NUL character".into());
    }
    Ok(())
}

/// `name:port[:TCP|UDP|SCTP]`, comma separated. An error carries the bad entry and why.
pub(super) fn parse_ports(value: &str) -> Result<Vec<PortSpec>, (String, String)> {
    let mut ports: Vec<PortSpec> = Vec::new();
    for entry in value.split(',').map(str::trim) {
        let bad = |reason: String| (entry.to_owned(), reason);
        let parts: Vec<&str> = entry.split(':').collect();
        let (name, port, protocol) = match parts.as_slice() {
            [name, port] => (*name, *port, None),
            [name, port, protocol] => (*name, *port, Some(*protocol)),
            _ => return Err(bad("expected name:port or name:port:protocol".into())),
        };
        port_name(name).map_err(bad)?;
        let port = parse_port_number(port).map_err(bad)?;
        let protocol = match protocol.map(str::to_ascii_uppercase).as_deref() {
            None | Some("TCP") => Protocol::Tcp,
            Some("UDP") => Protocol::Udp,
            Some("SCTP") => Protocol::Sctp,
            Some(_) => return Err(bad("protocol must be TCP, UDP or SCTP".into())),
        };
        if ports.iter().any(|p| p.name == name) {
            return Err(bad(format!("port name {name:?} is declared twice")));
        }
        if ports
            .iter()
            .any(|p| p.port == port && p.protocol == protocol)
        {
            return Err(bad(format!(
                "port {port}/{} is declared twice",
                protocol.as_str()
            )));
        }
        ports.push(PortSpec {
            name: name.to_owned(),
            port,
            protocol,
            host_port: None,
        });
    }
    Ok(ports)
}

/// `name:hostPort`, comma separated. Returns the names that are not ports of `ports`, which
/// the original ignored (ours warns).
pub(super) fn apply_host_port_mappings(
    value: &str,
    ports: &mut [PortSpec],
    ports_invalid: bool,
) -> Result<Vec<String>, (String, String)> {
    let mut unknown = Vec::new();
    let mut seen: HashSet<(u16, Protocol)> = HashSet::new();
    for entry in value.split(',').map(str::trim) {
        let bad = |reason: String| (entry.to_owned(), reason);
        let Some((name, host_port)) = entry.split_once(':') else {
            return Err(bad("expected name:hostPort".into()));
        };
        let host_port = parse_port_number(host_port).map_err(bad)?;
        let Some(port) = ports.iter_mut().find(|p| p.name == name) else {
            // A bad `ports` annotation is reported on its own; do not blame the mapping too.
            if !ports_invalid {
                unknown.push(name.to_owned());
            }
            continue;
        };
        if port.host_port.is_some() {
            return Err(bad(format!("port {name:?} is mapped twice")));
        }
        if !seen.insert((host_port, port.protocol)) {
            return Err(bad(format!(
                "host port {host_port}/{} is mapped twice",
                port.protocol.as_str()
            )));
        }
        port.host_port = Some(host_port);
    }
    Ok(unknown)
}

pub(super) fn parse_port_number(value: &str) -> Result<u16, String> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("port {value:?} is not a number"));
    }
    match value.parse::<u32>() {
        Ok(p @ 1..=65535) => Ok(p as u16),
        _ => Err("port must be between 1 and 65535".into()),
    }
}

/// Envoy's extra arguments, split as the original split them (on spaces), minus the flags the
/// sidecar owns (and, with the shutdown manager, the drain flags it sets).
pub(super) fn parse_extra_args(value: &str, drain_flags_set: bool) -> Result<Vec<String>, String> {
    let args = split_extra_args(value);
    check_extra_args(&args, drain_flags_set)?;
    Ok(args)
}

/// Refuses extra Envoy arguments that repeat a flag the injector (or the EnvoyDeployment
/// controller) sets: the bootstrap, node and cluster flags, and the drain flags when
/// `drain_flags_set`.
pub fn check_extra_args(args: &[String], drain_flags_set: bool) -> Result<(), String> {
    let owned = RESERVED_ARGS.iter().map(|r| (*r, None)).chain(
        DRAIN_ARGS
            .iter()
            .filter(|_| drain_flags_set)
            .map(|(flag, annotation)| (*flag, Some(*annotation))),
    );
    for (flag, annotation) in owned {
        let given = args.iter().any(|arg| {
            arg == flag
                || arg
                    .strip_prefix(flag)
                    .is_some_and(|rest| rest.starts_with('='))
        });
        if given {
            return Err(match annotation {
                None => format!("{flag} is set by the injector and may not be given again"),
                Some(annotation) => format!(
                    "{flag} is set from {annotation} when {SHUTDOWN_MANAGER_ENABLED} is true; set \
                     it there"
                ),
            });
        }
    }
    Ok(())
}

/// The original split the value on single spaces and passed every piece to Envoy as written,
/// quotes included. Every value it split into working arguments is split the same way here.
/// Two loosenings only change values that gave Envoy a broken command line: runs of
/// whitespace separate arguments (the original passed empty arguments and kept tabs and
/// newlines inside them), and a quoted span (`"..."` or `'...'`) that contains whitespace is
/// one piece of an argument, quotes removed (the original cut it into pieces Envoy refuses).
/// A quoted span without whitespace keeps its quotes, as in the original (`--log-format '%v'`
/// logs the quotes); backslashes are literal.
pub(super) fn split_extra_args(value: &str) -> Vec<String> {
    let chars: Vec<char> = value.chars().collect();
    let mut args = Vec::new();
    let mut current: Option<String> = None;
    let mut i = 0;
    while let Some(&c) = chars.get(i) {
        if c.is_whitespace() {
            args.extend(current.take());
            i += 1;
            continue;
        }
        let arg = current.get_or_insert_with(String::new);
        if matches!(c, '"' | '\'')
            && let Some(len) = chars[i + 1..].iter().position(|&d| d == c)
        {
            let inner = &chars[i + 1..i + 1 + len];
            if inner.iter().any(|ch| ch.is_whitespace()) {
                arg.extend(inner);
            } else {
                arg.extend(&chars[i..i + len + 2]);
            }
            i += len + 2;
            continue;
        }
        arg.push(c);
        i += 1;
    }
    args.extend(current);
    args
}

/// Any address: loopback (the default) keeps the admin API inside the pod; 0.0.0.0, :: or a
/// pod address opens it to whoever reaches the pod. Probes never need it open.
pub(super) fn parse_bind_address(value: &str) -> Result<IpAddr, String> {
    value
        .parse()
        .map_err(|_| "not an IPv4 or IPv6 address".to_string())
}

pub(super) fn absolute_path(value: &str) -> Result<(), String> {
    if !value.starts_with('/') {
        return Err("must be an absolute path".into());
    }
    if value.chars().any(char::is_control) {
        return Err("must not contain control characters".into());
    }
    Ok(())
}

pub(super) fn image_reference(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err("the image must not be empty".into());
    }
    if value.len() > 1024 || value.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("not a container image reference".into());
    }
    Ok(())
}

/// A label value (the node id is also a label on revisions): at most 63 characters of
/// `[A-Za-z0-9._-]`, starting and ending alphanumeric.
pub(super) fn label_value(value: &str) -> Result<(), String> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if value.is_empty() {
        return Err("must not be empty".into());
    }
    if value.len() > 63 {
        return Err("must be at most 63 characters".into());
    }
    if !value.chars().all(ok_char)
        || !value.starts_with(|c: char| c.is_ascii_alphanumeric())
        || !value.ends_with(|c: char| c.is_ascii_alphanumeric())
    {
        return Err(
            "must be letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
                .into(),
        );
    }
    Ok(())
}

/// A node id names the config's revisions (`<node-id>-<version>`, a DNS-1123 subdomain) and
/// labels them (a label value): a node id fit for only one of the two could never publish.
pub(super) fn node_id_value(value: &str) -> Result<(), String> {
    label_value(value)?;
    if !marin3r_certs::is_dns_subdomain(value) {
        return Err(
            "must be lowercase letters, digits, '-' or '.', each dot-separated part starting and \
             ending with a letter or digit: it names the EnvoyConfigRevision <node-id>-<version>"
                .into(),
        );
    }
    Ok(())
}

/// An RFC 1123 label, as container and volume names must be.
pub(super) fn dns_label(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err("must not be empty".into());
    }
    if value.len() > 63 {
        return Err("must be at most 63 characters".into());
    }
    if !marin3r_certs::is_dns_label(value) {
        return Err(
            "must be lower-case letters, digits and '-', starting and ending with a letter or digit (RFC 1123 label)"
                .into(),
        );
    }
    Ok(())
}

/// An RFC 1123 subdomain, as Secret names must be.
pub(super) fn dns_subdomain(value: &str) -> Result<(), String> {
    if value.len() > 253 {
        return Err("must be at most 253 characters".into());
    }
    if !marin3r_certs::is_dns_subdomain(value) {
        return Err(
            "must be an RFC 1123 subdomain (lower-case letters, digits, '-' and '.')".into(),
        );
    }
    Ok(())
}

/// An IANA service name, as Kubernetes port names must be.
pub(super) fn port_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 15 {
        return Err(format!("port name {name:?} must be 1 to 15 characters"));
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        || !name.chars().any(|c| c.is_ascii_lowercase())
        || name.starts_with('-')
        || name.ends_with('-')
        || name.contains("--")
    {
        return Err(format!(
            "port name {name:?} must be lower-case letters, digits and single '-' (not at either end), with at least one letter"
        ));
    }
    Ok(())
}
