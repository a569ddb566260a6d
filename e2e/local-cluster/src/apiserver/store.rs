//! The object store: every object as JSON under one lock with one global resourceVersion
//! counter, the event history watches replay from, and the live event broadcast. Events are
//! recorded and broadcast under the same lock that subscribers take to copy history, so a
//! watch neither misses nor doubles an event.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use serde_json::{Value, json};
use tokio::sync::{Notify, broadcast};

use super::delete::Propagation;
use super::error::ApiError;
use super::events;
use super::hooks;
use super::meta;
use super::pod_spec;
use super::registry::{Registry, ResourceInfo};
use super::schema;
use super::selectors::Selectors;
use super::validation;

/// How many events the history keeps before older watch versions expire.
const HISTORY: usize = 20_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One change, as stored in history and broadcast to watches.
#[derive(Debug)]
pub struct Event {
    pub rv: u64,
    pub group: String,
    pub resource: String,
    pub namespace: String,
    pub kind: EventType,
    pub object: Value,
    /// The object before a modification, so selector-filtered watches can tell an object
    /// starting or stopping to match.
    pub old: Option<Value>,
}

/// Which part of an object a write addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Main,
    Status,
}

/// How a write is made: which part it addresses, whether it is a server-side apply
/// (creates when missing, changes field ownership), whether it is only a dry run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteMode {
    pub target: Target,
    pub apply: bool,
    pub dry_run: bool,
}

type Objects = BTreeMap<(String, String), BTreeMap<(String, String), Value>>;

pub(super) struct Inner {
    pub rv: u64,
    pub objects: Objects,
    pub history: VecDeque<Arc<Event>>,
    /// Watches from a version older than this are answered with 410 Expired.
    pub compacted: u64,
    pub registry: Registry,
    /// Uids of removed objects whose dependents the collector still has to delete.
    pub gc_queue: Vec<String>,
}

/// The in-memory store behind the API server.
pub struct Store {
    inner: Mutex<Inner>,
    pub(super) events: broadcast::Sender<Arc<Event>>,
    pub(super) gc: Notify,
}

impl Default for Store {
    fn default() -> Self {
        Self::new()
    }
}

/// Sets the apiVersion and kind of the version a client asked for.
pub fn present(info: &ResourceInfo, obj: &Value) -> Value {
    let mut out = if events::is_events_v1(info) {
        events::to_view(obj)
    } else {
        obj.clone()
    };
    out["apiVersion"] = json!(info.api_version());
    out["kind"] = json!(info.kind);
    // Defaults apply on read from storage too (a default added to the schema later shows).
    if let Some(s) = &info.schema {
        schema::default(s, &mut out);
    }
    out
}

fn generate_suffix() -> String {
    // Kubernetes' alphabet for generated names: no vowels, no confusable characters.
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    uuid::Uuid::new_v4()
        .as_bytes()
        .iter()
        .take(5)
        .map(|b| char::from(ALPHABET[usize::from(*b) % ALPHABET.len()]))
        .collect()
}

/// What every write goes through before it is stored: `metadata` pruned to `ObjectMeta`;
/// custom resources pruned, defaulted and validated against their version's schema, built-in
/// kinds pruned to their type's fields (`builtin_schema`); names,
/// labels, annotations and pod specs validated. Errors are 422 Invalid naming every bad field.
fn admit_object(info: &ResourceInfo, obj: &mut Value) -> Result<(), ApiError> {
    schema::prune_metadata(obj);
    let mut errors = Vec::new();
    if let Some(s) = &info.schema {
        errors = schema::admit(s, obj);
    } else if let Some(s) = super::builtin_schema::for_kind(info) {
        // Decoding into the kind's type drops what it lacks.
        schema::prune_root(s, obj);
    }
    errors.extend(validation::object_meta(info, obj));
    errors.extend(validation::data_size(info, obj));
    errors.extend(pod_spec::validate(info, obj));
    errors.extend(super::autoscaling::admit(info, obj));
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid_fields(info, meta::name(obj), &errors))
    }
}

/// etcd refuses objects over its request limit; the API server answers 413.
fn check_stored_size(obj: &Value) -> Result<(), ApiError> {
    let size = serde_json::to_vec(obj).map(|v| v.len()).unwrap_or(0);
    if size > validation::MAX_OBJECT_BYTES {
        return Err(ApiError::new(
            413,
            "RequestEntityTooLarge",
            "etcdserver: request is too large",
        ));
    }
    Ok(())
}

/// The apiVersion objects are stored with (clients always see the one they asked for).
fn stored_api_version(info: &ResourceInfo) -> String {
    if events::is_events_v1(info) {
        "v1".into()
    } else {
        info.api_version()
    }
}

