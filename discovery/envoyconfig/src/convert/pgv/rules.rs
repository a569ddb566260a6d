//! Reading a field's `validate.rules` option into what [`super::MessageRules`] keeps, and
//! checking a value against it.

use prost_reflect::{DynamicMessage, FieldDescriptor, Kind, ReflectMessage as _, Value};

use super::{Bounds, Check, FieldRule, MessageRules, Path, Unit, ValueError, error};

pub(super) fn flag(message: &DynamicMessage, name: &str) -> bool {
    matches!(
        message.get_field_by_name(name).as_deref(),
        Some(Value::Bool(true))
    )
}

/// A proto2 `optional` bound of a rules message, as a number.
pub(super) fn bound(message: &DynamicMessage, name: &str) -> Option<f64> {
    let field = message.descriptor().get_field_by_name(name)?;
    if !message.has_field(&field) {
        return None;
    }
    match message.get_field(&field).as_ref() {
        Value::Message(duration) => Some(duration_seconds(duration)),
        other => number(other),
    }
}

pub(super) fn count(message: &DynamicMessage, name: &str) -> Option<u64> {
    bound(message, name).map(|n| n as u64)
}

pub(super) fn number(value: &Value) -> Option<f64> {
    match value {
        Value::I32(n) | Value::EnumNumber(n) => Some(f64::from(*n)),
        Value::U32(n) => Some(f64::from(*n)),
        Value::I64(n) => Some(*n as f64),
        Value::U64(n) => Some(*n as f64),
        Value::F32(n) => Some(f64::from(*n)),
        Value::F64(n) => Some(*n),
        _ => None,
    }
}

pub(super) fn duration_seconds(duration: &DynamicMessage) -> f64 {
    let part = |name| {
        duration
            .get_field_by_name(name)
            .as_deref()
            .and_then(number)
            .unwrap_or(0.0)
    };
    part("seconds") + part("nanos") / 1e9
}

pub(super) fn bounds(rules: &DynamicMessage) -> Bounds {
    Bounds {
        lt: bound(rules, "lt"),
        lte: bound(rules, "lte"),
        gt: bound(rules, "gt"),
        gte: bound(rules, "gte"),
    }
}

pub(super) fn field_rule(rules: &DynamicMessage) -> FieldRule {
    let required = matches!(
        rules.get_field_by_name("message").as_deref(),
        Some(Value::Message(m)) if flag(m, "required")
    );
    FieldRule {
        required,
        check: type_check(rules),
    }
}

/// `message`'s own rules: its required oneofs, and each field's `required` and check.
pub(super) fn check_rules(
    rules: &MessageRules,
    message: &DynamicMessage,
    path: &Path<'_>,
    errors: &mut Vec<ValueError>,
) {
    for oneof in &rules.required_oneofs {
        if !oneof.fields().any(|f| message.has_field(&f)) {
            let names: Vec<_> = oneof.fields().map(|f| f.name().to_owned()).collect();
            errors.push(error(
                path,
                None,
                format!("one of {} must be set", names.join(", ")),
            ));
        }
    }
    for (field, rule) in &rules.fields {
        let set = message.has_field(field);
        // A oneof member's rules apply only when that member is the one set.
        if field.containing_oneof().is_some() && !set {
            continue;
        }
        if rule.required && !set {
            errors.push(error(path, Some(field.name()), "is required".into()));
            continue;
        }
        if let Some(check) = &rule.check
            && let Err(message) = apply(check, field, &message.get_field(field), set)
        {
            errors.push(error(path, Some(field.name()), message));
        }
    }
}

/// The check for the `type` oneof of a `FieldRules` message, if it is one we implement.
pub(super) fn type_check(rules: &DynamicMessage) -> Option<Check> {
    let (field, value) = rules
        .fields()
        .find(|(f, _)| f.containing_oneof().is_some())?;
    let Value::Message(r) = value else {
        return None;
    };
    let ignore_empty = flag(r, "ignore_empty");
    let check = match field.name() {
        "float" | "double" | "int32" | "int64" | "uint32" | "uint64" | "sint32" | "sint64"
        | "fixed32" | "fixed64" | "sfixed32" | "sfixed64" => Check::Number {
            bounds: bounds(r),
            ignore_empty,
        },
        "string" => Check::Length {
            unit: Unit::Chars,
            min: count(r, "min_len").or(count(r, "len")),
            max: count(r, "max_len").or(count(r, "len")),
            ignore_empty,
        },
        "bytes" => Check::Length {
            unit: Unit::Bytes,
            min: count(r, "min_len").or(count(r, "len")),
            max: count(r, "max_len").or(count(r, "len")),
            ignore_empty,
        },
        "repeated" => Check::Items {
            min: count(r, "min_items"),
            max: count(r, "max_items"),
            items: match r.get_field_by_name("items").as_deref() {
                Some(Value::Message(items)) => type_check(items).map(Box::new),
                _ => None,
            },
            ignore_empty,
        },
        "map" => Check::Pairs {
            min: count(r, "min_pairs"),
            max: count(r, "max_pairs"),
        },
        "duration" => Check::Duration {
            required: flag(r, "required"),
            bounds: bounds(r),
        },
        "any" if flag(r, "required") => Check::AnyRequired,
        "enum" if flag(r, "defined_only") => Check::EnumDefined,
        _ => return None,
    };
    Some(check)
}

