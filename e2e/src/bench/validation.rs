//! What judging a 100-resource EnvoyConfig costs: marin3r's own checks (what the
//! validating webhook runs at admission), then the same with real Envoy as the last judge
//! (what `marin3r validate` runs when an Envoy binary is at hand), before and after adding it.

use std::time::Instant;

use marin3r_envoyconfig::judge::EnvoyJudge;
use serde_json::{Value, json};

use super::convert::{cluster, listener, route};
use super::{Row, Stats, human};

/// An EnvoyConfig of 33 listeners, 34 clusters and 33 routes in `spec.resources`, every route
/// to a cluster it defines (Envoy refuses an inline route to an unknown cluster).
fn hundred_resources() -> anyhow::Result<Value> {
    let mut resources = Vec::new();
    for i in 0..33 {
        for (kind, text) in [
            ("listener", listener(i)),
            ("cluster", cluster(i)),
            ("route", route(i)),
        ] {
            let value: Value = serde_saphyr::from_str(&text)?;
            resources.push(json!({"type": kind, "value": value}));
        }
    }
    let value: Value = serde_saphyr::from_str(&cluster(33))?;
    resources.push(json!({"type": "cluster", "value": value}));
    Ok(json!({
        "apiVersion": "marin3r.3scale.net/v1alpha1",
        "kind": "EnvoyConfig",
        "metadata": {"name": "hundred", "namespace": "bench"},
        "spec": {"nodeID": "hundred", "resources": resources},
    }))
}

pub fn validation(scale: f64) -> anyhow::Result<Vec<Row>> {
    let object = hundred_resources()?;
    let samples = ((50.0 * scale).round() as usize).max(1);
    let case = "100 resources (33 listeners, 34 clusters, 33 routes), spec.resources";
    let mut rows = Vec::new();

    // The webhook's verdict: every check of our own.
    let own =
        |object: &Value| marin3r_envoyconfig::rules::envoy_config_problems("bench", object, false);
    anyhow::ensure!(
        own(&object).is_empty(),
        "benchmark input is invalid: {:?}",
        own(&object)
    );
    let mut timings = Vec::with_capacity(samples);
    for _ in 0..samples {
        let start = Instant::now();
        std::hint::black_box(own(&object));
        timings.push(start.elapsed());
    }
    if let Some(s) = Stats::of(&timings) {
        rows.push(Row {
            benchmark: "EnvoyConfig validation, marin3r's own checks (admission, before)".into(),
            case: case.into(),
            samples,
            result: format!("median {}, p99 {}", human(s.p50), human(s.p99)),
        });
    }

    // With Envoy as the last judge, as `marin3r validate` runs it.
    let envoy = marin3r_testkit::tools::envoy()?;
    let judge = EnvoyJudge::new(&envoy)
        .with_launcher(marin3r_testkit::image::marin3r_bin().unwrap_or_default());
    let (spec, _) = marin3r_envoyconfig::rules::read_spec(object["spec"].clone())
        .map_err(anyhow::Error::msg)?;
    let mut timings = Vec::with_capacity(samples);
    for _ in 0..samples {
        let start = Instant::now();
        let problems = own(&object);
        let verdict = judge.judge(&spec);
        timings.push(start.elapsed());
        anyhow::ensure!(
            problems.is_empty() && verdict.is_ok(),
            "Envoy refused the benchmark input: {verdict:?}"
        );
    }
    if let Some(s) = Stats::of(&timings) {
        rows.push(Row {
            benchmark: "EnvoyConfig validation, own checks then Envoy 1.40 validate mode (after)"
                .into(),
            case: case.into(),
            samples,
            result: format!("median {}, p99 {}", human(s.p50), human(s.p99)),
        });
    }
    rows.extend(refused(&envoy, object, samples)?);
    Ok(rows)
}

/// The validating webhook's decision on an AdmissionReview of the 100 resources with one
/// route only Envoy refuses (an invalid RE2): what a refusal costs, finding the resource to
/// blame included, against the 2 s goal. The discovery pod's judge, with its budget.
fn refused(envoy: &std::path::Path, mut object: Value, samples: usize) -> anyhow::Result<Vec<Row>> {
    let route = &mut object["spec"]["resources"][50];
    anyhow::ensure!(route["type"] == "route", "resources[50] is not a route");
    route["value"]["virtual_hosts"][0]["routes"][0]["match"] =
        json!({"safe_regex": {"regex": "/v1(["}});
    let review = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "bench",
            "kind": {"group": "marin3r.3scale.net", "version": "v1alpha1", "kind": "EnvoyConfig"},
            "resource": {"group": "marin3r.3scale.net", "version": "v1alpha1", "resource": "envoyconfigs"},
            "namespace": "bench",
            "operation": "CREATE",
            "object": object,
        }
    })
    .to_string();
    let judge = EnvoyJudge::new(envoy)
        .with_launcher(marin3r_testkit::image::marin3r_bin().unwrap_or_default())
        .with_budget(marin3r_envoyconfig::judge::ADMISSION_BUDGET);
    let validator = marin3r_envoyconfig::rules::validator_with(false, Some(judge));
    let mut timings = Vec::with_capacity(samples);
    let mut message = String::new();
    for _ in 0..samples {
        let start = Instant::now();
        let (out, _) =
            marin3r_webhook::validate::review_envoy_config(review.as_bytes(), &validator)
                .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        timings.push(start.elapsed());
        message = out["response"]["status"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        anyhow::ensure!(
            out["response"]["allowed"] == false
                && message.contains("spec.resources[50].value: Envoy: "),
            "the bad route was not refused on its own: {out}"
        );
    }
    let Some(s) = Stats::of(&timings) else {
        return Ok(Vec::new());
    };
    Ok(vec![Row {
        benchmark: "EnvoyConfig admission refused by Envoy, the resource found (webhook decision)"
            .into(),
        case: "100 resources, resources[50] a route with an invalid RE2".into(),
        samples,
        result: format!(
            "median {}, p99 {} (goal 2 s); {}",
            human(s.p50),
            human(s.p99),
            message.chars().take(160).collect::<String>()
        ),
    }])
}