/// The object without the times in `managedFields`, which every apply renews: an apply
/// that changes nothing else is a no-op.
fn without_apply_times(obj: &Value) -> Value {
    let mut o = obj.clone();
    if let Some(entries) = o
        .pointer_mut("/metadata/managedFields")
        .and_then(Value::as_array_mut)
    {
        for e in entries {
            if let Some(e) = e.as_object_mut() {
                e.remove("time");
            }
        }
    }
    o
}

/// The part of an object whose changes move `metadata.generation`.
fn spec_part(obj: &Value) -> Value {
    let mut o = obj.clone();
    if let Some(m) = o.as_object_mut() {
        for k in ["metadata", "status", "apiVersion", "kind"] {
            m.remove(k);
        }
    }
    o
}

impl Store {
    pub fn new() -> Self {
        let (events, _) = broadcast::channel(16_384);
        let store = Self {
            inner: Mutex::new(Inner {
                rv: 1,
                objects: BTreeMap::new(),
                history: VecDeque::new(),
                compacted: 0,
                registry: Registry::default(),
                gc_queue: Vec::new(),
            }),
            events,
            gc: Notify::new(),
        };
        if let Some(info) = store.registry().find("", "v1", "namespaces").cloned() {
            for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
                let obj = json!({"metadata": {"name": ns}});
                // Cannot fail on an empty store with valid names.
                let _ = store.create(&info, None, obj, false);
            }
        }
        store
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn registry(&self) -> Registry {
        self.lock().registry.clone()
    }

    pub fn resource_version(&self) -> u64 {
        self.lock().rv
    }

    /// Forgets all history: watches from any version before now get 410 Expired.
    pub fn compact(&self) {
        let mut inner = self.lock();
        inner.history.clear();
        inner.compacted = inner.rv;
    }

    pub(super) fn emit(
        &self,
        inner: &mut Inner,
        info: &ResourceInfo,
        kind: EventType,
        object: Value,
        old: Option<Value>,
    ) {
        if kind != EventType::Deleted {
            self.collect_if_owners_gone(inner, &object);
        }
        let event = Arc::new(Event {
            rv: inner.rv,
            group: info.group_resource().0,
            resource: info.group_resource().1,
            namespace: meta::namespace(&object).to_owned(),
            kind,
            object,
            old,
        });
        inner.history.push_back(event.clone());
        while inner.history.len() > HISTORY {
            if let Some(dropped) = inner.history.pop_front() {
                inner.compacted = dropped.rv;
            }
        }
        // No receivers is fine: nobody watches.
        let _ = self.events.send(event);
    }

    pub fn get(&self, info: &ResourceInfo, ns: &str, name: &str) -> Result<Value, ApiError> {
        let inner = self.lock();
        inner
            .objects
            .get(&info.group_resource())
            .and_then(|m| m.get(&(ns.to_owned(), name.to_owned())))
            .map(|o| present(info, o))
            .ok_or_else(|| ApiError::not_found(info, name))
    }

    /// Matching objects (all namespaces when `ns` is `None`) and the list resourceVersion.
    pub fn list(
        &self,
        info: &ResourceInfo,
        ns: Option<&str>,
        sel: &Selectors,
    ) -> (Vec<Value>, u64) {
        let inner = self.lock();
        let items = inner
            .objects
            .get(&info.group_resource())
            .into_iter()
            .flat_map(|m| m.iter())
            .filter(|((o_ns, _), _)| ns.is_none_or(|n| n == o_ns))
            .filter(|(_, o)| sel.matches(o))
            .map(|(_, o)| present(info, o))
            .collect();
        (items, inner.rv)
    }

    pub fn create(
        &self,
        info: &ResourceInfo,
        ns: Option<&str>,
        obj: Value,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        let mut inner = self.lock();
        self.create_locked(&mut inner, info, ns, obj, dry_run, false)
    }

