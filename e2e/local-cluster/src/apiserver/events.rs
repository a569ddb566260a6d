//! Events are stored once and served both as core/v1 and as events.k8s.io/v1, as on a real
//! cluster: what kube-rs' recorder writes through events.k8s.io shows in `kubectl get
//! events` and `kubectl describe`. Storage is the core/v1 shape; these convert.

use serde_json::Value;

use super::registry::ResourceInfo;

/// (events.k8s.io/v1 field, core/v1 field) for the fields named differently.
const RENAMED: [(&str, &str); 7] = [
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("reportingController", "reportingComponent"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
];

pub fn is_events_v1(info: &ResourceInfo) -> bool {
    info.group == "events.k8s.io" && info.plural == "events"
}

fn rename(obj: &Value, to_core: bool) -> Value {
    let mut out = obj.clone();
    if let Some(map) = out.as_object_mut() {
        for (v1, core) in RENAMED {
            let (from, to) = if to_core { (v1, core) } else { (core, v1) };
            if let Some(value) = map.remove(from) {
                map.insert(to.to_owned(), value);
            }
        }
    }
    out
}

/// An events.k8s.io/v1 Event in the stored (core/v1) shape.
pub fn to_storage(obj: &Value) -> Value {
    rename(obj, true)
}

/// A stored Event as events.k8s.io/v1 shows it.
pub fn to_view(obj: &Value) -> Value {
    let mut view = rename(obj, false);
    // Events written through core/v1 name their reporter in `source` only.
    if view.get("reportingController").is_none()
        && let Some(component) = view.pointer("/deprecatedSource/component").cloned()
    {
        view["reportingController"] = component;
    }
    view
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn round_trip() {
        let v1 = json!({"metadata": {"name": "e"}, "regarding": {"kind": "Pod"}, "note": "hi", "reason": "R", "reportingController": "c", "series": {"count": 2}});
        let core = to_storage(&v1);
        assert_eq!(core["involvedObject"], json!({"kind": "Pod"}));
        assert_eq!(core["message"], "hi");
        assert_eq!(core["reportingComponent"], "c");
        assert_eq!(to_view(&core), v1);
        let from_core = to_view(&json!({"message": "m", "source": {"component": "kubelet"}}));
        assert_eq!(from_core["reportingController"], "kubelet");
        assert_eq!(from_core["note"], "m");
    }
}
