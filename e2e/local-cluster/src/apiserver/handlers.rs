//! The REST surface: parses a request path into discovery or a resource operation, then
//! dispatches to the store (get, list, watch, create, update, patch, delete).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::ServerState;
use super::admission::{self, Attributes, Operation};
use super::delete::{DeleteOptions, Propagation};
use super::discovery;
use super::error::ApiError;
use super::patch::{self, PatchKind};
use super::registry::ResourceInfo;
use super::selectors::{FieldSelector, LabelSelector, Selectors};
use super::store::{Target, WriteMode};
use super::table::{self, IncludeObject};
use super::watch::WatchStart;
use super::watch::{self, WatchRequest};

mod scale;

/// A resource request, from its path.
#[derive(Debug, Clone, PartialEq)]
struct Route {
    group: String,
    version: String,
    namespace: Option<String>,
    resource: String,
    name: Option<String>,
    subresource: Option<String>,
}

/// What a path addresses.
#[derive(Debug, Clone, PartialEq)]
enum Path {
    Version,
    Health,
    CoreVersions,
    Groups,
    Group(String),
    Resources(String, String),
    Resource(Route),
    OpenApiIndex,
    OpenApi,
    Unknown,
}

fn parse_path(path: &str) -> Path {
    let segs: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let (group, version, rest) = match segs.as_slice() {
        ["version"] => return Path::Version,
        ["healthz" | "livez" | "readyz", ..] => return Path::Health,
        ["api"] => return Path::CoreVersions,
        ["openapi", "v3"] => return Path::OpenApiIndex,
        ["openapi", "v3", ..] => return Path::OpenApi,
        ["apis"] => return Path::Groups,
        ["apis", g] => return Path::Group((*g).to_owned()),
        ["api", v] => return Path::Resources(String::new(), (*v).to_owned()),
        ["apis", g, v] => return Path::Resources((*g).to_owned(), (*v).to_owned()),
        ["api", v, rest @ ..] => (String::new(), (*v).to_owned(), rest),
        ["apis", g, v, rest @ ..] => ((*g).to_owned(), (*v).to_owned(), rest),
        _ => return Path::Unknown,
    };
    let own = |s: &&str| (*s).to_owned();
    let (namespace, resource, name, subresource) = match rest {
        // `namespaces/<ns>/status|finalize` addresses the namespace itself.
        ["namespaces", ns, sub @ ("status" | "finalize")] => {
            (None, "namespaces".to_owned(), Some(own(ns)), Some(own(sub)))
        }
        ["namespaces", ns, resource, tail @ ..] => (
            Some(own(ns)),
            own(resource),
            tail.first().map(own),
            tail.get(1).map(own),
        ),
        [resource, tail @ ..] => (
            None,
            own(resource),
            tail.first().map(own),
            tail.get(1).map(own),
        ),
        [] => return Path::Unknown,
    };
    if rest.len() > 5 {
        return Path::Unknown;
    }
    Path::Resource(Route {
        group,
        version,
        namespace,
        resource,
        name,
        subresource,
    })
}

fn json_response(code: StatusCode, value: &Value) -> Response {
    (code, axum::Json(value)).into_response()
}

fn ok(value: &Value) -> Response {
    json_response(StatusCode::OK, value)
}

fn not_found_path(path: &str) -> Response {
    ApiError::new(
        404,
        "NotFound",
        format!("the server could not find the requested resource ({path})"),
    )
    .into_response()
}

/// Marks requests that came over the loopback plain-HTTP listener (the administrator's).
#[derive(Debug, Clone, Copy)]
pub struct PlainHttp;

/// The verb RBAC checks for a request.
fn verb(method: &Method, route: &Route, is_watch: bool) -> &'static str {
    match (method.as_str(), route.name.is_some()) {
        ("GET", _) if is_watch => "watch",
        ("GET" | "HEAD", true) => "get",
        ("GET" | "HEAD", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => "unknown",
    }
}

