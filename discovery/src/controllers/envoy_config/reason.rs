//! The reasons of an `EnvoyConfig`'s own conditions (`Ready`, `CacheOutOfSync`,
//! `RollbackFailed`) and of their Events.

use marin3r_api::envoy_config::CacheState;

marin3r_controller::reasons! {
    /// The reasons of an `EnvoyConfig`'s conditions and Events.
    pub enum Reason {
        InvalidSpec,
        InSync,
        Rollback,
        RollbackFailed,
        ResourcesOutOfSync,
        AllRevisionsTainted,
        UntaintedRevisionPublished,
        EmptyConfigRefused,
        /// The blast-radius guard holds the desired version (`Ready=False`; the guard's own
        /// reasons are `gate::Reason`).
        RolloutHeld,
        /// The desired version is in a canary step (`Ready=False` until it is published).
        RolloutInProgress,
        /// A person paused the desired version's steps.
        RolloutPaused,
        /// A person aborted the desired version's rollout.
        RolloutAborted,
        /// The desired version's canaries failed the health analysis; it is rolled back.
        FailedAnalysis,
        /// A person published an earlier revision in its place (`marin3r rollout undo`).
        Undone,
    }
}

impl From<CacheState> for Reason {
    fn from(state: CacheState) -> Self {
        match state {
            CacheState::InSync => Self::InSync,
            CacheState::Rollback => Self::Rollback,
            CacheState::RollbackFailed => Self::RollbackFailed,
        }
    }
}