    fn create_locked(
        &self,
        inner: &mut Inner,
        info: &ResourceInfo,
        ns: Option<&str>,
        mut obj: Value,
        dry_run: bool,
        applied: bool,
    ) -> Result<Value, ApiError> {
        if !obj.is_object() {
            return Err(ApiError::bad_request(
                "the request body must be a JSON object",
            ));
        }
        if events::is_events_v1(info) {
            obj = events::to_storage(&obj);
        }
        if let Some(kind) = obj.get("kind").and_then(Value::as_str)
            && kind != info.kind
        {
            return Err(ApiError::bad_request(format!(
                "the kind {kind:?} of the object does not match the resource {:?} (kind {:?})",
                info.qualified(),
                info.kind
            )));
        }
        let body_ns = meta::namespace(&obj).to_owned();
        let ns = if info.namespaced {
            let ns = ns.unwrap_or("");
            if !body_ns.is_empty() && body_ns != ns {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            ns.to_owned()
        } else {
            String::new()
        };
        let mut name = meta::name(&obj).to_owned();
        if name.is_empty() {
            let prefix = obj
                .pointer("/metadata/generateName")
                .and_then(Value::as_str)
                .unwrap_or("");
            if prefix.is_empty() {
                return Err(ApiError::invalid(
                    info,
                    "",
                    "metadata.name: Required value: name or generateName is required",
                ));
            }
            name = format!("{prefix}{}", generate_suffix());
        }
        let name_errors = validation::name(info, &name);
        if !name_errors.is_empty() {
            let errors: Vec<String> = name_errors
                .iter()
                .map(|p| format!("metadata.name: Invalid value: {name:?}: {p}"))
                .collect();
            return Err(ApiError::invalid_fields(info, &name, &errors));
        }
        if info.namespaced {
            if ns.is_empty() {
                return Err(ApiError::bad_request(
                    "a namespace is required for a namespaced resource",
                ));
            }
            let namespace = inner
                .objects
                .get(&(String::new(), "namespaces".to_owned()))
                .and_then(|m| m.get(&(String::new(), ns.clone())))
                .ok_or_else(|| ApiError::namespace_not_found(&ns))?;
            if meta::is_deleting(namespace) {
                return Err(ApiError::forbidden(format!(
                    "{} \"{name}\" is forbidden: unable to create new content in namespace {ns} because it is being terminated",
                    info.qualified()
                )));
            }
        }
        let key = (ns.clone(), name.clone());
        if inner
            .objects
            .get(&info.group_resource())
            .is_some_and(|m| m.contains_key(&key))
        {
            return Err(ApiError::already_exists(info, &name));
        }
        if hooks::is_crd(info) {
            let group = obj
                .pointer("/spec/group")
                .and_then(Value::as_str)
                .unwrap_or("");
            let plural = obj
                .pointer("/spec/names/plural")
                .and_then(Value::as_str)
                .unwrap_or("");
            if inner
                .registry
                .all()
                .any(|r| r.group == group && r.plural == plural)
            {
                return Err(ApiError::invalid(
                    info,
                    &name,
                    format!(
                        "spec.names.plural: Invalid value: {plural:?}: {plural}.{group} is already served"
                    ),
                ));
            }
        }
        hooks::on_create(info, &mut obj)?;
        meta::set(&mut obj, "name", json!(name));
        meta::set(&mut obj, "namespace", json!(ns));
        meta::set(&mut obj, "uid", json!(uuid::Uuid::new_v4().to_string()));
        meta::set(&mut obj, "creationTimestamp", json!(meta::now()));
        meta::set(&mut obj, "generation", json!(1));
        for k in ["deletionTimestamp", "deletionGracePeriodSeconds"] {
            meta::remove(&mut obj, k);
        }
        if !applied {
            meta::remove(&mut obj, "managedFields");
        }
        obj["apiVersion"] = json!(stored_api_version(info));
        obj["kind"] = json!(info.kind);
        admit_object(info, &mut obj)?;
        meta::normalise(&mut obj);
        check_stored_size(&obj)?;
        if dry_run {
            meta::set(&mut obj, "resourceVersion", json!(inner.rv.to_string()));
            return Ok(obj);
        }
        inner.rv += 1;
        meta::set(&mut obj, "resourceVersion", json!(inner.rv.to_string()));
        inner
            .objects
            .entry(info.group_resource())
            .or_default()
            .insert(key, obj.clone());
        if hooks::is_crd(info) {
            super::crds::register(inner, &obj);
        }
        self.emit(inner, info, EventType::Added, obj.clone(), None);
        if hooks::is_namespace(info)
            && let Some(sa) = inner.registry.find("", "v1", "serviceaccounts").cloned()
        {
            // The ServiceAccount controller's `default` account in every new namespace.
            let default = json!({"metadata": {"name": "default"}});
            self.create_locked(inner, &sa, Some(&name), default, false, false)?;
        }
        Ok(present(info, &obj))
    }

    /// Read-modify-write of one object under the lock: `change` gets the current object
    /// (`None` when missing) and returns the desired one. For a server-side `apply`, a
    /// missing object is created and the desired `managedFields` are kept; otherwise a
    /// missing object is NotFound and `managedFields` cannot be changed.
    pub fn modify(
        &self,
        info: &ResourceInfo,
        ns: &str,
        name: &str,
        mode: WriteMode,
        change: impl FnOnce(Option<&Value>) -> Result<Value, ApiError>,
    ) -> Result<Value, ApiError> {
        let mut inner = self.lock();
        let key = (ns.to_owned(), name.to_owned());
        let current = inner
            .objects
            .get(&info.group_resource())
            .and_then(|m| m.get(&key))
            .cloned();
        let Some(current) = current else {
            if !mode.apply || mode.target == Target::Status {
                return Err(ApiError::not_found(info, name));
            }
            let mut obj = change(None)?;
            if !meta::name(&obj).is_empty() && meta::name(&obj) != name {
                return Err(ApiError::bad_request(
                    "the name of the object does not match the name on the URL",
                ));
            }
            meta::set(&mut obj, "name", json!(name));
            let ns = info.namespaced.then_some(ns);
            return self.create_locked(&mut inner, info, ns, obj, mode.dry_run, true);
        };
        let desired = change(Some(&present(info, &current)))?;
        self.write_existing(&mut inner, info, &current, desired, mode)
    }

    /// The common path of every update: status isolation, optimistic concurrency,
    /// immutable metadata, generation, no-op detection, and removal once a deleting object
    /// has no finalizers left.
    fn write_existing(
        &self,
        inner: &mut Inner,
        info: &ResourceInfo,
        old: &Value,
        desired: Value,
        mode: WriteMode,
    ) -> Result<Value, ApiError> {
        let WriteMode {
            target,
            apply: applied,
            dry_run,
        } = mode;
        let desired = if events::is_events_v1(info) {
            events::to_storage(&desired)
        } else {
            desired
        };
        let name = meta::name(old).to_owned();
        // Only server-side apply changes field ownership.
        let managed = if applied {
            desired.pointer("/metadata/managedFields").cloned()
        } else {
            old.pointer("/metadata/managedFields").cloned()
        };
        if !desired.is_object() || desired.get("metadata").is_some_and(|m| !m.is_object()) {
            return Err(ApiError::bad_request(
                "the object must be a JSON object with a metadata object",
            ));
        }
        let desired_name = meta::name(&desired);
        if !desired_name.is_empty() && desired_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({desired_name}) does not match the name on the URL ({name})"
            )));
        }
        let desired_rv = meta::resource_version(&desired);
        if !desired_rv.is_empty() && desired_rv != meta::resource_version(old) {
            return Err(ApiError::stale(info, &name));
        }
        let mut new = match target {
            Target::Status => {
                let mut new = old.clone();
                match desired.get("status") {
                    Some(status) => new["status"] = status.clone(),
                    None => {
                        if let Some(o) = new.as_object_mut() {
                            o.remove("status");
                        }
                    }
                }
                new
            }
            Target::Main => {
                let mut new = desired;
                if info.status {
                    match old.get("status") {
                        Some(status) => new["status"] = status.clone(),
                        None => {
                            if let Some(o) = new.as_object_mut() {
                                o.remove("status");
                            }
                        }
                    }
                }
                hooks::on_update(info, old, &mut new)?;
                new
            }
        };
        for k in [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "namespace",
            "name",
        ] {
            match old.pointer(&format!("/metadata/{k}")) {
                Some(v) => meta::set(&mut new, k, v.clone()),
                None => {
                    meta::remove(&mut new, k);
                }
            }
        }
        match managed {
            Some(m) => meta::set(&mut new, "managedFields", m),
            None => {
                meta::remove(&mut new, "managedFields");
            }
        }
        admit_object(info, &mut new)?;
        let old_generation = old
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        let generation = if spec_part(old) == spec_part(&new) {
            old_generation
        } else {
            old_generation + 1
        };
        meta::set(&mut new, "generation", json!(generation));
        meta::set(
            &mut new,
            "resourceVersion",
            json!(meta::resource_version(old)),
        );
        new["apiVersion"] = json!(stored_api_version(info));
        new["kind"] = json!(info.kind);
        meta::normalise(&mut new);
        check_stored_size(&new)?;
        if without_apply_times(&new) == without_apply_times(old) || dry_run {
            return Ok(present(info, &new));
        }
        let key = (meta::namespace(old).to_owned(), name);
        if meta::is_deleting(&new)
            && meta::finalizers(&new).is_empty()
            && !super::crds::server_finalized(info)
        {
            return Ok(self.remove(inner, info, &key, new, Propagation::Background));
        }
        inner.rv += 1;
        meta::set(&mut new, "resourceVersion", json!(inner.rv.to_string()));
        inner
            .objects
            .entry(info.group_resource())
            .or_default()
            .insert(key, new.clone());
        if hooks::is_crd(info) {
            super::crds::register(inner, &new);
        }
        self.emit(
            inner,
            info,
            EventType::Modified,
            new.clone(),
            Some(old.clone()),
        );
        if meta::is_deleting(&new) {
            // A terminating namespace or CRD may just have lost its last finalizer.
            self.gc.notify_one();
        }
        Ok(present(info, &new))
    }
}
