//! Deletion: delete options and preconditions, finalizers holding an object in a deleting
//! state, a running pod's graceful deletion (it stays, terminating, until its kubelet has
//! stopped it and deletes it with a zero grace period), removal with its DELETED event,
//! delete-collection. What removal leaves to do
//! (dependents, namespace content) is the garbage collector's (`gc`).

use serde_json::{Value, json};

use super::crds;
use super::error::ApiError;
use super::hooks;
use super::meta;
use super::registry::ResourceInfo;
use super::selectors::Selectors;
use super::store::{EventType, Inner, Store, present};

/// What becomes of an object's dependents when it is removed (`Foreground` is served as
/// `Background`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Propagation {
    #[default]
    Background,
    Orphan,
}

/// The parts of `DeleteOptions` the server honours.
#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    pub propagation: Propagation,
    pub dry_run: bool,
    /// `gracePeriodSeconds`: for a running pod, how long its kubelet has to stop it (the
    /// pod's `terminationGracePeriodSeconds` when unset; zero removes it at once).
    pub grace_period_seconds: Option<i64>,
}

impl Store {
    /// Removes an object for good: a DELETED event at a new version, dependents queued for
    /// the garbage collector (or orphaned).
    pub(super) fn remove(
        &self,
        inner: &mut Inner,
        info: &ResourceInfo,
        key: &(String, String),
        mut obj: Value,
        propagation: Propagation,
    ) -> Value {
        if let Some(m) = inner.objects.get_mut(&info.group_resource()) {
            m.remove(key);
        }
        inner.rv += 1;
        meta::set(&mut obj, "resourceVersion", json!(inner.rv.to_string()));
        let uid = meta::uid(&obj).to_owned();
        if hooks::is_crd(info) {
            inner.registry.remove_crd(meta::name(&obj));
        }
        self.emit(inner, info, EventType::Deleted, obj.clone(), None);
        match propagation {
            Propagation::Background => inner.gc_queue.push(uid),
            Propagation::Orphan => self.orphan(inner, &uid),
        }
        self.gc.notify_one();
        present(info, &obj)
    }

    /// Deletes one object: marks it deleting while finalizers remain, else removes it.
    pub fn delete(
        &self,
        info: &ResourceInfo,
        ns: &str,
        name: &str,
        opts: &DeleteOptions,
    ) -> Result<Value, ApiError> {
        let mut inner = self.lock();
        self.delete_locked(&mut inner, info, ns, name, opts)
    }

    pub(super) fn delete_locked(
        &self,
        inner: &mut Inner,
        info: &ResourceInfo,
        ns: &str,
        name: &str,
        opts: &DeleteOptions,
    ) -> Result<Value, ApiError> {
        let key = (ns.to_owned(), name.to_owned());
        let obj = inner
            .objects
            .get(&info.group_resource())
            .and_then(|m| m.get(&key))
            .cloned()
            .ok_or_else(|| ApiError::not_found(info, name))?;
        if let Some(uid) = &opts.uid
            && uid != meta::uid(&obj)
        {
            return Err(ApiError::conflict(
                info,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    meta::uid(&obj)
                ),
            ));
        }
        if let Some(rv) = &opts.resource_version
            && rv != meta::resource_version(&obj)
        {
            return Err(ApiError::conflict(
                info,
                name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    meta::resource_version(&obj)
                ),
            ));
        }
        if opts.dry_run {
            return Ok(present(info, &obj));
        }
        if let Some(grace) = graceful(info, &obj, opts) {
            return Ok(self.terminate(inner, info, key, obj, grace));
        }
        let waits = !meta::finalizers(&obj).is_empty() || crds::server_finalized(info);
        if !waits {
            return Ok(self.remove(inner, info, &key, obj, opts.propagation));
        }
        if meta::is_deleting(&obj) {
            return Ok(present(info, &obj));
        }
        let obj = self.mark_deleting(inner, info, key, obj, 0);
        self.gc.notify_one();
        Ok(present(info, &obj))
    }

    /// Writes `obj` as deleting, with `grace` seconds until its `deletionTimestamp` (a
    /// namespace turns `Terminating`), at a new version with its MODIFIED event.
    fn mark_deleting(
        &self,
        inner: &mut Inner,
        info: &ResourceInfo,
        key: (String, String),
        obj: Value,
        grace: i64,
    ) -> Value {
        let old = obj.clone();
        let mut obj = obj;
        let at = meta::in_seconds(grace);
        meta::set(&mut obj, "deletionTimestamp", json!(at));
        meta::set(&mut obj, "deletionGracePeriodSeconds", json!(grace));
        if hooks::is_namespace(info) {
            obj["status"] = json!({"phase": "Terminating"});
        }
        inner.rv += 1;
        meta::set(&mut obj, "resourceVersion", json!(inner.rv.to_string()));
        inner
            .objects
            .entry(info.group_resource())
            .or_default()
            .insert(key, obj.clone());
        self.emit(inner, info, EventType::Modified, obj.clone(), Some(old));
        obj
    }

    /// Starts a running pod's graceful deletion, or shortens it: `deletionTimestamp` is when
    /// its grace period ends; the pod stays until its kubelet deletes it.
    fn terminate(
        &self,
        inner: &mut Inner,
        info: &ResourceInfo,
        key: (String, String),
        obj: Value,
        grace: i64,
    ) -> Value {
        let current = obj
            .pointer("/metadata/deletionGracePeriodSeconds")
            .and_then(Value::as_i64);
        if meta::is_deleting(&obj) && current.is_some_and(|c| c <= grace) {
            return present(info, &obj);
        }
        let obj = self.mark_deleting(inner, info, key, obj, grace);
        present(info, &obj)
    }

    /// Deletes every matching object of a resource in a namespace (or everywhere).
    pub fn delete_collection(
        &self,
        info: &ResourceInfo,
        ns: Option<&str>,
        sel: &Selectors,
        opts: &DeleteOptions,
    ) -> Vec<Value> {
        let mut inner = self.lock();
        let keys: Vec<(String, String)> = inner
            .objects
            .get(&info.group_resource())
            .into_iter()
            .flat_map(|m| m.iter())
            .filter(|((o_ns, _), o)| ns.is_none_or(|n| n == o_ns) && sel.matches(o))
            .map(|(k, _)| k.clone())
            .collect();
        keys.iter()
            .filter_map(|(o_ns, name)| self.delete_locked(&mut inner, info, o_ns, name, opts).ok())
            .collect()
    }
}

/// The grace period of a pod's deletion, when it is graceful: the pod runs on a node (its
/// kubelet wrote its `hostIP`) and has not ended, and the grace period is not zero. A pod no
/// kubelet runs, or one that has ended, is removed at once, as a real API server does.
fn graceful(info: &ResourceInfo, obj: &Value, opts: &DeleteOptions) -> Option<i64> {
    if !hooks::is_pod(info) {
        return None;
    }
    let text = |p: &str| obj.pointer(p).and_then(Value::as_str).unwrap_or_default();
    if text("/status/hostIP").is_empty() || matches!(text("/status/phase"), "Succeeded" | "Failed")
    {
        return None;
    }
    let grace = opts
        .grace_period_seconds
        .or_else(|| {
            obj.pointer("/spec/terminationGracePeriodSeconds")
                .and_then(Value::as_i64)
        })
        .unwrap_or(30);
    (grace > 0).then_some(grace)
}