/// Who is asking, and whether they may: 401 for a bad token, 403 when RBAC denies.
fn authorize(
    state: &ServerState,
    plain_http: bool,
    headers: &HeaderMap,
    method: &Method,
    path: &str,
    parsed: &Path,
    is_watch: bool,
) -> Result<super::rbac::User, ApiError> {
    if plain_http {
        return Ok(super::rbac::User::admin());
    }
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let user = state.tokens.authenticate(&state.store, authorization)?;
    let attrs = match parsed {
        Path::Resource(route) => super::rbac::Attributes::Resource {
            verb: verb(method, route, is_watch).into(),
            group: route.group.clone(),
            resource: route.resource.clone(),
            subresource: route.subresource.clone(),
            namespace: route.namespace.clone(),
            name: route.name.clone(),
        },
        _ => super::rbac::Attributes::NonResource {
            verb: method.as_str().to_lowercase(),
            path: path.to_owned(),
        },
    };
    if super::rbac::allowed(&state.store, &user, &attrs) {
        Ok(user)
    } else {
        Err(super::rbac::forbidden(&user, &attrs))
    }
}

/// The single entry point of the router.
pub async fn handle(
    State(state): State<Arc<ServerState>>,
    plain_http: Option<axum::Extension<PlainHttp>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    state
        .requests
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(format!("{method} {uri}"));
    let body = match body {
        Ok(body) => body,
        Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return ApiError::new(
                413,
                "RequestEntityTooLarge",
                format!(
                    "Request entity too large: limit is {}",
                    super::validation::MAX_REQUEST_BYTES
                ),
            )
            .into_response();
        }
        Err(e) => return ApiError::bad_request(e.body_text()).into_response(),
    };
    let query: HashMap<String, String> = Query::try_from_uri(&uri).map(|q| q.0).unwrap_or_default();
    let registry = state.store.registry();
    let path = uri.path();
    let parsed = parse_path(path);
    let is_watch = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
    let user = match authorize(
        &state,
        plain_http.is_some(),
        &headers,
        &method,
        path,
        &parsed,
        is_watch,
    ) {
        Ok(user) => user,
        Err(e) => return e.into_response(),
    };
    state.faults.wait_if_held(path, &user.name).await;
    match parsed {
        Path::Version => ok(&discovery::version()),
        Path::Health => (StatusCode::OK, "ok").into_response(),
        Path::CoreVersions => ok(&discovery::core_versions()),
        Path::Groups => ok(&discovery::group_list(&registry)),
        Path::Group(g) => {
            discovery::api_group(&registry, &g).map_or_else(|| not_found_path(path), |v| ok(&v))
        }
        Path::Resources(g, v) => discovery::resource_list(&registry, &g, &v)
            .map_or_else(|| not_found_path(path), |v| ok(&v)),
        Path::OpenApiIndex => ok(&super::openapi::index(&registry)),
        Path::OpenApi => super::openapi::group_version(&registry, path)
            .map_or_else(|| not_found_path(path), |v| ok(&v)),
        Path::Unknown => not_found_path(path),
        Path::Resource(route) => {
            let Some(info) = registry
                .find(&route.group, &route.version, &route.resource)
                .cloned()
            else {
                return not_found_path(path);
            };
            if let Some(delay) = state.faults.request_delay(&route.resource) {
                tokio::time::sleep(delay).await;
            }
            let faulted = super::faults::FaultedRequest {
                is_watch: is_watch && method == Method::GET,
                is_write: matches!(
                    method,
                    Method::POST | Method::PUT | Method::PATCH | Method::DELETE
                ),
                user: &user.name,
            };
            if let Some(code) = state.faults.denied(path) {
                return ApiError::injected(code).into_response();
            }
            if let Some(code) = state.faults.take(&faulted) {
                let err = ApiError::injected(code);
                return if is_watch && code == 410 {
                    watch::error_stream(&ApiError::expired(0, state.store.resource_version()))
                } else {
                    err.into_response()
                };
            }
            let req = Request {
                state: &state,
                user,
                info,
                route,
                query,
                headers,
                body,
                warnings: std::sync::Mutex::default(),
            };
            let mut response = match req.dispatch(&method, is_watch).await {
                Ok(response) => response,
                Err(err) => err.into_response(),
            };
            let warnings = std::mem::take(
                &mut *req
                    .warnings
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
            );
            for value in warning_headers(warnings) {
                response.headers_mut().append(header::WARNING, value);
            }
            response
        }
    }
}

