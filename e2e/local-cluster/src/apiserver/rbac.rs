//! Authentication and RBAC authorization, as a real API server does them for the identities
//! the local cluster has: the admin token (`system:masters`, all-powerful), service-account
//! tokens the kubelet mounts into pods (`system:serviceaccount:<ns>:<name>`, whose
//! ServiceAccount must still exist), and anonymous requests. Roles, ClusterRoles and their
//! bindings are evaluated from the store; the default discovery access every authenticated
//! user has (`system:discovery`, `system:basic-user`, `system:public-info-viewer`) is built
//! in. Creating or updating a Role/ClusterRole or a binding is refused unless the requester
//! holds every permission it grants (or has `escalate` / `bind`).

use std::collections::HashMap;
use std::sync::RwLock;

use serde_json::{Value, json};

use super::error::ApiError;
use super::registry::ResourceInfo;
use super::selectors::Selectors;
use super::store::Store;

/// The token of the local cluster's administrator (in every kubeconfig it writes).
pub const ADMIN_TOKEN: &str = "local-cluster";
const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

/// Who makes a request.
#[derive(Debug, Clone, PartialEq)]
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
}

impl User {
    pub fn admin() -> Self {
        Self {
            name: "local-cluster-admin".into(),
            groups: vec!["system:masters".into(), "system:authenticated".into()],
        }
    }

    fn anonymous() -> Self {
        Self {
            name: "system:anonymous".into(),
            groups: vec!["system:unauthenticated".into()],
        }
    }

    fn service_account(ns: &str, name: &str) -> Self {
        Self {
            name: format!("system:serviceaccount:{ns}:{name}"),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{ns}"),
                "system:authenticated".into(),
            ],
        }
    }

    pub fn is_admin(&self) -> bool {
        self.groups.iter().any(|g| g == "system:masters")
    }
}

/// The service-account tokens the server has issued: token → (namespace, name).
#[derive(Debug, Default)]
pub struct Tokens {
    issued: RwLock<HashMap<String, (String, String)>>,
}

