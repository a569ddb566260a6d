//! A cheap subset of Envoy's protoc-gen-validate rules, read from the descriptors'
//! `validate.rules` options: number and duration bounds, string and bytes lengths, required
//! messages and oneofs, list and map sizes, defined enum values. Envoy rejects a whole xDS
//! response for any of these, so catching them here keeps a typo from ever reaching it.
//! Regex patterns, `in`/`not_in`, `const` and well-known string formats are left to Envoy.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use prost_reflect::{
    DescriptorPool, DynamicMessage, ExtensionDescriptor, FieldDescriptor, Kind, MapKey,
    MessageDescriptor, OneofDescriptor, ReflectMessage as _, Value,
};

use super::ValueError;

mod rules;
use rules::{check_rules, field_rule, flag};

/// The compiled rules of one message type: what to check without decoding options again, nor
/// looking fields up by name on every message.
#[derive(Debug, Default)]
struct MessageRules {
    walk: Walk,
    /// The fields [`name_only_extension`] reads, when the type is an extension's config.
    extension: Option<ExtensionFields>,
    fields: Vec<(FieldDescriptor, FieldRule)>,
    required_oneofs: Vec<OneofDescriptor>,
    /// Set message fields to skip when descending (`(validate.rules).message.skip`).
    skipped: Vec<u32>,
}

/// How the walk treats a message of the type.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Walk {
    /// Its fields' rules are checked and its message fields descended into.
    #[default]
    Fields,
    /// `google.protobuf.Any`: its payload is checked as the message it names.
    Any,
    /// Well-known types carry no rules and are leaves for validation.
    Leaf,
}

/// A message with a `name` and an `Any` `typed_config`, and which of the fields that make a
/// name-only extension acceptable it has.
#[derive(Debug)]
struct ExtensionFields {
    typed_config: FieldDescriptor,
    name: FieldDescriptor,
    excusing: Vec<FieldDescriptor>,
}

#[derive(Debug, Clone, Default)]
struct FieldRule {
    required: bool,
    check: Option<Check>,
}

#[derive(Debug, Clone)]
enum Check {
    Number {
        bounds: Bounds,
        ignore_empty: bool,
    },
    Length {
        unit: Unit,
        min: Option<u64>,
        max: Option<u64>,
        ignore_empty: bool,
    },
    Items {
        min: Option<u64>,
        max: Option<u64>,
        items: Option<Box<Check>>,
        ignore_empty: bool,
    },
    Pairs {
        min: Option<u64>,
        max: Option<u64>,
    },
    Duration {
        required: bool,
        bounds: Bounds,
    },
    AnyRequired,
    EnumDefined,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unit {
    Chars,
    Bytes,
}

#[derive(Debug, Clone, Copy, Default)]
struct Bounds {
    lt: Option<f64>,
    lte: Option<f64>,
    gt: Option<f64>,
    gte: Option<f64>,
}

/// Checks messages against their `validate.rules`, caching the compiled rules per type.
#[derive(Debug)]
pub struct Validator {
    pool: DescriptorPool,
    field_rules: Option<ExtensionDescriptor>,
    oneof_required: Option<ExtensionDescriptor>,
    cache: RwLock<HashMap<String, Arc<MessageRules>>>,
}

impl Validator {
    pub fn new(pool: &DescriptorPool) -> Self {
        Self {
            pool: pool.clone(),
            field_rules: pool.get_extension_by_name("validate.rules"),
            oneof_required: pool.get_extension_by_name("validate.required"),
            cache: RwLock::new(HashMap::new()),
        }
    }

    /// Every rule violation in `message`, with field paths relative to it.
    pub fn check(&self, message: &DynamicMessage) -> Vec<ValueError> {
        let mut errors = Vec::new();
        self.check_message(message, &Path::Root, &mut errors);
        errors
    }

    fn rules(&self, desc: &MessageDescriptor) -> Arc<MessageRules> {
        if let Ok(cache) = self.cache.read()
            && let Some(rules) = cache.get(desc.full_name())
        {
            return rules.clone();
        }
        let rules = Arc::new(self.compile(desc));
        if let Ok(mut cache) = self.cache.write() {
            cache.insert(desc.full_name().to_owned(), rules.clone());
        }
        rules
    }

    fn compile(&self, desc: &MessageDescriptor) -> MessageRules {
        let mut rules = MessageRules::default();
        if desc.full_name() == "google.protobuf.Any" {
            rules.walk = Walk::Any;
            return rules;
        }
        if desc.full_name().starts_with("google.protobuf.") {
            rules.walk = Walk::Leaf;
            return rules;
        }
        rules.extension = extension_fields(desc);
        if let Some(ext) = &self.field_rules {
            for field in desc.fields() {
                let options = field.options();
                if !options.has_extension(ext) {
                    continue;
                }
                let Value::Message(field_rules) = options.get_extension(ext).into_owned() else {
                    continue;
                };
                let rule = field_rule(&field_rules);
                if let Some(Value::Message(m)) = field_rules.get_field_by_name("message").as_deref()
                    && flag(m, "skip")
                {
                    rules.skipped.push(field.number());
                }
                if rule.required || rule.check.is_some() {
                    rules.fields.push((field, rule));
                }
            }
        }
        if let Some(ext) = &self.oneof_required {
            rules.required_oneofs = desc
                .oneofs()
                .filter(|oneof| {
                    let options = oneof.options();
                    options.has_extension(ext)
                        && matches!(options.get_extension(ext).as_ref(), Value::Bool(true))
                })
                .collect();
        }
        rules
    }