struct Request<'a> {
    state: &'a Arc<ServerState>,
    user: super::rbac::User,
    info: ResourceInfo,
    route: Route,
    query: HashMap<String, String>,
    headers: HeaderMap,
    body: Bytes,
    /// Admission warnings for the response's `Warning` headers.
    warnings: std::sync::Mutex<Vec<String>>,
}

/// How many times a write whose object changed while its validating webhooks were called
/// is tried again (kube-apiserver's update retries the same way) before a 409.
const ADMISSION_RETRIES: usize = 5;
/// kube-apiserver's bound on all warnings of one response; past it, each is cut to
/// [`MAX_WARNING_CHARS`] and those that still do not fit are dropped.
const MAX_WARNING_BYTES: usize = 4 * 1024;
const MAX_WARNING_CHARS: usize = 256;

/// `Warning: 299 - "<text>"` header values, as kube-apiserver writes admission warnings:
/// duplicates once, control characters replaced, `"` and `\` escaped, bounded in size.
fn warning_headers(warnings: Vec<String>) -> Vec<HeaderValue> {
    let mut unique: Vec<String> = Vec::new();
    for w in warnings {
        let clean: String = w
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        if !clean.is_empty() && !unique.contains(&clean) {
            unique.push(clean);
        }
    }
    if unique.iter().map(String::len).sum::<usize>() > MAX_WARNING_BYTES {
        for w in &mut unique {
            if w.chars().count() > MAX_WARNING_CHARS {
                *w = w.chars().take(MAX_WARNING_CHARS).collect();
            }
        }
        let mut total = 0;
        unique.retain(|w| {
            total += w.len();
            total <= MAX_WARNING_BYTES
        });
    }
    unique
        .iter()
        .filter_map(|w| {
            let quoted = w.replace('\\', "\\\\").replace('"', "\\\"");
            HeaderValue::from_bytes(format!("299 - \"{quoted}\"").as_bytes()).ok()
        })
        .collect()
}

