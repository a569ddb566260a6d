//! The revision algorithm of `EnvoyConfig` (seed 002), as a pure function: from the revisions
//! in publication order, the desired version and which revisions Envoy rejected, decide the
//! new order, which revision is published, the cache state, and which revisions to delete.

use std::collections::BTreeSet;

use marin3r_api::envoy_config::CacheState;

/// At most this many revisions are kept per `EnvoyConfig`.
pub const MAX_REVISIONS: usize = 10;

/// The outcome of one run of the algorithm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Versions in publication order; the last published one has the highest index.
    pub revisions: Vec<String>,
    /// The version to publish; every other revision is unpublished.
    pub publish: String,
    pub cache_state: CacheState,
    /// Whether the desired version has no revision yet and one must be created.
    pub create: bool,
    /// Versions whose revisions are dropped to stay within the limit.
    pub delete: Vec<String>,
}

/// A version published in place of the one the algorithm chooses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold<'a> {
    /// Kept published while the desired version waits (held by the guard, or in a canary
    /// step): only in place of the desired version (a rollback is the algorithm's).
    Stable(&'a str),
    /// Published by a person (`marin3r rollout undo`) in place of whatever the algorithm
    /// chooses, as long as it is not tainted.
    Pinned(&'a str),
}

/// Runs the algorithm.
/// - `current`: `status.revisions` in publication order (unknown or repeated entries are
///   tolerated: duplicates keep their last position);
/// - `existing`: versions that have a revision object (a revision deleted by hand drops out);
/// - `tainted`: versions Envoy rejected;
/// - `loaded`: versions whose last load into the xDS cache succeeded;
/// - `hold`: a version published in place of the one the algorithm chooses, if any.
pub fn plan(
    current: &[String],
    existing: &BTreeSet<String>,
    desired: &str,
    tainted: &BTreeSet<String>,
    loaded: &BTreeSet<String>,
    limit: usize,
    hold: Option<Hold<'_>>,
) -> Plan {
    let limit = limit.max(1);
    let mut revisions: Vec<String> = Vec::with_capacity(current.len() + 1);
    for version in current {
        if existing.contains(version) && version != desired {
            revisions.retain(|v| v != version);
            revisions.push(version.clone());
        }
    }
    // Applying a spec (new or re-applied) makes its revision the newest.
    revisions.push(desired.to_owned());
    let create = !existing.contains(desired);

    let untainted = revisions
        .iter()
        .rev()
        .find(|v| !tainted.contains(*v))
        .cloned();
    let (publish, cache_state) = match untainted {
        Some(v) if v == desired => (v, CacheState::InSync),
        Some(v) => (v, CacheState::Rollback),
        None => (desired.to_owned(), CacheState::RollbackFailed),
    };
    // Held: what is served stays served; pinned: what a person chose. Only an existing,
    // untainted revision can be.
    let exists = |v: &str| revisions.iter().any(|r| r == v) && !tainted.contains(v);
    let publish = match hold {
        Some(Hold::Stable(stable)) if publish == desired && exists(stable) => stable.to_owned(),
        Some(Hold::Pinned(pinned)) if exists(pinned) => pinned.to_owned(),
        _ => publish,
    };

    let served = served(&revisions, &publish, loaded).cloned();
    // Drop the oldest revisions over the limit, but never the published, the desired or the
    // served one.
    let keep = |v: &String| *v == publish || v == desired || Some(v) == served.as_ref();
    let mut delete = Vec::new();
    while revisions.len() > limit {
        let Some(index) = revisions.iter().position(|v| !keep(v)) else {
            break;
        };
        delete.push(revisions.remove(index));
    }
    Plan {
        revisions,
        publish,
        cache_state,
        create,
        delete,
    }
}

/// The revision the proxies are served while `publish` has not loaded (its load failed, or
/// it was published a moment ago): the newest whose last load succeeded. A running replica
/// keeps serving it until a successor loads, and deleting it would unload it.
fn served<'a>(
    revisions: &'a [String],
    publish: &str,
    loaded: &BTreeSet<String>,
) -> Option<&'a String> {
    if loaded.contains(publish) {
        return None;
    }
    revisions.iter().rev().find(|v| loaded.contains(*v))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    fn set(list: &[&str]) -> BTreeSet<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    /// The algorithm before any load has succeeded or failed: no revision is kept as served.
    fn plan(
        current: &[String],
        existing: &BTreeSet<String>,
        desired: &str,
        tainted: &BTreeSet<String>,
        limit: usize,
    ) -> Plan {
        super::plan(
            current,
            existing,
            desired,
            tainted,
            &BTreeSet::new(),
            limit,
            None,
        )
    }

    /// A held version gets its place as the newest, the stable one stays published and is
    /// never the one the limit drops; a held version Envoy rejected holds nothing.
    #[test]
    fn a_held_version_leaves_the_stable_one_published_and_kept() {
        let existing = set(&["s", "b", "c"]);
        let p = super::plan(
            &v(&["s", "b", "c"]),
            &existing,
            "new",
            &set(&[]),
            &set(&["s"]),
            3,
            Some(Hold::Stable("s")),
        );
        assert_eq!(p.publish, "s");
        assert_eq!(p.cache_state, CacheState::InSync);
        assert!(p.create);
        assert_eq!(p.revisions, v(&["s", "c", "new"]));
        assert_eq!(p.delete, v(&["b"]));
        // Rejected: the rollback is the algorithm's, not the guard's.
        let p = super::plan(
            &v(&["s", "new"]),
            &set(&["s", "new"]),
            "new",
            &set(&["new"]),
            &set(&["s"]),
            10,
            Some(Hold::Stable("s")),
        );
        assert_eq!(
            (p.publish.as_str(), p.cache_state),
            ("s", CacheState::Rollback)
        );
        // A stable version without a revision cannot be served: the desired one is.
        let p = super::plan(
            &v(&[]),
            &set(&[]),
            "new",
            &set(&[]),
            &set(&[]),
            10,
            Some(Hold::Stable("gone")),
        );
        assert_eq!(p.publish, "new");
        // Pinned by a person: published whatever the algorithm chose, and kept in the
        // limit, even when it is the oldest; never a tainted one.
        let existing = set(&["old", "b", "c", "new"]);
        let order = v(&["old", "b", "c", "new"]);
        let pin = |pinned, tainted: &[&str]| {
            super::plan(
                &order,
                &existing,
                "new",
                &set(tainted),
                &set(&[]),
                3,
                Some(Hold::Pinned(pinned)),
            )
        };
        let p = pin("old", &[]);
        assert_eq!(p.publish, "old");
        assert_eq!(p.delete, v(&["b"]));
        assert_eq!(pin("old", &["new"]).publish, "old");
        assert_eq!(pin("b", &["b"]).publish, "new");
    }

    /// Ten versions in a row that fail to load leave the last one that loaded
    /// served by every running replica; the limit drops the next oldest instead of it.
    #[test]
    fn the_limit_never_drops_the_revision_still_served_after_failed_loads() {
        let names: Vec<String> = (0..10).map(|i| format!("r{i}")).collect();
        let existing: BTreeSet<String> = names.iter().cloned().collect();
        // r0 loaded; r1..r9 were published in turn and each failed to load; "new" comes.
        let loaded = set(&["r0"]);
        let p = super::plan(&names, &existing, "new", &set(&[]), &loaded, 10, None);
        assert_eq!(p.publish, "new");
        assert_eq!(p.delete, v(&["r1"]));
        assert_eq!(p.revisions[0], "r0");
        // Once the published revision has loaded, r0 is old news and goes first again.
        let loaded = set(&["r0", "r9"]);
        let p = super::plan(&names, &existing, "r9", &set(&[]), &loaded, 9, None);
        assert_eq!(p.publish, "r9");
        assert_eq!(p.delete, v(&["r0"]));
        // The newest revision that loaded is the one served, not every one that did.
        let loaded = set(&["r0", "r2"]);
        let p = super::plan(&names, &existing, "new", &set(&[]), &loaded, 9, None);
        assert_eq!(p.delete, v(&["r0", "r1"]));
        assert!(p.revisions.contains(&"r2".to_owned()));
        // r9 tainted, the rollback to r8 not loaded yet: r2 is served, and kept beyond the
        // limit with the published and the desired revisions.
        let p = super::plan(
            &names,
            &existing,
            "r9",
            &set(&["r9"]),
            &set(&["r2"]),
            1,
            None,
        );
        assert_eq!(p.publish, "r8");
        assert_eq!(p.revisions, v(&["r2", "r8", "r9"]));
    }

    #[test]
    fn a_new_spec_gets_a_new_published_revision() {
        let p = plan(&[], &set(&[]), "a", &set(&[]), MAX_REVISIONS);
        assert_eq!(p.revisions, v(&["a"]));
        assert_eq!(p.publish, "a");
        assert_eq!(p.cache_state, CacheState::InSync);
        assert!(p.create);

        let p = plan(&v(&["a"]), &set(&["a"]), "b", &set(&[]), MAX_REVISIONS);
        assert_eq!(p.revisions, v(&["a", "b"]));
        assert_eq!((p.publish.as_str(), p.create), ("b", true));
    }

    #[test]
    fn an_unchanged_spec_changes_nothing() {
        let p = plan(
            &v(&["a", "b"]),
            &set(&["a", "b"]),
            "b",
            &set(&[]),
            MAX_REVISIONS,
        );
        assert_eq!(p.revisions, v(&["a", "b"]));
        assert_eq!((p.publish.as_str(), p.create), ("b", false));
        assert!(p.delete.is_empty());
    }

    #[test]
    fn a_reapplied_spec_moves_its_revision_to_the_end() {
        let p = plan(
            &v(&["a", "b", "c"]),
            &set(&["a", "b", "c"]),
            "a",
            &set(&[]),
            10,
        );
        assert_eq!(p.revisions, v(&["b", "c", "a"]));
        assert_eq!((p.publish.as_str(), p.create), ("a", false));
        assert_eq!(p.cache_state, CacheState::InSync);
    }

    #[test]
    fn a_tainted_published_revision_rolls_back_to_the_previous_untainted_one() {
        let p = plan(
            &v(&["a", "b", "c"]),
            &set(&["a", "b", "c"]),
            "c",
            &set(&["c"]),
            10,
        );
        assert_eq!(p.publish, "b");
        assert_eq!(p.cache_state, CacheState::Rollback);
        let p = plan(
            &v(&["a", "b", "c"]),
            &set(&["a", "b", "c"]),
            "c",
            &set(&["b", "c"]),
            10,
        );
        assert_eq!(p.publish, "a");
        assert_eq!(p.cache_state, CacheState::Rollback);
    }

    #[test]
    fn all_tainted_keeps_the_failing_revision_published() {
        let p = plan(
            &v(&["a", "b"]),
            &set(&["a", "b"]),
            "b",
            &set(&["a", "b"]),
            10,
        );
        assert_eq!(p.publish, "b");
        assert_eq!(p.cache_state, CacheState::RollbackFailed);
    }

    #[test]
    fn a_fixed_spec_recovers_to_in_sync() {
        let p = plan(
            &v(&["a", "b"]),
            &set(&["a", "b"]),
            "c",
            &set(&["a", "b"]),
            10,
        );
        assert_eq!(p.revisions, v(&["a", "b", "c"]));
        assert_eq!(p.publish, "c");
        assert_eq!(p.cache_state, CacheState::InSync);
        assert!(p.create);
    }

    #[test]
    fn the_limit_drops_the_oldest_but_never_the_published_one() {
        let names: Vec<String> = (0..10).map(|i| format!("r{i}")).collect();
        let existing: BTreeSet<String> = names.iter().cloned().collect();
        let p = plan(&names, &existing, "new", &set(&[]), 10);
        assert_eq!(p.delete, v(&["r0"]));
        assert_eq!(p.revisions.len(), 10);
        assert_eq!(p.revisions.last().map(String::as_str), Some("new"));

        // Only the oldest is untainted, so it is published and the next oldest goes instead.
        let tainted: BTreeSet<String> = names[1..].iter().cloned().chain(["new".into()]).collect();
        let p = plan(&names, &existing, "new", &tainted, 10);
        assert_eq!(p.publish, "r0");
        assert_eq!(p.delete, v(&["r1"]));
        assert_eq!(p.revisions[0], "r0");
    }

    #[test]
    fn revisions_deleted_by_hand_drop_out_and_duplicates_collapse() {
        let p = plan(
            &v(&["a", "b", "a", "c"]),
            &set(&["a", "c"]),
            "c",
            &set(&[]),
            10,
        );
        assert_eq!(p.revisions, v(&["a", "c"]));
        // The desired revision was deleted by hand: it is created again.
        let p = plan(&v(&["a", "b"]), &set(&["a"]), "b", &set(&[]), 10);
        assert_eq!(p.revisions, v(&["a", "b"]));
        assert!(p.create);
    }

    /// Every combination of up to 5 revisions, each tainted or not, any desired version and
    /// limits 1..=5: the invariants of the seed hold.
    #[test]
    fn invariants_hold_exhaustively() {
        let pool = ["a", "b", "c", "d", "e", "f"];
        for len in 0..=5usize {
            let current: Vec<String> = pool[..len].iter().map(|s| (*s).to_owned()).collect();
            let existing: BTreeSet<String> = current.iter().cloned().collect();
            let subset = |mask: u32| -> BTreeSet<String> {
                pool[..=len]
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| mask & (1 << i) != 0)
                    .map(|(_, s)| (*s).to_owned())
                    .collect()
            };
            for mask in 0..(1u32 << (len + 1)) {
                let tainted = subset(mask);
                for loaded in (0..(1u32 << (len + 1))).map(subset) {
                    for desired in &pool[..=len] {
                        for limit in 1..=5 {
                            check(&current, &existing, desired, (&tainted, &loaded), limit);
                        }
                    }
                }
            }
        }
    }

    fn check(
        current: &[String],
        existing: &BTreeSet<String>,
        desired: &str,
        (tainted, loaded): (&BTreeSet<String>, &BTreeSet<String>),
        limit: usize,
    ) {
        let p = super::plan(current, existing, desired, tainted, loaded, limit, None);
        let ctx = format!(
            "{current:?} desired={desired} tainted={tainted:?} loaded={loaded:?} \
             limit={limit}: {p:?}"
        );
        assert_eq!(
            p.revisions.last().map(String::as_str),
            Some(desired),
            "{ctx}"
        );
        assert!(p.revisions.contains(&p.publish), "{ctx}");
        // Beyond the limit only the published, the desired and the served revisions.
        assert!(p.revisions.len() <= limit.max(3), "{ctx}");
        // While the published revision has not loaded, the newest one that did (what the
        // proxies are served) is never dropped.
        if !loaded.contains(&p.publish) {
            let desired = desired.to_owned();
            let newest_loaded = current
                .iter()
                .chain([&desired])
                .rev()
                .find(|v| loaded.contains(*v) && (existing.contains(*v) || **v == desired));
            if let Some(served) = newest_loaded {
                assert!(p.revisions.contains(served), "{ctx}");
            }
        }
        let unique: BTreeSet<&String> = p.revisions.iter().collect();
        assert_eq!(unique.len(), p.revisions.len(), "{ctx}");
        assert!(p.delete.iter().all(|d| !p.revisions.contains(d)), "{ctx}");
        assert_eq!(p.create, !existing.contains(desired), "{ctx}");
        // The published revision is the newest untainted one; with none left, the desired one.
        if p.revisions.iter().any(|v| !tainted.contains(v)) {
            assert!(!tainted.contains(&p.publish), "{ctx}");
            let newer = p.revisions.iter().rev().take_while(|v| **v != p.publish);
            assert!(newer.clone().all(|v| tainted.contains(v)), "{ctx}");
            // Dropped revisions were older than the published one or rejected.
            assert!(
                p.delete
                    .iter()
                    .all(|d| tainted.contains(d) || !current.is_empty()),
                "{ctx}"
            );
            let state = if p.publish == desired {
                CacheState::InSync
            } else {
                CacheState::Rollback
            };
            assert_eq!(p.cache_state, state, "{ctx}");
        } else {
            assert_eq!(p.publish, desired, "{ctx}");
            assert_eq!(p.cache_state, CacheState::RollbackFailed, "{ctx}");
        }
    }
}
