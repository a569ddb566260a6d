//! Each message type's fields, looked up once per type.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, OnceLock, RwLock};

use prost_reflect::{Kind, MessageDescriptor};

/// What a message type needs to be encoded from JSON: its fields by either name.
pub(super) struct Table {
    pub(super) shape: Shape,
    pub(super) by_name: HashMap<Box<str>, usize>,
    pub(super) fields: Vec<Field>,
}

/// The JSON forms of the well-known types the fast path writes; the others decline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Shape {
    Plain,
    Any,
    Duration,
    /// `google.protobuf.*Value` holding a scalar: the JSON is the bare value.
    Wrapper,
    Struct,
    Value,
    ListValue,
    Declined,
}

pub(super) struct Field {
    pub(super) number: u32,
    /// The field's kind; of a map field, its values' kind.
    pub(super) kind: Kind,
    pub(super) list: bool,
    /// A map field.
    pub(super) map: bool,
    /// A map field whose keys are not strings: declined.
    pub(super) other_keys: bool,
    pub(super) packed: bool,
    pub(super) presence: bool,
    pub(super) oneof: Option<u32>,
    /// The table of a message field (of a map field: its values'), once looked up.
    pub(super) child: OnceLock<Arc<Table>>,
}

/// One table per message type of the pool, as long as the process lives: the pool is fixed,
/// so this holds at most one entry per type it has.
static TABLES: LazyLock<RwLock<HashMap<String, Arc<Table>>>> = LazyLock::new(Default::default);

pub(super) fn table(desc: &MessageDescriptor) -> Arc<Table> {
    if let Ok(tables) = TABLES.read()
        && let Some(table) = tables.get(desc.full_name())
    {
        return table.clone();
    }
    let table = Arc::new(build(desc));
    if let Ok(mut tables) = TABLES.write() {
        tables.insert(desc.full_name().to_owned(), table.clone());
    }
    table
}

fn build(desc: &MessageDescriptor) -> Table {
    let shape = match desc.full_name() {
        "google.protobuf.Any" => Shape::Any,
        "google.protobuf.Duration" => Shape::Duration,
        "google.protobuf.BoolValue"
        | "google.protobuf.Int32Value"
        | "google.protobuf.UInt32Value"
        | "google.protobuf.Int64Value"
        | "google.protobuf.UInt64Value"
        | "google.protobuf.DoubleValue"
        | "google.protobuf.StringValue" => Shape::Wrapper,
        "google.protobuf.Struct" => Shape::Struct,
        "google.protobuf.Value" => Shape::Value,
        "google.protobuf.ListValue" => Shape::ListValue,
        name if name.starts_with("google.protobuf.") => Shape::Declined,
        _ => Shape::Plain,
    };
    let mut by_name = HashMap::new();
    let mut fields = Vec::new();
    for field in desc.fields() {
        let index = fields.len();
        by_name.insert(field.name().into(), index);
        by_name.insert(field.json_name().into(), index);
        let (kind, other_keys) = match field.kind() {
            Kind::Message(entry) if field.is_map() => (
                entry.map_entry_value_field().kind(),
                !matches!(entry.map_entry_key_field().kind(), Kind::String),
            ),
            kind => (kind, false),
        };
        fields.push(Field {
            number: field.number(),
            kind,
            list: field.is_list(),
            map: field.is_map(),
            other_keys,
            packed: field.is_packed(),
            presence: field.supports_presence(),
            oneof: field
                .containing_oneof()
                .and_then(|o| desc.oneofs().position(|x| x == o))
                .map(|i| i as u32),
            child: OnceLock::new(),
        });
    }
    Table {
        shape,
        by_name,
        fields,
    }
}

impl Field {
    pub(super) fn child(&self) -> Option<&Arc<Table>> {
        let Kind::Message(desc) = &self.kind else {
            return None;
        };
        Some(self.child.get_or_init(|| table(desc)))
    }
}