impl Tokens {
    /// A new token for the service account `ns/name` (one per pod, as projected tokens are).
    pub fn issue(&self, ns: &str, name: &str) -> String {
        let token = format!(
            "sa.{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        );
        self.issued
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(token.clone(), (ns.to_owned(), name.to_owned()));
        token
    }

    /// Who `authorization` (the header's value, if any) is; 401 for a token nobody issued
    /// or whose ServiceAccount is gone.
    pub fn authenticate(
        &self,
        store: &Store,
        authorization: Option<&str>,
    ) -> Result<User, ApiError> {
        let Some(header) = authorization else {
            return Ok(User::anonymous());
        };
        let token = header
            .strip_prefix("Bearer ")
            .or_else(|| header.strip_prefix("bearer "))
            .map(str::trim)
            .ok_or_else(unauthorized)?;
        if token == ADMIN_TOKEN {
            return Ok(User::admin());
        }
        let sa = self
            .issued
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(token)
            .cloned()
            .ok_or_else(unauthorized)?;
        let registry = store.registry();
        let exists = registry
            .find("", "v1", "serviceaccounts")
            .is_some_and(|info| store.get(info, &sa.0, &sa.1).is_ok());
        if !exists {
            return Err(unauthorized());
        }
        Ok(User::service_account(&sa.0, &sa.1))
    }
}

fn unauthorized() -> ApiError {
    ApiError::new(401, "Unauthorized", "Unauthorized")
}

/// What a request asks to do.
#[derive(Debug, Clone)]
pub enum Attributes {
    Resource {
        verb: String,
        group: String,
        resource: String,
        subresource: Option<String>,
        namespace: Option<String>,
        name: Option<String>,
    },
    NonResource {
        verb: String,
        path: String,
    },
}

fn strings(v: Option<&Value>) -> Vec<&str> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn has(list: &[&str], want: &str) -> bool {
    list.iter().any(|x| *x == "*" || *x == want)
}

/// Whether one PolicyRule allows `attrs`.
fn rule_allows(rule: &Value, attrs: &Attributes) -> bool {
    match attrs {
        Attributes::Resource {
            verb,
            group,
            resource,
            subresource,
            name,
            ..
        } => {
            let resources = strings(rule.get("resources"));
            let wanted = match subresource {
                Some(sub) => format!("{resource}/{sub}"),
                None => resource.clone(),
            };
            let resource_ok = resources.iter().any(|r| {
                *r == "*"
                    || *r == wanted
                    || subresource
                        .as_ref()
                        .is_some_and(|sub| *r == format!("*/{sub}"))
            });
            let names = strings(rule.get("resourceNames"));
            let name_ok = names.is_empty() || name.as_deref().is_some_and(|n| names.contains(&n));
            has(&strings(rule.get("verbs")), verb)
                && has(&strings(rule.get("apiGroups")), group)
                && resource_ok
                && name_ok
        }
        Attributes::NonResource { verb, path } => {
            has(&strings(rule.get("verbs")), verb)
                && strings(rule.get("nonResourceURLs")).iter().any(|u| {
                    *u == "*"
                        || *u == path
                        || u.strip_suffix('*').is_some_and(|p| path.starts_with(p))
                })
        }
    }
}

/// The rules every authenticated user has on a real cluster (`system:discovery`,
/// `system:basic-user`), and what everyone has (`system:public-info-viewer`).
fn default_rules(user: &User) -> Vec<Value> {
    let public = json!({"verbs": ["get"], "nonResourceURLs": ["/healthz", "/livez", "/readyz", "/version", "/version/"]});
    if !user.groups.iter().any(|g| g == "system:authenticated") {
        return vec![public];
    }
    vec![
        public,
        json!({"verbs": ["get"], "nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*", "/openapi", "/openapi/*", "/healthz", "/livez", "/readyz", "/version", "/version/"]}),
        json!({"verbs": ["create"], "apiGroups": ["authorization.k8s.io"], "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"]}),
        json!({"verbs": ["create"], "apiGroups": ["authentication.k8s.io"], "resources": ["selfsubjectreviews"]}),
    ]
}

fn subject_matches(subject: &Value, user: &User) -> bool {
    let text = |k: &str| subject.get(k).and_then(Value::as_str).unwrap_or("");
    match text("kind") {
        "ServiceAccount" => {
            user.name
                == format!(
                    "system:serviceaccount:{}:{}",
                    text("namespace"),
                    text("name")
                )
        }
        "User" => user.name == text("name"),
        "Group" => user.groups.iter().any(|g| g == text("name")),
        _ => false,
    }
}

fn find(store: &Store, plural: &str) -> Option<ResourceInfo> {
    store.registry().find(RBAC_GROUP, "v1", plural).cloned()
}

/// The rules of the role a binding refers to (a Role in `ns`, or a ClusterRole); `None`
/// when it does not exist.
fn find_role_rules(store: &Store, role_ref: Option<&Value>, ns: &str) -> Option<Vec<Value>> {
    let role_ref = role_ref?;
    let name = role_ref.get("name").and_then(Value::as_str).unwrap_or("");
    let (plural, ns) = match role_ref.get("kind").and_then(Value::as_str) {
        Some("ClusterRole") => ("clusterroles", ""),
        Some("Role") => ("roles", ns),
        _ => return None,
    };
    let role = find(store, plural).and_then(|info| store.get(&info, ns, name).ok())?;
    Some(
        role.get("rules")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default(),
    )
}

fn role_rules(store: &Store, role_ref: Option<&Value>, ns: &str) -> Vec<Value> {
    find_role_rules(store, role_ref, ns).unwrap_or_default()
}

