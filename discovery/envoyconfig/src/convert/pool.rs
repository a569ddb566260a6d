//! The protobuf descriptors of every Envoy v3 message, decoded once and shared by every
//! conversion. They come from the descriptor set the `envoy-types` crate ships (see
//! `build.rs`), so they describe exactly the prost structs that crate compiles; plus the few
//! messages of the `xds` and `udpa` packages Envoy accepts in an `Any` that the set leaves out
//! (see [`extra_files`]).

use std::sync::LazyLock;

use prost_reflect::DescriptorPool;
use prost_reflect::prost_types::{
    DescriptorProto, FieldDescriptorProto, FileDescriptorProto, field_descriptor_proto,
};

/// The descriptor set embedded by `build.rs`.
static DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/envoy_descriptors.bin"));

// prost-reflect's own decoder keeps custom options (e.g. protoc-gen-validate rules) that a
// round trip through `prost_types::FileDescriptorSet` would drop.
static POOL: LazyLock<Result<DescriptorPool, PoolError>> = LazyLock::new(|| {
    let mut pool = DescriptorPool::decode(DESCRIPTOR_SET).map_err(|e| PoolError(e.to_string()))?;
    for file in extra_files() {
        pool.add_file_descriptor_proto(file)
            .map_err(|e| PoolError(e.to_string()))?;
    }
    Ok(pool)
});

/// The embedded descriptor set could not be decoded (a build problem, not bad input).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the embedded Envoy descriptor set is unusable: {0}")]
pub struct PoolError(String);

/// The shared pool, decoded on first use (~3 MB of descriptors).
pub fn descriptor_pool() -> Result<&'static DescriptorPool, PoolError> {
    POOL.as_ref().map_err(Clone::clone)
}

fn field(
    name: &str,
    number: i32,
    kind: field_descriptor_proto::Type,
    message: Option<&str>,
) -> FieldDescriptorProto {
    FieldDescriptorProto {
        name: Some(name.to_owned()),
        json_name: Some(json_name(name)),
        number: Some(number),
        label: Some(field_descriptor_proto::Label::Optional as i32),
        r#type: Some(kind as i32),
        type_name: message.map(str::to_owned),
        ..Default::default()
    }
}

fn json_name(name: &str) -> String {
    let mut out = String::new();
    let mut upper = false;
    for c in name.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

fn file(name: &str, package: &str, deps: &[&str], message: DescriptorProto) -> FileDescriptorProto {
    FileDescriptorProto {
        name: Some(name.to_owned()),
        package: Some(package.to_owned()),
        dependency: deps.iter().map(|d| (*d).to_owned()).collect(),
        message_type: vec![message],
        syntax: Some("proto3".to_owned()),
        ..Default::default()
    }
}

/// Messages Envoy takes in an `Any` that `envoy-types` does not describe, written from their
/// published definitions (cncf/xds and cncf/udpa): `xds.type.v3.TypedStruct` and its
/// historical twin `udpa.type.v1.TypedStruct` (an extension's config as a type URL and a
/// Struct, common in Wasm and Lua configs), `xds.type.matcher.v3.CelMatcher` and the input it
/// matches on, `xds.type.matcher.v3.HttpAttributesCelMatchInput` (an empty message).
fn extra_files() -> Vec<FileDescriptorProto> {
    use field_descriptor_proto::Type;
    let typed_struct = || DescriptorProto {
        name: Some("TypedStruct".to_owned()),
        field: vec![
            field("type_url", 1, Type::String, None),
            field("value", 2, Type::Message, Some(".google.protobuf.Struct")),
        ],
        ..Default::default()
    };
    let struct_proto = ["google/protobuf/struct.proto"];
    vec![
        file(
            "xds/type/v3/typed_struct.proto",
            "xds.type.v3",
            &struct_proto,
            typed_struct(),
        ),
        file(
            "udpa/type/v1/typed_struct.proto",
            "udpa.type.v1",
            &struct_proto,
            typed_struct(),
        ),
        // The placeholder an empty `Any` (`{}`) is parsed as (see `parse::EMPTY_ANY_URL`).
        file(
            "marin3r/internal/empty_any.proto",
            "marin3r.internal",
            &[],
            DescriptorProto {
                name: Some("EmptyAny".to_owned()),
                ..Default::default()
            },
        ),
        file(
            "xds/type/matcher/v3/http_inputs.proto",
            "xds.type.matcher.v3",
            &[],
            DescriptorProto {
                name: Some("HttpAttributesCelMatchInput".to_owned()),
                ..Default::default()
            },
        ),
        file(
            "xds/type/matcher/v3/cel.proto",
            "xds.type.matcher.v3",
            &["xds/type/v3/cel.proto"],
            DescriptorProto {
                name: Some("CelMatcher".to_owned()),
                field: vec![
                    field(
                        "expr_match",
                        1,
                        Type::Message,
                        Some(".xds.type.v3.CelExpression"),
                    ),
                    field("description", 2, Type::String, None),
                ],
                ..Default::default()
            },
        ),
    ]
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_xds_and_udpa_messages_envoy_accepts_are_known() {
        let pool = super::descriptor_pool().unwrap();
        for name in [
            "xds.type.v3.TypedStruct",
            "udpa.type.v1.TypedStruct",
            "xds.type.matcher.v3.CelMatcher",
            "xds.type.matcher.v3.HttpAttributesCelMatchInput",
            "envoy.config.listener.v3.Listener",
        ] {
            assert!(pool.get_message_by_name(name).is_some(), "{name}");
        }
        let m = pool.get_message_by_name("xds.type.v3.TypedStruct").unwrap();
        assert_eq!(
            m.get_field_by_name("type_url").unwrap().json_name(),
            "typeUrl"
        );
    }

    /// `build.rs` leaves the source code info out (memory: see BENCHMARKS.md) and keeps
    /// everything else, the protoc-gen-validate rules in the field options included.
    #[test]
    fn the_embedded_set_has_no_comments_but_keeps_the_validation_rules() {
        use prost::Message;
        let set =
            prost_reflect::prost_types::FileDescriptorSet::decode(super::DESCRIPTOR_SET).unwrap();
        assert!(set.file.len() > 400, "{} files", set.file.len());
        assert!(set.file.iter().all(|f| f.source_code_info.is_none()));
        let pool = super::descriptor_pool().unwrap();
        let rules = pool.get_extension_by_name("validate.rules").unwrap();
        let cluster = pool
            .get_message_by_name("envoy.config.cluster.v3.Cluster")
            .unwrap();
        let timeout = cluster.get_field_by_name("connect_timeout").unwrap();
        assert!(timeout.options().has_extension(&rules));
    }
}
