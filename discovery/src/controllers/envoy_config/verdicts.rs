//! Envoy's verdict on a version about to get its revision, for the configs that reached the
//! controller without the webhook's (created before it was registered, or while it was
//! down and someone removed it): run on a blocking thread, within the judge's limit of four
//! Envoy processes per process, and remembered per config, so a refused version is not
//! judged again at every reconcile and an Envoy that cannot run is logged once per version.

use std::collections::HashMap;
use std::sync::Mutex;

use kube::ResourceExt;
use tracing::{info, warn};

use marin3r_api::EnvoyConfig;
use marin3r_envoyconfig::judge::{EnvoyJudge, JudgeError};

/// The version judged, and Envoy's answer.
type Verdict = (String, Result<(), JudgeError>);

/// The last verdict on each config (by uid).
#[derive(Default)]
pub struct Verdicts(Mutex<HashMap<String, Verdict>>);

impl Verdicts {
    /// Envoy's reasons for refusing `version`, the desired version of `ec`: each as
    /// `path: Envoy: message`; empty when Envoy accepts it, or cannot judge it (then the
    /// controller proceeds on its own checks, and says so once).
    pub async fn refusal(
        &self,
        judge: &EnvoyJudge,
        ec: &EnvoyConfig,
        version: &str,
    ) -> Vec<String> {
        let uid = ec.uid().unwrap_or_default();
        let remembered = self
            .lock()
            .get(&uid)
            .filter(|(judged, _)| judged == version)
            .map(|(_, verdict)| verdict.clone());
        let verdict = match remembered {
            Some(verdict) => verdict,
            None => {
                let (judge, spec) = (judge.clone(), ec.spec.clone());
                let verdict = tokio::task::spawn_blocking(move || judge.judge(&spec))
                    .await
                    .unwrap_or_else(|e| Err(JudgeError::Unavailable(format!("its thread: {e}"))));
                report(ec, version, &verdict);
                self.lock()
                    .insert(uid, (version.to_owned(), verdict.clone()));
                verdict
            }
        };
        match verdict {
            Err(JudgeError::Refused(reasons)) => reasons,
            Ok(()) | Err(JudgeError::Unavailable(_)) => Vec::new(),
        }
    }

    /// Drops what is remembered of a config that is gone.
    pub fn forget(&self, uid: &str) {
        self.lock().remove(uid);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Verdict>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn report(ec: &EnvoyConfig, version: &str, verdict: &Result<(), JudgeError>) {
    let (name, namespace) = (ec.name_any(), ec.namespace().unwrap_or_default());
    match verdict {
        Ok(()) => {}
        Err(JudgeError::Refused(reasons)) => info!(
            envoyconfig = %name, %namespace, %version, reasons = %reasons.join("; "),
            "Envoy refused the version; it is not published"
        ),
        Err(JudgeError::Unavailable(why)) => warn!(
            envoyconfig = %name, %namespace, %version, %why,
            "Envoy could not judge the version; it is published on marin3r's own checks"
        ),
    }
}