/// Every rule that applies to `user` in namespace `ns` (cluster-wide ones only when `ns`
/// is `None`).
fn rules_for(store: &Store, user: &User, ns: Option<&str>) -> Vec<Value> {
    let mut rules = default_rules(user);
    let bound = |b: &Value| {
        b.get("subjects")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .any(|s| subject_matches(s, user))
    };
    if let Some(info) = find(store, "clusterrolebindings") {
        let (bindings, _) = store.list(&info, None, &Selectors::default());
        for b in bindings.iter().filter(|b| bound(b)) {
            rules.extend(role_rules(store, b.get("roleRef"), ""));
        }
    }
    if let (Some(ns), Some(info)) = (ns.filter(|n| !n.is_empty()), find(store, "rolebindings")) {
        let (bindings, _) = store.list(&info, Some(ns), &Selectors::default());
        for b in bindings.iter().filter(|b| bound(b)) {
            rules.extend(role_rules(store, b.get("roleRef"), ns));
        }
    }
    rules
}

/// Whether `user` may do `attrs`.
pub fn allowed(store: &Store, user: &User, attrs: &Attributes) -> bool {
    if user.is_admin() {
        return true;
    }
    let ns = match attrs {
        Attributes::Resource { namespace, .. } => namespace.as_deref(),
        Attributes::NonResource { .. } => None,
    };
    rules_for(store, user, ns)
        .iter()
        .any(|r| rule_allows(r, attrs))
}

/// The 403 a real server answers when RBAC denies `attrs`.
pub fn forbidden(user: &User, attrs: &Attributes) -> ApiError {
    match attrs {
        Attributes::NonResource { verb, path } => ApiError::forbidden(format!(
            "forbidden: User {:?} cannot {verb} path {path:?}",
            user.name
        )),
        Attributes::Resource {
            verb,
            group,
            resource,
            subresource,
            namespace,
            name,
        } => {
            let qualified = if group.is_empty() {
                resource.clone()
            } else {
                format!("{resource}.{group}")
            };
            let what = match name {
                Some(n) => format!("{qualified} {n:?}"),
                None => qualified,
            };
            let full = match subresource {
                Some(s) => format!("{resource}/{s}"),
                None => resource.clone(),
            };
            let scope = match namespace {
                Some(ns) => format!("in the namespace {ns:?}"),
                None => "at the cluster scope".to_owned(),
            };
            let mut err = ApiError::forbidden(format!(
                "{what} is forbidden: User {:?} cannot {verb} resource {full:?} in API group {group:?} {scope}",
                user.name
            ));
            err.details = Some(
                json!({"name": name.clone().unwrap_or_default(), "group": group, "kind": resource}),
            );
            err
        }
    }
}

