//! `discovery.k8s.io/v1` EndpointSlices as a real API server takes them: the defaults it sets
//! (`ports[].protocol: TCP`) and the validation it runs (address type, addresses of that
//! type, counts, port names, numbers and protocols), with its field paths and messages.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, Ipv6Addr};

use serde_json::{Value, json};

use super::registry::ResourceInfo;
use super::validation;

const MAX_ENDPOINTS: usize = 1000;
const MAX_ADDRESSES: usize = 100;
const MAX_PORTS: usize = 20000;
const ADDRESS_TYPES: [&str; 3] = ["FQDN", "IPv4", "IPv6"];
const PROTOCOLS: [&str; 3] = ["SCTP", "TCP", "UDP"];

pub fn is_endpoint_slice(info: &ResourceInfo) -> bool {
    info.group == "discovery.k8s.io" && info.plural == "endpointslices"
}

/// The defaults the API server fills in.
pub fn default(obj: &mut Value) {
    if let Some(ports) = obj.get_mut("ports").and_then(Value::as_array_mut) {
        for port in ports.iter_mut().filter_map(Value::as_object_mut) {
            port.entry("protocol").or_insert_with(|| json!("TCP"));
            port.entry("name").or_insert_with(|| json!(""));
        }
    }
}

/// Every problem of `obj` (and of its change from `old`), as `field: message`.
pub fn validate(obj: &Value, old: Option<&Value>) -> Vec<String> {
    let mut errors = Vec::new();
    let address_type = obj.get("addressType").and_then(Value::as_str);
    match address_type {
        None | Some("") => errors.push("addressType: Required value".to_owned()),
        Some(t) if !ADDRESS_TYPES.contains(&t) => errors.push(format!(
            "addressType: Unsupported value: {t:?}: supported values: \"FQDN\", \"IPv4\", \"IPv6\""
        )),
        Some(_) => {}
    }
    if let Some(old_type) = old
        .and_then(|o| o.get("addressType"))
        .and_then(Value::as_str)
        && address_type.is_some_and(|t| t != old_type)
    {
        errors.push(format!(
            "addressType: Invalid value: {:?}: field is immutable",
            address_type.unwrap_or_default()
        ));
    }
    let endpoints = obj
        .get("endpoints")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    if endpoints.len() > MAX_ENDPOINTS {
        errors.push(format!(
            "endpoints: Too many: {}: must have at most {MAX_ENDPOINTS} items",
            endpoints.len()
        ));
    }
    for (i, endpoint) in endpoints.iter().enumerate() {
        let at = format!("endpoints[{i}]");
        let addresses = endpoint
            .get("addresses")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        if addresses.is_empty() {
            errors.push(format!(
                "{at}.addresses: Required value: must contain at least 1 address"
            ));
        } else if addresses.len() > MAX_ADDRESSES {
            errors.push(format!(
                "{at}.addresses: Too many: {}: must have at most {MAX_ADDRESSES} items",
                addresses.len()
            ));
        }
        for (j, address) in addresses.iter().enumerate() {
            let address = address.as_str().unwrap_or_default();
            let problem = match address_type {
                Some("IPv4") => address
                    .parse::<Ipv4Addr>()
                    .is_err()
                    .then(|| "must be a valid IPv4 address".to_owned()),
                Some("IPv6") => address
                    .parse::<Ipv6Addr>()
                    .is_err()
                    .then(|| "must be a valid IPv6 address".to_owned()),
                Some("FQDN") => validation::dns1123_subdomain(address).into_iter().next(),
                _ => None,
            };
            if let Some(why) = problem {
                errors.push(format!(
                    "{at}.addresses[{j}]: Invalid value: {address:?}: {why}"
                ));
            }
        }
        if let Some(hostname) = endpoint.get("hostname").and_then(Value::as_str) {
            for why in validation::dns1123_label(hostname) {
                errors.push(format!("{at}.hostname: Invalid value: {hostname:?}: {why}"));
            }
        }
    }
    let ports = obj
        .get("ports")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    if ports.len() > MAX_PORTS {
        errors.push(format!(
            "ports: Too many: {}: must have at most {MAX_PORTS} items",
            ports.len()
        ));
    }
    let mut names = BTreeSet::new();
    for (i, port) in ports.iter().enumerate() {
        let at = format!("ports[{i}]");
        let name = port.get("name").and_then(Value::as_str).unwrap_or_default();
        if !name.is_empty() {
            for why in validation::dns1123_label(name) {
                errors.push(format!("{at}.name: Invalid value: {name:?}: {why}"));
            }
        }
        if !names.insert(name) {
            errors.push(format!("{at}.name: Duplicate value: {name:?}"));
        }
        match port.get("protocol").and_then(Value::as_str) {
            None => errors.push(format!("{at}.protocol: Required value")),
            Some(p) if !PROTOCOLS.contains(&p) => errors.push(format!(
                "{at}.protocol: Unsupported value: {p:?}: supported values: \"SCTP\", \"TCP\", \"UDP\""
            )),
            Some(_) => {}
        }
        if let Some(number) = port.get("port").filter(|p| !p.is_null()) {
            let ok = number.as_u64().is_some_and(|n| (1..=65535).contains(&n));
            if !ok {
                errors.push(format!(
                    "{at}.port: Invalid value: {number}: must be between 1 and 65535, inclusive"
                ));
            }
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(address_type: &str, addresses: &[&str], ports: Value) -> Value {
        json!({
            "addressType": address_type,
            "endpoints": [{"addresses": addresses, "conditions": {"ready": true}}],
            "ports": ports,
        })
    }

    #[test]
    fn a_good_slice_passes_and_gets_its_defaults() {
        let mut s = slice("IPv4", &["10.0.0.1"], json!([{"name": "http", "port": 80}]));
        default(&mut s);
        assert_eq!(s["ports"][0]["protocol"], "TCP");
        assert!(validate(&s, None).is_empty());
    }

    #[test]
    fn what_a_real_api_server_refuses_is_refused() {
        let mut bad = slice(
            "IPv4",
            &["fd00::1", "10.0.0.300"],
            json!([{"name": "Http_1", "port": 0}, {"name": "Http_1", "protocol": "ICMP"}]),
        );
        bad["endpoints"]
            .as_array_mut()
            .unwrap()
            .push(json!({"addresses": []}));
        default(&mut bad);
        let errors = validate(&bad, None);
        let fields: Vec<&str> = errors
            .iter()
            .map(|e| e.split_once(": ").unwrap().0)
            .collect();
        assert_eq!(
            fields,
            [
                "endpoints[0].addresses[0]",
                "endpoints[0].addresses[1]",
                "endpoints[1].addresses",
                "ports[0].name",
                "ports[0].port",
                "ports[1].name",
                "ports[1].name",
                "ports[1].protocol",
            ],
            "{errors:#?}"
        );
        assert_eq!(validate(&json!({}), None), ["addressType: Required value"]);
        let old = slice("IPv4", &["10.0.0.1"], json!([]));
        let new = slice("IPv6", &["fd00::1"], json!([]));
        assert_eq!(
            validate(&new, Some(&old)),
            ["addressType: Invalid value: \"IPv6\": field is immutable"]
        );
    }
}