impl Request<'_> {
    fn warn(&self, warnings: Vec<String>) {
        self.warnings
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend(warnings);
    }

    fn attributes(&self, operation: Operation) -> Attributes<'_> {
        Attributes {
            info: &self.info,
            subresource: self.route.subresource.as_deref(),
            operation,
            namespace: self.namespace(),
            dry_run: self.dry_run(),
        }
    }

    /// A read-modify-write through the store, admitted by the validating webhooks first:
    /// the write is made as a dry run, the webhooks judge the object it would store (and the
    /// stored one), then the write is made for real unless the object changed meanwhile, in
    /// which case all of it is tried again.
    async fn modify_admitted(
        &self,
        name: &str,
        mode: WriteMode,
        change: impl Fn(Option<&Value>) -> Result<Value, ApiError>,
    ) -> Result<Value, ApiError> {
        let store = &self.state.store;
        let (ns, info) = (self.namespace(), &self.info);
        let selected =
            admission::validating_selected(self.state, &self.attributes(Operation::Update))
                || (mode.apply
                    && admission::validating_selected(
                        self.state,
                        &self.attributes(Operation::Create),
                    ));
        if !selected {
            return store.modify(info, ns, name, mode, change);
        }
        for _ in 0..ADMISSION_RETRIES {
            let mut seen = None;
            let dry = WriteMode {
                dry_run: true,
                ..mode
            };
            let prepared = store.modify(info, ns, name, dry, |current| {
                seen = Some(current.cloned());
                change(current)
            })?;
            let old = seen.flatten();
            let operation = if old.is_some() {
                Operation::Update
            } else {
                Operation::Create
            };
            let mut warnings = Vec::new();
            let verdict = admission::validate(
                self.state,
                &self.attributes(operation),
                &prepared,
                old.as_ref(),
                &mut warnings,
            )
            .await;
            let expected = old
                .as_ref()
                .map(|o| super::meta::resource_version(o).to_owned());
            let raced = std::cell::Cell::new(false);
            let written = verdict.and_then(|()| {
                store.modify(info, ns, name, mode, |current| {
                    if current.map(|c| super::meta::resource_version(c).to_owned()) != expected {
                        raced.set(true);
                        return Err(ApiError::stale(info, name));
                    }
                    change(current)
                })
            });
            if raced.get() {
                continue;
            }
            self.warn(warnings);
            return written;
        }
        Err(ApiError::stale(info, name))
    }

    fn param(&self, key: &str) -> Option<&str> {
        self.query
            .get(key)
            .map(String::as_str)
            .filter(|s| !s.is_empty())
    }

    fn dry_run(&self) -> bool {
        self.param("dryRun").is_some()
    }

    fn selectors(&self) -> Result<Selectors, ApiError> {
        Ok(Selectors {
            labels: LabelSelector::parse(self.param("labelSelector").unwrap_or(""))
                .map_err(ApiError::bad_request)?,
            fields: FieldSelector::parse(self.param("fieldSelector").unwrap_or(""))
                .map_err(ApiError::bad_request)?,
        })
    }

    fn table(&self) -> Option<IncludeObject> {
        let accept = self
            .headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        table::wants_table(accept).then(|| IncludeObject::parse(self.param("includeObject")))
    }

    fn namespace(&self) -> &str {
        self.route.namespace.as_deref().unwrap_or("")
    }

    fn body_object(&self) -> Result<Value, ApiError> {
        let ct = self
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let v = if ct.contains("protobuf") {
            super::protobuf::decode(&self.body)
                .map_err(|e| ApiError::new(415, "UnsupportedMediaType", e))?
        } else if ct.contains("cbor") {
            return Err(ApiError::new(
                415,
                "UnsupportedMediaType",
                "the local cluster accepts JSON, YAML or (for a few kinds) protobuf bodies, not CBOR",
            ));
        } else {
            patch::parse_json_or_yaml(&self.body).map_err(|e| {
                ApiError::bad_request(format!("the request body could not be decoded: {e}"))
            })?
        };
        if !v.is_object() || v.get("metadata").is_some_and(|m| !m.is_object()) {
            return Err(ApiError::bad_request(
                "the request body must be an object with a metadata object",
            ));
        }
        Ok(v)
    }

    fn target(&self) -> Result<Target, ApiError> {
        match self.route.subresource.as_deref() {
            None => Ok(Target::Main),
            Some("status") if self.info.status => Ok(Target::Status),
            Some("finalize") if super::hooks::is_namespace(&self.info) => Ok(Target::Main),
            Some(other) => Err(ApiError::new(
                404,
                "NotFound",
                format!(
                    "the server could not find the requested resource ({}/{other})",
                    self.info.qualified()
                ),
            )),
        }
    }

    async fn dispatch(&self, method: &Method, is_watch: bool) -> Result<Response, ApiError> {
        // A namespaced resource addressed without a namespace is only valid for lists.
        if self.route.namespace.is_some() && !self.info.namespaced {
            return Err(ApiError::new(
                404,
                "NotFound",
                format!("{} is not namespaced", self.info.qualified()),
            ));
        }
        let Some(name) = self.route.name.clone() else {
            return match *method {
                Method::GET if is_watch => self.watch(),
                Method::GET => self.list(),
                Method::POST => self.create().await,
                Method::DELETE => self.delete_collection(),
                _ => Err(ApiError::method_not_allowed(format!(
                    "{method} is not supported on a collection"
                ))),
            };
        };
        if self.info.namespaced && self.route.namespace.is_none() {
            return Err(ApiError::new(
                404,
                "NotFound",
                format!(
                    "{} is namespaced: use /namespaces/<ns>/{}",
                    self.info.qualified(),
                    self.info.plural
                ),
            ));
        }
        if *method == Method::GET
            && self.route.subresource.as_deref() == Some("log")
            && self.info.group.is_empty()
            && self.info.plural == "pods"
        {
            let logs = self
                .state
                .pod_logs
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone();
            let store = self.state.store.clone();
            return super::logs::serve(
                store,
                logs,
                &self.info,
                self.namespace(),
                &name,
                &self.query,
            )
            .await;
        }
        if self.route.subresource.as_deref() == Some("scale") && scale::serves_scale(&self.info) {
            return self.scale(&name, method).await;
        }
        let target = self.target()?;
        match *method {
            Method::GET => {
                let obj = self.state.store.get(&self.info, self.namespace(), &name)?;
                let rv = self.state.store.resource_version();
                Ok(ok(&match self.table() {
                    Some(include) => table::table(&self.info, &[obj], rv, include),
                    None => obj,
                }))
            }
            Method::PUT => self.update(&name, target).await,
            Method::PATCH => self.patch(&name, target).await,
            Method::DELETE => self.delete(&name),
            _ => Err(ApiError::method_not_allowed(format!(
                "{method} is not supported on {}",
                self.info.qualified()
            ))),
        }
    }

    fn list(&self) -> Result<Response, ApiError> {
        let sel = self.selectors()?;
        let (items, rv) = self
            .state
            .store
            .list(&self.info, self.route.namespace.as_deref(), &sel);
        if let Some(include) = self.table() {
            return Ok(ok(&table::table(&self.info, &items, rv, include)));
        }
        Ok(ok(&json!({
            "kind": format!("{}List", self.info.kind),
            "apiVersion": self.info.api_version(),
            "metadata": {"resourceVersion": rv.to_string()},
            "items": items,
        })))
    }

    fn watch(&self) -> Result<Response, ApiError> {
        let send_initial_events = self.param("sendInitialEvents") == Some("true");
        let start =
            match self.param("resourceVersion") {
                None | Some("0") => WatchStart::Current,
                _ if send_initial_events => WatchStart::Current,
                Some(rv) => WatchStart::After(rv.parse().map_err(|_| {
                    ApiError::bad_request(format!("invalid resourceVersion {rv:?}"))
                })?),
            };
        let timeout = self
            .param("timeoutSeconds")
            .and_then(|t| t.parse::<u64>().ok())
            .map(Duration::from_secs);
        let req = WatchRequest {
            info: self.info.clone(),
            namespace: self.route.namespace.clone(),
            start,
            selectors: self.selectors()?,
            bookmarks: self.param("allowWatchBookmarks") == Some("true"),
            send_initial_events,
            timeout,
            table: self.table(),
        };
        Ok(watch::start(
            &self.state.store,
            req,
            self.state.faults.watch_generation(),
            self.state.bookmark_interval,
        ))
    }

    async fn create(&self) -> Result<Response, ApiError> {
        let mut obj = self.body_object()?;
        if super::hooks::is_namespace(&self.info) {
            // kubectl may send a namespace's own name as its namespace; it has none.
            if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
                meta.remove("namespace");
            }
        }
        self.check_unknown_fields(&obj)?;
        super::rbac::check_escalation(
            &self.state.store,
            &self.user,
            &self.info,
            self.namespace(),
            &obj,
        )?;
        if self.info.group.is_empty() && self.info.plural == "pods" {
            self.admit_service_account(&mut obj)?;
            let mut warnings = Vec::new();
            let admitted = admission::admit(
                self.state,
                &self.info,
                self.namespace(),
                obj,
                self.dry_run(),
                &mut warnings,
            )
            .await;
            self.warn(warnings);
            obj = admitted?;
            super::priority::admit(self.state, &mut obj)?;
            super::pod_security::check(self.state, self.namespace(), &obj)?;
        }
        let attrs = self.attributes(Operation::Create);
        if admission::validating_selected(self.state, &attrs) {
            // The webhooks judge the object as it would be stored: validated, defaulted,
            // with its server-set metadata (and the name generated for it, which it keeps).
            let prepared = self.state.store.create(
                &self.info,
                self.route.namespace.as_deref(),
                obj.clone(),
                true,
            )?;
            if super::meta::name(&obj).is_empty() {
                super::meta::set(&mut obj, "name", json!(super::meta::name(&prepared)));
            }
            let mut warnings = Vec::new();
            let verdict =
                admission::validate(self.state, &attrs, &prepared, None, &mut warnings).await;
            self.warn(warnings);
            verdict?;
        }
        let created = self.state.store.create(
            &self.info,
            self.route.namespace.as_deref(),
            obj,
            self.dry_run(),
        )?;
        Ok(json_response(StatusCode::CREATED, &created))
    }

    /// Fields the server drops (pruned from a custom resource, or not in a built-in kind's
    /// type): with `fieldValidation=Strict` (kubectl's default) an error, as a real server's
    /// strict decoding answers; with `Warn` (the server's default) a warning each; with
    /// `Ignore`, nothing. Keys of strategic merge patch directives (`$patch`,
    /// `$setElementOrder/...`) are not fields.
    fn check_unknown_fields(&self, obj: &Value) -> Result<(), ApiError> {
        let mode = self.param("fieldValidation").unwrap_or("Warn");
        if mode == "Ignore" {
            return Ok(());
        }
        let schema = match &self.info.schema {
            Some(s) => Some(&**s),
            None => super::builtin_schema::for_kind(&self.info),
        };
        let mut obj = obj.clone();
        patch::without_directives(&mut obj);
        let unknown = super::schema::unknown_fields(schema, &obj);
        if unknown.is_empty() {
            return Ok(());
        }
        let list: Vec<String> = unknown
            .iter()
            .map(|f| format!("unknown field {f:?}"))
            .collect();
        if mode != "Strict" {
            self.warn(list);
            return Ok(());
        }
        Err(ApiError::bad_request(format!(
            "{kind} in version {version:?} cannot be handled as a {kind}: strict decoding error: {}",
            list.join(", "),
            kind = self.info.kind,
            version = self.info.version,
        )))
    }

    /// The ServiceAccount admission plugin: a pod runs as `default` unless it names one,
    /// and the ServiceAccount must exist.
    fn admit_service_account(&self, pod: &mut Value) -> Result<(), ApiError> {
        let account = pod
            .pointer("/spec/serviceAccountName")
            .or_else(|| pod.pointer("/spec/serviceAccount"))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .unwrap_or("default")
            .to_owned();
        if let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) {
            spec.insert("serviceAccountName".into(), json!(account));
            spec.insert("serviceAccount".into(), json!(account));
        }
        let registry = self.state.store.registry();
        let exists = registry
            .find("", "v1", "serviceaccounts")
            .is_some_and(|sa| self.state.store.get(sa, self.namespace(), &account).is_ok());
        if exists {
            return Ok(());
        }
        let name = super::meta::name(pod);
        let what = if name.is_empty() {
            "pods".to_owned()
        } else {
            format!("pods {name:?}")
        };
        Err(ApiError::forbidden(format!(
            "{what} is forbidden: error looking up service account {}/{account}: serviceaccount {account:?} not found",
            self.namespace()
        )))
    }

    async fn update(&self, name: &str, target: Target) -> Result<Response, ApiError> {
        let body = self.body_object()?;
        self.check_unknown_fields(&body)?;
        super::rbac::check_escalation(
            &self.state.store,
            &self.user,
            &self.info,
            self.namespace(),
            &body,
        )?;
        let updated = self
            .modify_admitted(
                name,
                WriteMode {
                    target,
                    apply: false,
                    dry_run: self.dry_run(),
                },
                |_| Ok(body.clone()),
            )
            .await?;
        Ok(ok(&updated))
    }

    async fn patch(&self, name: &str, target: Target) -> Result<Response, ApiError> {
        let ct = self
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let kind =
            PatchKind::from_content_type(ct).ok_or_else(|| ApiError::unsupported_media_type(ct))?;
        if kind == PatchKind::Strategic
            && !self.info.group.is_empty()
            && !is_builtin_group(&self.info.group)
        {
            return Err(ApiError::unsupported_media_type(ct));
        }
        let info = self.info.clone();
        let body = self.body.clone();
        let applied = match kind {
            PatchKind::Apply => {
                let applied = patch::parse_json_or_yaml(&body)
                    .map_err(|e| ApiError::bad_request(format!("invalid apply patch: {e}")))?;
                check_applied_kind(&info, &applied)?;
                self.check_unknown_fields(&applied)?;
                let manager = self.param("fieldManager").ok_or_else(|| {
                    ApiError::bad_request("PATCH with apply requires the fieldManager parameter")
                })?;
                Some((applied, manager.to_owned()))
            }
            _ => None,
        };
        if applied.is_some()
            && !self.user.is_admin()
            && self
                .state
                .store
                .get(&self.info, self.namespace(), name)
                .is_err()
        {
            // An apply that creates the object needs `create` too, as on a real server.
            let attrs = super::rbac::Attributes::Resource {
                verb: "create".into(),
                group: self.info.group.clone(),
                resource: self.info.plural.clone(),
                subresource: self.route.subresource.clone(),
                namespace: self.route.namespace.clone(),
                name: Some(name.to_owned()),
            };
            if !super::rbac::allowed(&self.state.store, &self.user, &attrs) {
                return Err(super::rbac::forbidden(&self.user, &attrs));
            }
        }
        if matches!(kind, PatchKind::Merge | PatchKind::Strategic)
            && let Ok(merge) = patch::parse_json_or_yaml(&body)
        {
            self.check_unknown_fields(&merge)?;
        }
        if self.info.group == "rbac.authorization.k8s.io" && !self.user.is_admin() {
            // Escalation is judged on the object the patch would produce.
            let current = self
                .state
                .store
                .get(&self.info, self.namespace(), name)
                .ok();
            let base = current.unwrap_or_else(|| json!({}));
            let result = match &applied {
                Some((applied, manager)) => {
                    super::ssa::apply(&base, applied, manager, target, &info.api_version())
                }
                None => patch::apply(kind, &base, &body)
                    .map_err(|e| ApiError::invalid(&info, name, e))?,
            };
            super::rbac::check_escalation(
                &self.state.store,
                &self.user,
                &self.info,
                self.namespace(),
                &result,
            )?;
        }
        let patched = self
            .modify_admitted(
                name,
                WriteMode {
                    target,
                    apply: applied.is_some(),
                    dry_run: self.dry_run(),
                },
                |current| {
                    let base = current.cloned().unwrap_or_else(|| json!({}));
                    match &applied {
                        Some((applied, manager)) => Ok(super::ssa::apply(
                            &base,
                            applied,
                            manager,
                            target,
                            &info.api_version(),
                        )),
                        None => patch::apply(kind, &base, &body)
                            .map_err(|e| ApiError::invalid(&info, name, e)),
                    }
                },
            )
            .await?;
        Ok(ok(&patched))
    }

    fn delete_options(&self) -> Result<DeleteOptions, ApiError> {
        let body: Value = if self.body.is_empty() {
            json!({})
        } else {
            serde_json::from_slice(&self.body)
                .map_err(|e| ApiError::bad_request(format!("invalid DeleteOptions: {e}")))?
        };
        let text = |p: &str| body.pointer(p).and_then(Value::as_str).map(str::to_owned);
        let propagation = text("/propagationPolicy")
            .or_else(|| self.param("propagationPolicy").map(str::to_owned));
        Ok(DeleteOptions {
            uid: text("/preconditions/uid"),
            resource_version: text("/preconditions/resourceVersion"),
            propagation: if propagation.as_deref() == Some("Orphan")
                || body.get("orphanDependents") == Some(&json!(true))
            {
                Propagation::Orphan
            } else {
                Propagation::Background
            },
            dry_run: self.dry_run()
                || body
                    .get("dryRun")
                    .and_then(Value::as_array)
                    .is_some_and(|a| !a.is_empty()),
            grace_period_seconds: body
                .get("gracePeriodSeconds")
                .and_then(Value::as_i64)
                .or_else(|| self.param("gracePeriodSeconds")?.parse().ok())
                .map(|g| g.max(0)),
        })
    }

    fn delete(&self, name: &str) -> Result<Response, ApiError> {
        let opts = self.delete_options()?;
        let deleted = self
            .state
            .store
            .delete(&self.info, self.namespace(), name, &opts)?;
        Ok(ok(&deleted))
    }

    fn delete_collection(&self) -> Result<Response, ApiError> {
        let opts = self.delete_options()?;
        let items = self.state.store.delete_collection(
            &self.info,
            self.route.namespace.as_deref(),
            &self.selectors()?,
            &opts,
        );
        Ok(ok(&json!({
            "kind": format!("{}List", self.info.kind),
            "apiVersion": self.info.api_version(),
            "metadata": {"resourceVersion": self.state.store.resource_version().to_string()},
            "items": items,
        })))
    }
}

