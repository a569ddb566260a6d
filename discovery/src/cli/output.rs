//! `-o table|json|yaml`, the one output flag every command that reads takes, as kubectl's
//! `-o`: a table (or report) for people, or one JSON or YAML document on stdout for scripts.

use serde::Serialize;

/// How a reading command prints what it read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// For people: a table or a report (`text` is accepted for it too).
    #[default]
    #[value(alias = "text")]
    Table,
    /// One JSON document.
    Json,
    /// One YAML document.
    Yaml,
}

impl Output {
    /// Whether stdout carries one document a program reads, so anything else said (a
    /// comparison, a warning) goes to stderr.
    pub fn is_document(self) -> bool {
        self != Self::Table
    }

    /// `document` as this format asks, or `table()` for people. JSON is pretty-printed and,
    /// like YAML, ends with a newline.
    pub fn render<T: Serialize>(
        self,
        document: &T,
        table: impl FnOnce() -> String,
    ) -> anyhow::Result<String> {
        Ok(match self {
            Self::Table => table(),
            Self::Json => serde_json::to_string_pretty(document)? + "\n",
            Self::Yaml => {
                let yaml = serde_saphyr::to_string(document)?;
                if yaml.ends_with('\n') {
                    yaml
                } else {
                    yaml + "\n"
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Doc {
        node_id: &'static str,
        count: u32,
    }

    #[test]
    fn each_format_prints_the_same_document() {
        let doc = Doc {
            node_id: "gw",
            count: 2,
        };
        let table = || "NODE ID   COUNT\ngw        2\n".to_owned();
        assert_eq!(Output::Table.render(&doc, table).unwrap(), table());
        let json = Output::Json.render(&doc, table).unwrap();
        assert_eq!(json, "{\n  \"nodeId\": \"gw\",\n  \"count\": 2\n}\n");
        let yaml = Output::Yaml.render(&doc, table).unwrap();
        let back: serde_json::Value = serde_saphyr::from_str(&yaml).unwrap();
        assert_eq!(back, serde_json::json!({"nodeId": "gw", "count": 2}));
        assert!(yaml.ends_with('\n'));
    }

    #[test]
    fn text_is_another_name_for_table() {
        use clap::ValueEnum;
        assert_eq!(Output::from_str("text", false), Ok(Output::Table));
        assert_eq!(Output::from_str("yaml", false), Ok(Output::Yaml));
        assert!(Output::from_str("wide", false).is_err());
        assert!(!Output::Table.is_document() && Output::Json.is_document());
    }
}
