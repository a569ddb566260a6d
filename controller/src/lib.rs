//! The shape every marin3r controller shares: observe what it needs, decide with a pure
//! function what the world should look like (children, status, Events, when to look again),
//! act on that plan. This crate holds the acting half that would otherwise be written once per
//! controller: typed condition reasons, conditions that keep their transition time, errors
//! shown with their causes (`chain`), Events, server-side apply, status patches, the error
//! policy and the reconcile metrics; and leader election, which both marin3r processes use.
//! Without its default `kube` feature only the typed reasons, conditions and `chain` remain,
//! which the API types (marin3r-api) use without a client.
// The 80-line bar on functions (the workspace's `too_many_lines`) is the product's: unit
// tests may run past it.
#![cfg_attr(test, allow(clippy::too_many_lines))]

#[cfg(feature = "kube")]
mod act;
mod chain;
#[cfg(feature = "kube")]
pub mod client;
mod condition;
#[cfg(feature = "kube")]
mod event;
#[cfg(feature = "kube")]
pub mod leader;
#[cfg(feature = "kube")]
mod metrics;
#[cfg(feature = "kube")]
mod policy;

#[cfg(feature = "kube")]
pub use act::{apply, delete_ignoring_missing, patch_status, status_patch};
pub use chain::chain;
pub use condition::{Reason, set_condition};
#[cfg(feature = "kube")]
pub use event::{Context, Events, Note};
#[cfg(feature = "kube")]
pub use metrics::ReconcileMetrics;
#[cfg(feature = "kube")]
pub use policy::{
    Conflict, DEFAULT_RECONCILE_TIMEOUT, Error, ReconcileError, drain, error_policy, is_conflict,
    retry_after, run,
};

/// What a controller can watch: a typed Kubernetes object kube's runtime can reflect.
#[cfg(feature = "kube")]
pub trait Watched:
    kube::Resource<DynamicType = ()>
    + Clone
    + std::fmt::Debug
    + serde::de::DeserializeOwned
    + Send
    + Sync
    + 'static
{
}

#[cfg(feature = "kube")]
impl<K> Watched for K where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static
{
}

/// A controller of every `K` the client can see, with the default watcher configuration
/// (each controller narrows what wakes it with `owns`, `watches` and its namespace filter).
#[cfg(feature = "kube")]
pub fn watch_all<K: Watched>(client: &kube::Client) -> kube::runtime::Controller<K> {
    kube::runtime::Controller::new(
        kube::Api::all(client.clone()),
        kube::runtime::watcher::Config::default(),
    )
}

/// Declares an enum of condition or Event reasons, each published as its variant's name.
///
/// ```
/// marin3r_controller::reasons! {
///     /// Why a thing is (not) ready.
///     pub enum Why { Ready, NotFound }
/// }
/// use marin3r_controller::Reason;
/// assert_eq!(Why::NotFound.as_str(), "NotFound");
/// assert_eq!(Why::Ready.to_string(), "Ready");
/// ```
#[macro_export]
macro_rules! reasons {
    ($(#[$meta:meta])* $vis:vis enum $name:ident { $($(#[$vmeta:meta])* $variant:ident),* $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        $vis enum $name { $($(#[$vmeta])* $variant),* }

        impl $crate::Reason for $name {
            fn as_str(self) -> &'static str {
                match self { $(Self::$variant => stringify!($variant)),* }
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str($crate::Reason::as_str(*self))
            }
        }
    };
}