/// Applies one check to a field's value (`set`: whether the field has presence and is set).
pub(super) fn apply(
    check: &Check,
    field: &FieldDescriptor,
    value: &Value,
    set: bool,
) -> Result<(), String> {
    match check {
        Check::Number {
            bounds,
            ignore_empty,
        } => check_number(bounds, *ignore_empty, value, set),
        Check::Length {
            unit,
            min,
            max,
            ignore_empty,
        } => check_length(*unit, (*min, *max), *ignore_empty, value, set),
        Check::Items {
            min,
            max,
            items,
            ignore_empty,
        } => {
            let Value::List(list) = value else {
                return Ok(());
            };
            if *ignore_empty && list.is_empty() {
                return Ok(());
            }
            sizes(list.len() as u64, *min, *max, "items")?;
            if let Some(item_check) = items {
                for (i, item) in list.iter().enumerate() {
                    apply(item_check, field, item, true).map_err(|e| format!("[{i}]: {e}"))?;
                }
            }
            Ok(())
        }
        Check::Pairs { min, max } => match value {
            Value::Map(map) => sizes(map.len() as u64, *min, *max, "entries"),
            _ => Ok(()),
        },
        Check::Duration { required, bounds } => match value {
            Value::Message(d) if set => bounds.check(duration_seconds(d), &|s| format!("{s}s")),
            _ if *required => Err("is required".into()),
            _ => Ok(()),
        },
        Check::AnyRequired if !set => Err("is required".into()),
        Check::AnyRequired => Ok(()),
        Check::EnumDefined => match (value, field.kind()) {
            (Value::EnumNumber(n), Kind::Enum(e)) if e.get_value(*n).is_none() => {
                Err(format!("{n} is not a defined {} value", e.name()))
            }
            _ => Ok(()),
        },
    }
}

pub(super) fn check_number(
    bounds: &Bounds,
    ignore_empty: bool,
    value: &Value,
    set: bool,
) -> Result<(), String> {
    // Rules on a wrapper (`UInt32Value`) apply to the wrapped value, when present.
    let n = match value {
        Value::Message(wrapper) if set => wrapper
            .get_field_by_name("value")
            .as_deref()
            .and_then(number),
        Value::Message(_) => None,
        other => number(other),
    };
    match n {
        Some(n) if !(ignore_empty && n == 0.0) => bounds.check(n, &format_number),
        _ => Ok(()),
    }
}

pub(super) fn check_length(
    unit: Unit,
    (min, max): (Option<u64>, Option<u64>),
    ignore_empty: bool,
    value: &Value,
    set: bool,
) -> Result<(), String> {
    let len = match (value, unit) {
        (Value::String(s), Unit::Chars) => s.chars().count(),
        (Value::String(s), Unit::Bytes) => s.len(),
        (Value::Bytes(b), _) => b.len(),
        (Value::Message(wrapper), _) if set => {
            match wrapper.get_field_by_name("value").as_deref() {
                Some(Value::String(s)) => s.chars().count(),
                Some(Value::Bytes(b)) => b.len(),
                _ => return Ok(()),
            }
        }
        _ => return Ok(()),
    } as u64;
    if ignore_empty && len == 0 {
        return Ok(());
    }
    let what = match (value, unit) {
        (Value::String(_), Unit::Chars) => "characters",
        _ => "bytes",
    };
    sizes(len, min, max, what)
}

pub(super) fn format_number(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e15 {
        format!("{}", n as i64)
    } else {
        n.to_string()
    }
}

pub(super) fn sizes(
    len: u64,
    min: Option<u64>,
    max: Option<u64>,
    what: &str,
) -> Result<(), String> {
    match (min, max) {
        (Some(min), _) if len < min => Err(format!("must have at least {min} {what} (has {len})")),
        (_, Some(max)) if len > max => Err(format!("must have at most {max} {what} (has {len})")),
        _ => Ok(()),
    }
}

impl Bounds {
    /// PGV semantics: with both a lower and an upper bound, lower < upper means "inside",
    /// lower >= upper means "outside" the range.
    pub(super) fn check(&self, v: f64, show: &dyn Fn(f64) -> String) -> Result<(), String> {
        let lower = self.gt.map(|b| (b, false)).or(self.gte.map(|b| (b, true)));
        let upper = self.lt.map(|b| (b, false)).or(self.lte.map(|b| (b, true)));
        let above = |(b, inclusive): (f64, bool)| if inclusive { v >= b } else { v > b };
        let below = |(b, inclusive): (f64, bool)| if inclusive { v <= b } else { v < b };
        let text = |(b, inclusive): (f64, bool), op: &str| {
            format!("{op}{} {}", if inclusive { "=" } else { "" }, show(b))
        };
        let (ok, rule) = match (lower, upper) {
            (Some(l), Some(u)) if l.0 < u.0 => (
                above(l) && below(u),
                format!("{} and {}", text(l, ">"), text(u, "<")),
            ),
            (Some(l), Some(u)) => (
                above(l) || below(u),
                format!("{} or {}", text(l, ">"), text(u, "<")),
            ),
            (Some(l), None) => (above(l), text(l, ">")),
            (None, Some(u)) => (below(u), text(u, "<")),
            (None, None) => (true, String::new()),
        };
        if ok {
            Ok(())
        } else {
            Err(format!("must be {rule} (got {})", show(v)))
        }
    }
}