/// The escalation check on writes of RBAC objects: a Role/ClusterRole may only grant what
/// its writer holds (or the writer has `escalate`), a binding only a role whose permissions
/// the writer holds (or the writer has `bind` on it).
pub fn check_escalation(
    store: &Store,
    user: &User,
    info: &ResourceInfo,
    ns: &str,
    obj: &Value,
) -> Result<(), ApiError> {
    if user.is_admin() || info.group != RBAC_GROUP {
        return Ok(());
    }
    let scope = (!ns.is_empty()).then_some(ns);
    let name = super::meta::name(obj).to_owned();
    let attrs = |verb: &str, resource: &str, name: Option<String>| Attributes::Resource {
        verb: verb.into(),
        group: RBAC_GROUP.into(),
        resource: resource.into(),
        subresource: None,
        namespace: scope.map(str::to_owned),
        name,
    };
    let (granted, bypass) = match info.plural.as_str() {
        "roles" | "clusterroles" => {
            let rules = obj
                .get("rules")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            (rules, attrs("escalate", &info.plural, Some(name.clone())))
        }
        "rolebindings" | "clusterrolebindings" => {
            let role_ref = obj.get("roleRef");
            let role_kind = role_ref
                .and_then(|r| r.get("kind"))
                .and_then(Value::as_str)
                .unwrap_or("");
            let role_name = role_ref
                .and_then(|r| r.get("name"))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned();
            let plural = if role_kind == "Role" {
                "roles"
            } else {
                "clusterroles"
            };
            let mut bind = attrs("bind", plural, Some(role_name));
            if let Attributes::Resource { namespace, .. } = &mut bind
                && plural == "clusterroles"
            {
                // `bind` on a ClusterRole may be granted in the namespace (RoleBinding) or
                // cluster-wide; a namespaced check also consults ClusterRoleBindings.
                *namespace = scope.map(str::to_owned);
            }
            match find_role_rules(store, role_ref, ns) {
                Some(rules) => (rules, bind),
                None => {
                    if allowed(store, user, &bind) {
                        return Ok(());
                    }
                    let mut err = ApiError::forbidden(format!(
                        "{} {name:?} is forbidden: attempting to grant RBAC permissions not currently held: {plural}.{RBAC_GROUP} {:?} not found",
                        info.qualified(),
                        role_ref
                            .and_then(|r| r.get("name"))
                            .and_then(Value::as_str)
                            .unwrap_or("")
                    ));
                    err.details =
                        Some(json!({"name": name, "group": info.group, "kind": info.plural}));
                    return Err(err);
                }
            }
        }
        _ => return Ok(()),
    };
    if allowed(store, user, &bypass) {
        return Ok(());
    }
    let held = rules_for(store, user, scope);
    let missing: Vec<String> = granted
        .iter()
        .flat_map(atoms)
        .filter(|atom| !held.iter().any(|h| covers(h, atom)))
        .map(|atom| atom.to_string())
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let what = if info.plural.ends_with("bindings") {
        "attempting to grant RBAC permissions not currently held"
    } else {
        "user attempted to grant extra privileges"
    };
    let mut err = ApiError::forbidden(format!(
        "{} {name:?} is forbidden: {what}: User {:?} lacks {}",
        info.qualified(),
        user.name,
        missing.join(", ")
    ));
    err.details = Some(json!({"name": name, "group": info.group, "kind": info.plural}));
    Err(err)
}

/// One permission of a rule, wildcards kept literal.
#[derive(Debug)]
struct Atom {
    verb: String,
    group: Option<String>,
    resource: Option<String>,
    name: Option<String>,
    url: Option<String>,
}

impl std::fmt::Display for Atom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.url {
            Some(u) => write!(f, "{{NonResourceURLs:[{u}], Verbs:[{}]}}", self.verb),
            None => write!(
                f,
                "{{APIGroups:[{:?}], Resources:[{:?}], {}Verbs:[{:?}]}}",
                self.group.as_deref().unwrap_or(""),
                self.resource.as_deref().unwrap_or(""),
                self.name
                    .as_ref()
                    .map(|n| format!("ResourceNames:[{n:?}], "))
                    .unwrap_or_default(),
                self.verb
            ),
        }
    }
}

fn atoms(rule: &Value) -> Vec<Atom> {
    let mut out = Vec::new();
    let verbs = strings(rule.get("verbs"));
    for verb in &verbs {
        for url in strings(rule.get("nonResourceURLs")) {
            out.push(Atom {
                verb: (*verb).into(),
                group: None,
                resource: None,
                name: None,
                url: Some(url.into()),
            });
        }
        for group in strings(rule.get("apiGroups")) {
            for resource in strings(rule.get("resources")) {
                let names = strings(rule.get("resourceNames"));
                if names.is_empty() {
                    out.push(Atom {
                        verb: (*verb).into(),
                        group: Some(group.into()),
                        resource: Some(resource.into()),
                        name: None,
                        url: None,
                    });
                }
                for name in names {
                    out.push(Atom {
                        verb: (*verb).into(),
                        group: Some(group.into()),
                        resource: Some(resource.into()),
                        name: Some(name.into()),
                        url: None,
                    });
                }
            }
        }
    }
    out
}

