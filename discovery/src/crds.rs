//! Every CRD marin3r serves, generated from the Rust types. `marin3r crds` prints them;
//! `manifests/crds/` holds the checked-in copies, and a test fails when they drift.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
use kube::CustomResourceExt;
use marin3r_certs::api::DiscoveryServiceCertificate;

use marin3r_api::discovery_service::DiscoveryService;
use marin3r_api::envoy_deployment::EnvoyDeployment;
use marin3r_api::{EnvoyConfig, EnvoyConfigRevision};

/// All CRDs, in a stable order, their descriptions unwrapped.
pub fn all() -> Vec<CustomResourceDefinition> {
    let mut all = vec![
        DiscoveryService::crd(),
        DiscoveryServiceCertificate::crd(),
        EnvoyConfig::crd(),
        EnvoyConfigRevision::crd(),
        EnvoyDeployment::crd(),
    ];
    for crd in &mut all {
        for version in &mut crd.spec.versions {
            if let Some(schema) = version
                .schema
                .as_mut()
                .and_then(|s| s.open_api_v3_schema.as_mut())
            {
                unwrap_descriptions(schema);
            }
        }
    }
    all
}

/// Joins the lines of each paragraph of every description in `schema` into one, as
/// `kubectl explain` and editors expect (they wrap text themselves): doc comments are wrapped
/// at 100 columns, and those breaks are not the writer's meaning. Blank lines between
/// paragraphs stay, and so does a line that starts indented or as a list item.
fn unwrap_descriptions(schema: &mut JSONSchemaProps) {
    if let Some(text) = &mut schema.description {
        *text = unwrap_text(text);
    }
    let mut children: Vec<&mut JSONSchemaProps> = Vec::new();
    children.extend(schema.properties.iter_mut().flat_map(|p| p.values_mut()));
    if let Some(JSONSchemaPropsOrArray::Schema(items)) = &mut schema.items {
        children.push(items);
    }
    if let Some(JSONSchemaPropsOrBool::Schema(values)) = &mut schema.additional_properties {
        children.push(values);
    }
    for list in [&mut schema.one_of, &mut schema.any_of, &mut schema.all_of] {
        children.extend(list.iter_mut().flatten());
    }
    for child in children {
        unwrap_descriptions(child);
    }
}

fn unwrap_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut lines = text.split('\n').peekable();
    while let Some(line) = lines.next() {
        out.push_str(line);
        let Some(next) = lines.peek() else { break };
        let joins = !line.is_empty()
            && !next.is_empty()
            && !next.starts_with(char::is_whitespace)
            && !next.starts_with("- ")
            && !next.starts_with("* ")
            && !line.starts_with('\t');
        out.push(if joins { ' ' } else { '\n' });
    }
    out
}

/// The file name of a CRD in `manifests/crds/`: `<group>_<plural>.yaml`.
pub fn file_name(crd: &CustomResourceDefinition) -> String {
    format!("{}_{}.yaml", crd.spec.group, crd.spec.names.plural)
}

/// A CRD as a YAML document.
pub fn to_yaml(crd: &CustomResourceDefinition) -> Result<String, serde_saphyr::SerializeError> {
    serde_saphyr::to_string(crd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_paragraph_is_one_line_and_lists_and_paragraphs_stay() {
        assert_eq!(
            unwrap_text("A discovery service: the pod,\nits certificates."),
            "A discovery service: the pod, its certificates."
        );
        assert_eq!(
            unwrap_text("One.\n\nTwo\nlines.\n- a\n- b\n  indented"),
            "One.\n\nTwo lines.\n- a\n- b\n  indented"
        );
    }

    /// No description of any CRD has a line break inside a paragraph.
    #[test]
    fn every_description_is_unwrapped() {
        fn walk(value: &serde_json::Value, found: &mut Vec<String>) {
            match value {
                serde_json::Value::Object(map) => {
                    for (key, child) in map {
                        match (key.as_str(), child.as_str()) {
                            ("description", Some(text)) if unwrap_text(text) != text => {
                                found.push(text.to_owned());
                            }
                            _ => walk(child, found),
                        }
                    }
                }
                serde_json::Value::Array(items) => items.iter().for_each(|v| walk(v, found)),
                _ => {}
            }
        }
        let mut found = Vec::new();
        for crd in all() {
            walk(&serde_json::to_value(&crd).unwrap(), &mut found);
        }
        assert!(found.is_empty(), "{found:#?}");
    }
}
