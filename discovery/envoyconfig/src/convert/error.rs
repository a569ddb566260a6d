//! The two errors of conversion: [`ValueError`], what is wrong inside one serialized value
//! (its field path and place in the text), and [`ConversionError`], one problem of a spec at
//! its path in the manifest, which a `ValueError` becomes once the value's place is known.

use std::fmt;

/// Why one value could not be parsed: where inside the value, and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueError {
    /// The field path inside the value (`filter_chains[0].filters[0].typed_config`); empty
    /// when the error is about the value as a whole.
    pub path: String,
    pub message: String,
    /// 1-based line and column inside the value's text, when the parser knows them.
    pub location: Option<(u64, u64)>,
}

impl ValueError {
    pub(crate) fn whole(message: impl Into<String>) -> Self {
        Self {
            path: String::new(),
            message: message.into(),
            location: None,
        }
    }
}

impl fmt::Display for ValueError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.path.is_empty() {
            write!(f, "{}: ", self.path)?;
        }
        f.write_str(&self.message)?;
        if let Some((line, column)) = self.location {
            write!(f, " (line {line}, column {column} of the value)")?;
        }
        Ok(())
    }
}

/// One problem in a spec, at a path such as `spec.envoyResources.listeners[1].value`.
/// Displayed as `path: message`, plus the line and column inside the value when known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConversionError {
    pub path: String,
    /// What is wrong, starting with the field path inside the value when there is one.
    pub message: String,
    /// 1-based line and column inside the value's text (not the manifest's).
    pub value_location: Option<(u64, u64)>,
}

impl ConversionError {
    pub(super) fn new(path: impl Into<String>, message: impl fmt::Display) -> Self {
        Self {
            path: path.into(),
            message: message.to_string(),
            value_location: None,
        }
    }

    pub(super) fn in_value(path: impl Into<String>, err: ValueError) -> Self {
        let message = if err.path.is_empty() {
            err.message
        } else {
            format!("{}: {}", err.path, err.message)
        };
        Self {
            path: path.into(),
            message,
            value_location: err.location,
        }
    }
}

impl fmt::Display for ConversionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)?;
        if let Some((line, column)) = self.value_location {
            write!(f, " (line {line}, column {column} of the value)")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConversionError {}
