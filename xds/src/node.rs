//! What a proxy says of itself in its xDS node: its pod, its Envoy release, its stats port.
//! Whatever the client declares: shown and used for its own proxy only, never trusted for
//! anything another proxy gets.

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::config::core::v3::node::UserAgentVersionType;
use envoy_types::pb::google::protobuf::value::Kind;

/// The node metadata key the sidecar's bootstrap puts its pod's name under.
const POD_NAME_METADATA: &str = "pod_name";

pub(crate) fn pod_name(node: &Node) -> Option<String> {
    let value = node.metadata.as_ref()?.fields.get(POD_NAME_METADATA)?;
    match &value.kind {
        Some(Kind::StringValue(s)) if !s.is_empty() => Some(s.clone()),
        _ => None,
    }
}

/// The node metadata key the sidecar's bootstrap puts its stats listener's port under.
const STATS_PORT_METADATA: &str = "stats_port";

/// The stats listener's port the node declares: a number, or a string of one (Envoy's
/// `--config-yaml` turns an expanded environment variable into a string).
pub(crate) fn stats_port(node: &Node) -> Option<u16> {
    let value = node.metadata.as_ref()?.fields.get(STATS_PORT_METADATA)?;
    match &value.kind {
        Some(Kind::NumberValue(n)) if n.fract() == 0.0 && (1.0..=65535.0).contains(n) => {
            Some(*n as u16)
        }
        Some(Kind::StringValue(s)) => s.parse().ok().filter(|p| *p != 0),
        _ => None,
    }
}

/// The release the node runs: Envoy sends its semantic version in
/// `user_agent_build_version`; other clients may send a free-form `user_agent_version`.
pub(crate) fn envoy_version(node: &Node) -> Option<String> {
    match node.user_agent_version_type.as_ref()? {
        UserAgentVersionType::UserAgentBuildVersion(build) => {
            let v = build.version.as_ref()?;
            Some(format!("{}.{}.{}", v.major_number, v.minor_number, v.patch))
        }
        UserAgentVersionType::UserAgentVersion(v) if !v.is_empty() => Some(v.clone()),
        UserAgentVersionType::UserAgentVersion(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_envoy_version_comes_from_the_node() {
        use envoy_types::pb::envoy::config::core::v3::BuildVersion;
        use envoy_types::pb::envoy::r#type::v3::SemanticVersion;
        let node = |v: Option<UserAgentVersionType>| Node {
            user_agent_version_type: v,
            ..Default::default()
        };
        let build = UserAgentVersionType::UserAgentBuildVersion(BuildVersion {
            version: Some(SemanticVersion {
                major_number: 1,
                minor_number: 34,
                patch: 1,
            }),
            metadata: None,
        });
        assert_eq!(envoy_version(&node(Some(build))).as_deref(), Some("1.34.1"));
        let free = UserAgentVersionType::UserAgentVersion("custom-7".into());
        assert_eq!(
            envoy_version(&node(Some(free))).as_deref(),
            Some("custom-7")
        );
        let empty = UserAgentVersionType::UserAgentVersion(String::new());
        assert_eq!(envoy_version(&node(Some(empty))), None);
        assert_eq!(envoy_version(&node(None)), None);
    }

    #[test]
    fn the_stats_port_is_a_port_or_nothing() {
        use envoy_types::pb::google::protobuf::{Struct, Value};
        let node = |kind: Kind| Node {
            metadata: Some(Struct {
                fields: [("stats_port".to_owned(), Value { kind: Some(kind) })].into(),
            }),
            ..Default::default()
        };
        assert_eq!(stats_port(&node(Kind::NumberValue(9902.0))), Some(9902));
        assert_eq!(
            stats_port(&node(Kind::StringValue("15021".into()))),
            Some(15021)
        );
        for bad in [0.0, -1.0, 65536.0, 1.5, f64::NAN] {
            assert_eq!(stats_port(&node(Kind::NumberValue(bad))), None, "{bad}");
        }
        assert_eq!(stats_port(&node(Kind::StringValue("0".into()))), None);
        assert_eq!(stats_port(&node(Kind::BoolValue(true))), None);
        assert_eq!(stats_port(&Node::default()), None);
    }
}
