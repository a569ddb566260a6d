//! A short run of the soak `hack/bench --only soak` runs for minutes (`src/bench/soak.rs`):
//! the whole product on the real cluster (`hack/cluster`, held alone) with pod churn, an
//! EnvoyConfig update a second and Envoy rejecting every fourth, API faults for the product's
//! service accounts (their pods' API connections sent to the fault proxy), and one discovery
//! pod kill; nothing may be lost (every pod admitted with its sidecar, every Envoy
//! on the newest good revision at the end, every rejected revision rolled back). No timing is
//! asserted: the numbers belong to BENCHMARKS.md. Needs root and the built `marin3r`
//! (`cargo build -p marin3r-discovery`).

use std::time::Duration;

use marin3r_e2e::bench::soak::{SoakConfig, soak};

#[test]
fn a_short_soak_loses_nothing() {
    // The soak's own log and the fault proxy's, with RUST_LOG.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let mut config = SoakConfig::new(Duration::from_secs(12));
    config.bad_every = 4;
    config.pod_every = Duration::from_secs(2);
    config.pod_lifetime = Duration::from_secs(5);
    config.discovery_kills = 1;
    config.fault_every = Duration::from_millis(500);
    config.log_dir = std::env::var_os("MARIN3R_E2E_LOG_DIR").map(std::path::PathBuf::from);
    let outcome = soak(&config).unwrap();
    let table = marin3r_e2e::bench::table(&outcome.rows);
    assert!(
        outcome.failures.is_empty(),
        "{:#?}\n{table}",
        outcome.failures
    );
    // It did churn, update, reject, inject and kill, and checked running Envoys at the end
    // (whether an update landed after a pod was Ready, to be timed, depends on the machine's
    // load in so short a run).
    let c = outcome.counts;
    assert!(c.pods_admitted >= 3, "{table}");
    assert_eq!(c.pods_injected, c.pods_admitted, "{table}");
    assert!(c.good_updates >= 2 && c.rollbacks >= 1, "{table}");
    assert!(c.faults_served > 0, "{table}");
    assert_eq!(c.discovery_kills, 1, "{table}");
    assert!(c.envoys_at_end > 0, "{table}");
}
