//! A small run of the attacks `hack/bench --only abuse` mounts at full scale
//! (`src/bench/abuse/`): the harness works end to end against the built `marin3r` (the one
//! beside this test binary, `cargo build -p marin3r-discovery`), and the limits the attacks
//! meet do their part (the names refused by length and by the namespace's budget, the other
//! namespace served, every valid admission answered, during N1 as during N2; R4's requests
//! begun and never finished refused by the namespace's budget). No memory or
//! latency figure is asserted: those belong to BENCHMARKS.md. Its controllers read the real
//! API server of `hack/cluster` (two namespaces of the run's own).

use marin3r_e2e::bench::abuse::abuse;

#[test]
fn a_small_abuse_run_is_refused_and_measured() {
    let rows = abuse(0.05).unwrap();
    let table = marin3r_e2e::bench::table(&rows);
    let n1: Vec<_> = rows
        .iter()
        .filter(|r| r.benchmark.starts_with("N1"))
        .collect();
    assert_eq!(n1.len(), 2, "{table}");
    assert!(
        n1[0].result.contains("refused streams: name_size=1"),
        "{table}"
    );
    assert!(
        n1[1].result.contains("subscription_bytes_per_namespace="),
        "{table}"
    );
    let served = rows
        .iter()
        .filter(|r| r.case.contains("another namespace's proxy"))
        .collect::<Vec<_>>();
    assert_eq!(served.len(), 3, "{table}");
    assert!(
        served.iter().all(|r| r.result.starts_with("met")),
        "{table}"
    );
    // Valid admissions are measured during each N1 case too, every one answered.
    let admitted = rows
        .iter()
        .filter(|r| r.case.starts_with("N1") && r.case.contains("valid admissions"))
        .collect::<Vec<_>>();
    assert_eq!(admitted.len(), 2, "{table}");
    assert!(
        admitted
            .iter()
            .all(|r| r.result.contains(": 10/10 answered")),
        "{table}"
    );
    let r4: Vec<_> = rows
        .iter()
        .filter(|r| r.benchmark.starts_with("R4"))
        .collect();
    assert_eq!(r4.len(), 1, "{table}");
    assert!(
        r4[0].result.contains("subscription_bytes_per_namespace="),
        "{table}"
    );
    let n2: Vec<_> = rows
        .iter()
        .filter(|r| r.benchmark.starts_with("N2"))
        .collect();
    assert_eq!(n2.len(), 3, "{table}");
    for row in n2.iter().filter(|r| !r.result.starts_with("skipped")) {
        assert!(row.result.contains("10/10 answered"), "{table}");
    }
    // The judge flood: the other tenant's pods and configs are answered, the flood throttled.
    let flood: Vec<_> = rows
        .iter()
        .filter(|r| r.benchmark.starts_with("R3"))
        .collect();
    assert_eq!(flood.len(), 1, "{table}");
    assert!(
        flood[0]
            .result
            .contains("pod reviews (127.0.0.2, HTTP/2): 10/10 answered"),
        "{table}"
    );
    assert!(
        flood[0]
            .result
            .contains("team-b's validations: 10/10 answered"),
        "{table}"
    );
    // ...and the flood was really judged slowly, so it had something to hold up.
    assert!(
        !flood[0].result.contains("throttled (metric): 0;"),
        "{table}"
    );
}