/// Whether the held rule covers the atom (a wildcard in the atom is only covered by a
/// wildcard).
fn covers(held: &Value, atom: &Atom) -> bool {
    if !has(&strings(held.get("verbs")), &atom.verb) {
        return false;
    }
    if let Some(url) = &atom.url {
        return strings(held.get("nonResourceURLs")).iter().any(|u| {
            *u == "*" || u == url || u.strip_suffix('*').is_some_and(|p| url.starts_with(p))
        });
    }
    let group = atom.group.as_deref().unwrap_or("");
    let resource = atom.resource.as_deref().unwrap_or("");
    let resources = strings(held.get("resources"));
    let resource_ok = resources.iter().any(|r| {
        *r == "*"
            || *r == resource
            || resource
                .split_once('/')
                .is_some_and(|(_, sub)| *r == format!("*/{sub}"))
    });
    let names = strings(held.get("resourceNames"));
    let name_ok = names.is_empty() || atom.name.as_deref().is_some_and(|n| names.contains(&n));
    has(&strings(held.get("apiGroups")), group) && resource_ok && name_ok
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(
        verb: &str,
        group: &str,
        resource: &str,
        sub: Option<&str>,
        name: Option<&str>,
    ) -> Attributes {
        Attributes::Resource {
            verb: verb.into(),
            group: group.into(),
            resource: resource.into(),
            subresource: sub.map(Into::into),
            namespace: Some("x".into()),
            name: name.map(Into::into),
        }
    }

    #[test]
    fn rules_match_like_rbac() {
        let rule = json!({"apiGroups": [""], "resources": ["pods", "pods/status"], "verbs": ["get", "list"]});
        assert!(rule_allows(&rule, &res("get", "", "pods", None, Some("p"))));
        assert!(rule_allows(
            &rule,
            &res("get", "", "pods", Some("status"), Some("p"))
        ));
        assert!(!rule_allows(
            &rule,
            &res("get", "", "pods", Some("log"), Some("p"))
        ));
        assert!(!rule_allows(&rule, &res("watch", "", "pods", None, None)));
        assert!(!rule_allows(&rule, &res("get", "apps", "pods", None, None)));
        let named =
            json!({"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"], "resourceNames": ["a"]});
        assert!(rule_allows(
            &named,
            &res("delete", "apps", "deployments", None, Some("a"))
        ));
        assert!(!rule_allows(
            &named,
            &res("delete", "apps", "deployments", None, Some("b"))
        ));
        assert!(!rule_allows(
            &named,
            &res("list", "apps", "deployments", None, None)
        ));
        let sub = json!({"apiGroups": [""], "resources": ["*/status"], "verbs": ["update"]});
        assert!(rule_allows(
            &sub,
            &res("update", "", "pods", Some("status"), Some("p"))
        ));
        assert!(!rule_allows(
            &sub,
            &res("update", "", "pods", None, Some("p"))
        ));
        let url = json!({"nonResourceURLs": ["/apis/*"], "verbs": ["get"]});
        let get = |p: &str| Attributes::NonResource {
            verb: "get".into(),
            path: p.into(),
        };
        assert!(rule_allows(&url, &get("/apis/apps/v1")));
        assert!(!rule_allows(&url, &get("/api")));
    }

    #[test]
    fn coverage_treats_wildcards_literally() {
        let held = json!({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list"]});
        let fine = json!({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]});
        let wide = json!({"apiGroups": [""], "resources": ["*"], "verbs": ["get"]});
        assert!(atoms(&fine).iter().all(|a| covers(&held, a)));
        assert!(!atoms(&wide).iter().all(|a| covers(&held, a)));
    }

    #[test]
    fn forbidden_message_is_kubernetes_shape() {
        let user = User::service_account("ns", "sa");
        let err = forbidden(&user, &res("list", "", "secrets", None, None));
        assert_eq!(
            err.message,
            "secrets is forbidden: User \"system:serviceaccount:ns:sa\" cannot list resource \"secrets\" in API group \"\" in the namespace \"x\""
        );
        assert_eq!(err.code, 403);
    }
}