    fn check_message(
        &self,
        message: &DynamicMessage,
        path: &Path<'_>,
        errors: &mut Vec<ValueError>,
    ) {
        let rules = self.rules(&message.descriptor());
        match rules.walk {
            Walk::Any => return self.check_any(message, path, errors),
            Walk::Leaf => return,
            Walk::Fields => {}
        }
        if let Some(why) = rules
            .extension
            .as_ref()
            .and_then(|fields| name_only_extension(fields, message))
        {
            errors.push(error(path, Some("typed_config"), why));
        }
        check_rules(&rules, message, path, errors);
        self.check_fields(&rules, message, path, errors);
    }

    /// The messages in `message`'s fields, except those whose rules say to skip them.
    fn check_fields(
        &self,
        rules: &MessageRules,
        message: &DynamicMessage,
        path: &Path<'_>,
        errors: &mut Vec<ValueError>,
    ) {
        for (field, value) in message.fields() {
            if rules.skipped.contains(&field.number()) {
                continue;
            }
            let name = field.name();
            match value {
                Value::Message(nested) => {
                    self.check_message(nested, &Path::Step(path, Step::Field(name)), errors);
                }
                Value::List(items) => {
                    for (i, item) in items.iter().enumerate() {
                        if let Value::Message(nested) = item {
                            let here = Path::Step(path, Step::Item(name, i));
                            self.check_message(nested, &here, errors);
                        }
                    }
                }
                Value::Map(map) => {
                    for (key, item) in map {
                        if let Value::Message(nested) = item {
                            let here = Path::Step(path, Step::Entry(name, key));
                            self.check_message(nested, &here, errors);
                        }
                    }
                }
                _ => {}
            }
        }
    }

    fn check_any(&self, any: &DynamicMessage, path: &Path<'_>, errors: &mut Vec<ValueError>) {
        // `type_url = 1`, `value = 2`.
        let url = any.get_field_by_number(1);
        let bytes = any.get_field_by_number(2);
        let (Some(Value::String(url)), Some(Value::Bytes(bytes))) =
            (url.as_deref(), bytes.as_deref())
        else {
            return;
        };
        let name = url.rsplit('/').next().unwrap_or(url);
        // The parser resolved every `@type` already; an unknown one cannot get here.
        if let Some(desc) = self.pool.get_message_by_name(name)
            && let Ok(payload) = DynamicMessage::decode(desc, bytes.as_ref())
        {
            self.check_message(&payload, path, errors);
        }
    }
}

/// Where the walk is: each step borrows from the message being checked, and the text is
/// written only for an error (most messages break no rule).
#[derive(Debug, Clone, Copy)]
enum Path<'a> {
    Root,
    Step(&'a Path<'a>, Step<'a>),
}

#[derive(Debug, Clone, Copy)]
enum Step<'a> {
    /// A message field: `field`.
    Field(&'a str),
    /// An item of a repeated field: `field[i]`.
    Item(&'a str, usize),
    /// An entry of a map field: `field.key` or `field["key"]`.
    Entry(&'a str, &'a MapKey),
}

impl Path<'_> {
    /// The steps' texts, from the root.
    fn segments(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut at = self;
        while let Path::Step(parent, step) = at {
            out.push(match step {
                Step::Field(name) => (*name).to_owned(),
                Step::Item(name, i) => format!("{name}[{i}]"),
                Step::Entry(name, key) => {
                    format!("{name}{}", super::parse::key_segment(&map_key(key), false))
                }
            });
            at = parent;
        }
        out.reverse();
        out
    }
}

fn error(path: &Path<'_>, field: Option<&str>, message: String) -> ValueError {
    let segments = path.segments();
    let mut full: Vec<&str> = segments.iter().map(String::as_str).collect();
    full.extend(field);
    ValueError {
        path: full.join("."),
        message,
        location: None,
    }
}

fn map_key(key: &MapKey) -> String {
    match key {
        MapKey::String(s) => s.clone(),
        MapKey::Bool(b) => b.to_string(),
        MapKey::I32(n) => n.to_string(),
        MapKey::I64(n) => n.to_string(),
        MapKey::U32(n) => n.to_string(),
        MapKey::U64(n) => n.to_string(),
    }
}

#[cfg(test)]
#[path = "pgv_tests.rs"]
mod tests;

/// The fields of an extension's config message that [`name_only_extension`] reads: a `name`
/// and an `Any` `typed_config`; `None` for any other message.
fn extension_fields(desc: &MessageDescriptor) -> Option<ExtensionFields> {
    let typed_config = desc.get_field_by_name("typed_config")?;
    let name = desc.get_field_by_name("name")?;
    if !matches!(typed_config.kind(), Kind::Message(m) if m.full_name() == "google.protobuf.Any") {
        return None;
    }
    let excusing = ["config_discovery", "is_optional"]
        .into_iter()
        .filter_map(|field| desc.get_field_by_name(field))
        .collect();
    Some(ExtensionFields {
        typed_config,
        name,
        excusing,
    })
}

/// Not a validation rule but Envoy's own behaviour, checked on the same walk: since 1.40 Envoy
/// finds an extension (a filter, listener filter, access log, transport socket...) by the type
/// of its `typed_config` only, so one given by `name` alone is refused by every proxy. Envoy
/// skips it when it is an optional HTTP filter (`is_optional`), or when its config comes from
/// discovery (`config_discovery`). Envoy's words, and what to do.
fn name_only_extension(fields: &ExtensionFields, message: &DynamicMessage) -> Option<String> {
    if message.has_field(&fields.typed_config)
        || fields.excusing.iter().any(|f| message.has_field(f))
    {
        return None;
    }
    let Value::String(name) = message.get_field(&fields.name).into_owned() else {
        return None;
    };
    Some(format!(
        "Didn't find a registered implementation for '{name}' with type URL: '' (Envoy finds \
         extensions by the \"@type\" of typed_config only: add typed_config)"
    ))
}
