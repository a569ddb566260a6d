//! The garbage collector: deletes the dependents (by ownerReferences) of removed objects,
//! the content of terminating namespaces and the custom resources of deleted CRDs, then
//! removes such namespaces and CRDs once empty. Runs in the background, as on a cluster.

use std::sync::Arc;

use serde_json::{Value, json};

use super::delete::{DeleteOptions, Propagation};
use super::meta;
use super::registry::ResourceInfo;
use super::store::{EventType, Inner, Store};

type Found = Vec<(ResourceInfo, String, String)>;

fn info_for(inner: &Inner, group: &str, plural: &str) -> Option<ResourceInfo> {
    inner
        .registry
        .all()
        .find(|r| r.group == group && r.plural == plural)
        .cloned()
}

/// Every object matching `pred`, with the resource it belongs to.
fn find(inner: &Inner, pred: impl Fn(&(String, String), &Value) -> bool) -> Found {
    let mut out = Vec::new();
    for ((group, plural), objects) in &inner.objects {
        let Some(info) = info_for(inner, group, plural) else {
            continue;
        };
        for (key, obj) in objects {
            if pred(&(group.clone(), plural.clone()), obj) {
                out.push((info.clone(), key.0.clone(), key.1.clone()));
            }
        }
    }
    out
}

impl Store {
    /// Collects whenever something was deleted, until its task is aborted (the server's
    /// drop does that).
    pub(super) async fn run_collector(self: Arc<Self>) {
        loop {
            self.gc.notified().await;
            self.collect_garbage();
        }
    }

    /// One pass of the collector.
    fn collect_garbage(&self) {
        let mut inner = self.lock();
        let opts = DeleteOptions::default();
        loop {
            let queue = std::mem::take(&mut inner.gc_queue);
            if queue.is_empty() {
                break;
            }
            for uid in queue {
                let dependents = find(&inner, |_, o| meta::owner_uids(o).contains(&uid.as_str()));
                for (info, ns, name) in dependents {
                    let _ = self.delete_locked(&mut inner, &info, &ns, &name, &opts);
                }
            }
        }
        let namespaces = find(&inner, |(g, p), o| {
            g.is_empty() && p == "namespaces" && meta::is_deleting(o)
        });
        for (ns_info, _, ns) in namespaces {
            let content = find(&inner, |(g, p), o| {
                !(g.is_empty() && p == "namespaces") && meta::namespace(o) == ns
            });
            let empty = content.is_empty();
            for (info, o_ns, name) in content {
                let _ = self.delete_locked(&mut inner, &info, &o_ns, &name, &opts);
            }
            self.finish_if_done(&mut inner, &ns_info, &ns, empty);
        }
        let crds = find(&inner, |(g, p), o| {
            g == "apiextensions.k8s.io" && p == "customresourcedefinitions" && meta::is_deleting(o)
        });
        for (crd_info, _, name) in crds {
            let Some(crd) = inner
                .objects
                .get(&crd_info.group_resource())
                .and_then(|m| m.get(&(String::new(), name.clone())))
                .cloned()
            else {
                continue;
            };
            let served = super::crds::served(&crd);
            let content = find(&inner, |gr, _| *gr == served);
            let empty = content.is_empty();
            for (info, o_ns, o_name) in content {
                let _ = self.delete_locked(&mut inner, &info, &o_ns, &o_name, &opts);
            }
            self.finish_if_done(&mut inner, &crd_info, &name, empty);
        }
    }

    /// A real garbage collector also deletes an object written with owner references none of
    /// whose owners exists (any more): a child created, or re-applied, after its owner went.
    /// Queues its owners' uids, so the collector deletes it as their dependent.
    pub(super) fn collect_if_owners_gone(&self, inner: &mut Inner, object: &Value) {
        let owners = meta::owner_uids(object);
        if owners.is_empty() {
            return;
        }
        let exists = |uid: &str| {
            inner
                .objects
                .values()
                .flat_map(|m| m.values())
                .any(|o| o.pointer("/metadata/uid").and_then(Value::as_str) == Some(uid))
        };
        if owners.iter().any(|uid| exists(uid)) {
            return;
        }
        inner
            .gc_queue
            .extend(owners.iter().map(|u| (*u).to_owned()));
        self.gc.notify_one();
    }

    /// Removes a terminating namespace or CRD once nothing is left in it and no finalizer.
    fn finish_if_done(&self, inner: &mut Inner, info: &ResourceInfo, name: &str, empty: bool) {
        let key = (String::new(), name.to_owned());
        let Some(obj) = inner
            .objects
            .get(&info.group_resource())
            .and_then(|m| m.get(&key))
            .cloned()
        else {
            return;
        };
        // Content still present is removed later, and each removal wakes the collector.
        if empty && meta::finalizers(&obj).is_empty() {
            self.remove(inner, info, &key, obj, Propagation::Background);
        }
    }

    /// Strips the owner reference to `uid` from every dependent (`propagationPolicy: Orphan`).
    pub(super) fn orphan(&self, inner: &mut Inner, uid: &str) {
        let dependents = find(inner, |_, o| meta::owner_uids(o).contains(&uid));
        for (info, ns, name) in dependents {
            let key = (ns, name);
            let Some(old) = inner
                .objects
                .get(&info.group_resource())
                .and_then(|m| m.get(&key))
                .cloned()
            else {
                continue;
            };
            let mut new = old.clone();
            if let Some(refs) = new
                .pointer_mut("/metadata/ownerReferences")
                .and_then(Value::as_array_mut)
            {
                refs.retain(|r| r.get("uid").and_then(Value::as_str) != Some(uid));
            }
            meta::normalise(&mut new);
            inner.rv += 1;
            meta::set(&mut new, "resourceVersion", json!(inner.rv.to_string()));
            inner
                .objects
                .entry(info.group_resource())
                .or_default()
                .insert(key, new.clone());
            self.emit(inner, &info, EventType::Modified, new, Some(old));
        }
    }
}