fn is_builtin_group(group: &str) -> bool {
    super::registry::builtins().iter().any(|b| b.group == group)
}

/// An applied configuration must be an object naming the kind and version of the endpoint
/// it is sent to.
fn check_applied_kind(info: &ResourceInfo, obj: &Value) -> Result<(), ApiError> {
    if !obj.is_object() || obj.get("metadata").is_some_and(|m| !m.is_object()) {
        return Err(ApiError::bad_request(
            "an apply patch must be an object with a metadata object",
        ));
    }
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("");
    let api_version = obj.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    if kind != info.kind || api_version != info.api_version() {
        return Err(ApiError::bad_request(format!(
            "an apply patch for {} must have apiVersion {:?} and kind {:?} (got {api_version:?}, {kind:?})",
            info.qualified(),
            info.api_version(),
            info.kind
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(g: &str, ns: Option<&str>, r: &str, name: Option<&str>, sub: Option<&str>) -> Path {
        Path::Resource(Route {
            group: g.into(),
            version: "v1".into(),
            namespace: ns.map(Into::into),
            resource: r.into(),
            name: name.map(Into::into),
            subresource: sub.map(Into::into),
        })
    }

    #[test]
    fn warnings_become_quoted_deduplicated_bounded_headers() {
        let values = warning_headers(vec![
            "plain".into(),
            "with \"quotes\" and \\ backslash".into(),
            "plain".into(),
            "line\nbreak".into(),
            String::new(),
        ]);
        let texts: Vec<&str> = values.iter().map(|v| v.to_str().unwrap()).collect();
        assert_eq!(
            texts,
            [
                "299 - \"plain\"",
                "299 - \"with \\\"quotes\\\" and \\\\ backslash\"",
                "299 - \"line break\"",
            ]
        );
        let many = warning_headers(
            (0..100)
                .map(|i| format!("{i} {}", "x".repeat(300)))
                .collect(),
        );
        let total: usize = many.iter().map(|v| v.len()).sum();
        assert!(!many.is_empty() && total < 5000, "{total}");
        assert!(many.iter().all(|v| v.len() < 300));
    }

    #[test]
    fn paths() {
        assert_eq!(
            parse_path("/api/v1/namespaces"),
            route("", None, "namespaces", None, None)
        );
        assert_eq!(
            parse_path("/api/v1/namespaces/a"),
            route("", None, "namespaces", Some("a"), None)
        );
        assert_eq!(
            parse_path("/api/v1/namespaces/a/status"),
            route("", None, "namespaces", Some("a"), Some("status"))
        );
        assert_eq!(
            parse_path("/api/v1/namespaces/a/pods"),
            route("", Some("a"), "pods", None, None)
        );
        assert_eq!(
            parse_path("/api/v1/namespaces/a/pods/p/status"),
            route("", Some("a"), "pods", Some("p"), Some("status"))
        );
        assert_eq!(
            parse_path("/apis/x.io/v1/things/t"),
            route("x.io", None, "things", Some("t"), None)
        );
        assert_eq!(
            parse_path("/apis/x.io/v1"),
            Path::Resources("x.io".into(), "v1".into())
        );
        assert_eq!(parse_path("/apis/x.io"), Path::Group("x.io".into()));
        assert_eq!(parse_path("/nope"), Path::Unknown);
    }
}
