//! `manifests/monitoring/` as the tests use it: the Component rendered by kubectl's kustomize
//! over `manifests/` (what a user applies), its PrometheusRule and Grafana dashboard read out
//! of that rendering, and a real Prometheus (built by `hack/install-cluster-tools`) run as a
//! process with a given scrape configuration, asked over its HTTP API.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde_json::Value;

use marin3r_testkit::tools;

/// Every object of `manifests/` with the `monitoring` Component, as `kubectl kustomize`
/// renders them.
pub fn render() -> anyhow::Result<Vec<Value>> {
    let dir = tempfile::tempdir()?;
    // Kustomize takes no absolute path to another kustomization: relative to the temp dir.
    let repo = tools::repo_root().canonicalize()?;
    let here = dir.path().canonicalize()?;
    let up = "../".repeat(here.components().count().saturating_sub(1));
    let rel = format!("{up}{}", repo.strip_prefix("/")?.display());
    std::fs::write(
        here.join("kustomization.yaml"),
        format!("resources:\n  - {rel}/manifests\ncomponents:\n  - {rel}/manifests/monitoring\n"),
    )?;
    let out = Command::new(tools::kubectl()?)
        .arg("kustomize")
        .arg(&here)
        .output()?;
    if !out.status.success() {
        bail!(
            "kubectl kustomize: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8(out.stdout)?;
    serde_saphyr::from_multiple::<Value>(&text)
        .map_err(|e| anyhow::anyhow!("the rendered manifests: {e}"))
}

/// The one object of `kind` named `name`.
pub fn object<'a>(objects: &'a [Value], kind: &str, name: &str) -> anyhow::Result<&'a Value> {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .with_context(|| format!("no {kind} {name} in the rendering"))
}

/// The PrometheusRule's `spec`: a Prometheus rules file (`groups`), as JSON (which is YAML).
pub fn rules(objects: &[Value]) -> anyhow::Result<Value> {
    Ok(object(objects, "PrometheusRule", "marin3r")?["spec"].clone())
}

/// The rules with every `for:` set to `0s`: what the tests' Prometheus loads, so an alert
/// fires on the first evaluation its expression holds instead of minutes later. Nothing
/// else changes.
pub fn without_for(rules: &Value) -> Value {
    let mut rules = rules.clone();
    for group in rules["groups"].as_array_mut().into_iter().flatten() {
        for rule in group["rules"].as_array_mut().into_iter().flatten() {
            if rule.get("for").is_some() {
                rule["for"] = Value::from("0s");
            }
        }
    }
    rules
}

/// Each panel's title and the queries of its targets, from the dashboard ConfigMap.
pub fn dashboard_queries(objects: &[Value]) -> anyhow::Result<Vec<(String, String)>> {
    let config_map = object(objects, "ConfigMap", "marin3r-grafana-dashboard")?;
    let json = config_map["data"]["marin3r.json"]
        .as_str()
        .context("the dashboard ConfigMap has no marin3r.json")?;
    let dashboard: Value = serde_json::from_str(json).context("the dashboard's JSON")?;
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().into_iter().flatten() {
        let title = panel["title"].as_str().unwrap_or_default();
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"]
                .as_str()
                .with_context(|| format!("panel {title:?}: a target without expr"))?;
            queries.push((title.to_owned(), expr.to_owned()));
        }
    }
    Ok(queries)
}

/// A Grafana query as Prometheus takes it: `$__rate_interval` (Grafana's pick, at least
/// four scrape intervals) becomes `window`.
pub fn grafana_to_promql(expr: &str, window: &str) -> String {
    expr.replace("$__rate_interval", window)
}

/// A running Prometheus; killed when dropped.
pub struct Prometheus {
    child: Child,
    url: String,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts Prometheus with `config` (YAML) and `rules` (a rules file, as JSON) beside it as
    /// `rules.yaml`, on a free loopback port, and waits until it is ready.
    pub fn start(config: &str, rules: &Value) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("prometheus.yml"), config)?;
        std::fs::write(dir.path().join("rules.yaml"), rules.to_string())?;
        let port = marin3r_testkit::ports::free_port();
        let log = dir.path().join("prometheus.log");
        let log_file = std::fs::File::create(&log)?;
        let child = Command::new(tools::prometheus()?)
            .arg(format!(
                "--config.file={}",
                dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            .spawn()
            .context("starting prometheus")?;
        let mut prometheus = Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
            log,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok((200, _)) =
                marin3r_testkit::envoy::request("GET", &format!("{}/-/ready", prometheus.url))
            {
                return Ok(prometheus);
            }
            if let Some(status) = prometheus.child.try_wait()? {
                bail!("prometheus exited ({status}):\n{}", prometheus.log());
            }
            if Instant::now() > deadline {
                bail!("prometheus not ready after 30 s:\n{}", prometheus.log());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// What Prometheus logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `GET /api/v1/<path>` with `params`; the `data` of a `success` answer, else the error
    /// Prometheus gave.
    pub fn api(&self, path: &str, params: &[(&str, &str)]) -> anyhow::Result<Value> {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(10)))
            .build()
            .into();
        let mut request = agent.get(format!("{}/api/v1/{path}", self.url));
        for (name, value) in params {
            request = request.query(*name, *value);
        }
        let mut response = request.call().with_context(|| format!("GET {path}"))?;
        let body: Value = serde_json::from_str(&response.body_mut().read_to_string()?)?;
        if body["status"] != "success" {
            bail!("{path} {params:?}: {body}");
        }
        Ok(body["data"].clone())
    }

    /// An instant query's result vector (an error names the query and Prometheus' reason).
    pub fn query(&self, expr: &str) -> anyhow::Result<Vec<Value>> {
        let data = self.api("query", &[("query", expr)])?;
        match data["result"].as_array() {
            Some(result) => Ok(result.clone()),
            // A scalar or string result: one sample.
            None => Ok(vec![data["result"].clone()]),
        }
    }

    /// The value of each sample of an instant query, by its labels.
    pub fn values(&self, expr: &str) -> anyhow::Result<Vec<(Value, f64)>> {
        self.query(expr)?
            .into_iter()
            .map(|sample| {
                let value = sample["value"][1]
                    .as_str()
                    .and_then(|v| v.parse().ok())
                    .with_context(|| format!("{expr}: a sample without a value: {sample}"))?;
                Ok((sample["metric"].clone(), value))
            })
            .collect()
    }

    /// The active alerts (`/api/v1/alerts`).
    pub fn alerts(&self) -> anyhow::Result<Vec<Value>> {
        Ok(self.api("alerts", &[])?["alerts"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One scrape job of static targets: `(address, labels)` each.
pub struct Job<'a> {
    pub name: &'a str,
    pub path: &'a str,
    /// The scraped labels win over the target's (a PodMonitor endpoint's `honorLabels`).
    pub honor_labels: bool,
    pub targets: Vec<(String, Vec<(&'a str, String)>)>,
}

/// A Prometheus configuration scraping `jobs` every `interval` and loading `rules.yaml`.
pub fn config(jobs: &[Job], interval: &str) -> String {
    let jobs: Vec<Value> = jobs
        .iter()
        .map(|job| {
            let targets: Vec<Value> = job
                .targets
                .iter()
                .map(|(address, labels)| {
                    let labels: serde_json::Map<String, Value> = labels
                        .iter()
                        .map(|(name, value)| ((*name).to_owned(), Value::from(value.as_str())))
                        .collect();
                    serde_json::json!({"targets": [address], "labels": labels})
                })
                .collect();
            serde_json::json!({
                "job_name": job.name,
                "metrics_path": job.path,
                "honor_labels": job.honor_labels,
                "static_configs": targets,
            })
        })
        .collect();
    let mut config = configuration(&jobs, interval);
    config["rule_files"] = serde_json::json!(["rules.yaml"]);
    config.to_string()
}

/// The scrape jobs the prometheus-operator makes of a PodMonitor (one per endpoint), for a
/// Prometheus that finds the pods itself through the API server (`kubeconfig`): pods of the
/// PodMonitor's namespace (or its `namespaceSelector.matchNames`) whose labels match
/// `selector.matchLabels`, not ended, on the container port named `port` (an init
/// container's too: a native sidecar's), labelled `namespace`, `pod`, `container`,
/// `endpoint` and `job` as the operator labels them, then the endpoint's `relabelings`. What
/// the operator offers beyond that (`matchExpressions`, metric relabelings, TLS) is refused,
/// not guessed at.
pub fn pod_monitor_jobs(monitor: &Value, kubeconfig: &Path) -> anyhow::Result<Vec<Value>> {
    use serde_json::json;
    let name = monitor["metadata"]["name"]
        .as_str()
        .context("a PodMonitor without a name")?;
    let namespace = monitor["metadata"]["namespace"]
        .as_str()
        .context("a PodMonitor without a namespace")?;
    let spec = &monitor["spec"];
    if spec["selector"].get("matchExpressions").is_some() {
        bail!("PodMonitor {namespace}/{name}: selector.matchExpressions is not translated");
    }
    let namespaces: Vec<&str> = match spec["namespaceSelector"]["matchNames"].as_array() {
        Some(names) => names.iter().filter_map(Value::as_str).collect(),
        None if spec["namespaceSelector"]["any"] == true => Vec::new(),
        None => vec![namespace],
    };
    let job = spec["jobLabel"]
        .as_str()
        .map(|label| format!("__meta_kubernetes_pod_label_{}", sanitized(label)));
    let mut selected = vec![json!({
        "source_labels": ["__meta_kubernetes_pod_phase"],
        "regex": "(Failed|Succeeded)",
        "action": "drop",
    })];
    for (label, value) in spec["selector"]["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
    {
        let value = value
            .as_str()
            .context("a matchLabels value that is not a string")?;
        selected.push(json!({
            "source_labels": [
                format!("__meta_kubernetes_pod_label_{}", sanitized(label)),
                format!("__meta_kubernetes_pod_labelpresent_{}", sanitized(label)),
            ],
            "regex": format!("({});true", regex_quoted(value)),
            "action": "keep",
        }));
    }
    let endpoints = spec["podMetricsEndpoints"]
        .as_array()
        .context("a PodMonitor without podMetricsEndpoints")?;
    endpoints
        .iter()
        .enumerate()
        .map(|(i, endpoint)| {
            for unsupported in ["metricRelabelings", "tlsConfig", "targetPort"] {
                if endpoint.get(unsupported).is_some() {
                    bail!("PodMonitor {namespace}/{name}: {unsupported} is not translated");
                }
            }
            let port = endpoint["port"]
                .as_str()
                .context("a podMetricsEndpoint without a port name")?;
            let mut relabel = selected.clone();
            relabel.extend([
                json!({"source_labels": ["__meta_kubernetes_pod_container_port_name"],
                    "regex": regex_quoted(port), "action": "keep"}),
                json!({"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"}),
                json!({"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"}),
                json!({"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"}),
                json!({"target_label": "job", "replacement": format!("{namespace}/{name}")}),
                json!({"target_label": "endpoint", "replacement": port}),
            ]);
            if let Some(label) = &job {
                relabel.push(json!({"source_labels": [label], "regex": "(.+)",
                    "target_label": "job", "replacement": "${1}"}));
            }
            // The endpoint's own relabelings come last, their fields in Prometheus' names.
            for rule in endpoint["relabelings"].as_array().into_iter().flatten() {
                let rule = rule.as_object().context("a relabeling that is not an object")?;
                relabel.push(Value::Object(
                    rule.iter()
                        .map(|(k, v)| (snake_case(k), v.clone()))
                        .collect(),
                ));
            }
            let mut sd = json!({"role": "pod", "kubeconfig_file": kubeconfig});
            if !namespaces.is_empty() {
                sd["namespaces"] = json!({"names": namespaces});
            }
            let mut job = json!({
                "job_name": format!("podMonitor/{namespace}/{name}/{i}"),
                "honor_labels": endpoint["honorLabels"] == true,
                "metrics_path": endpoint["path"].as_str().unwrap_or("/metrics"),
                "scheme": endpoint["scheme"].as_str().unwrap_or("http"),
                "kubernetes_sd_configs": [sd],
                "relabel_configs": relabel,
            });
            if let Some(interval) = endpoint["interval"].as_str() {
                job["scrape_interval"] = json!(interval);
                job["scrape_timeout"] = json!(interval);
            }
            Ok(job)
        })
        .collect()
}

/// A PodMonitor field's name as Prometheus' configuration spells it (`sourceLabels` is
/// `source_labels`).
fn snake_case(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for c in name.chars() {
        if c.is_ascii_uppercase() {
            out.push('_');
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

/// A Kubernetes label name as Prometheus' service discovery writes it in a meta label.
fn sanitized(label: &str) -> String {
    label
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// `text` matched literally by a Prometheus (RE2) regex.
fn regex_quoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// A Prometheus configuration of `jobs` (scrape configs, as JSON, which is YAML) scraping
/// and evaluating every `interval`.
pub fn config_of_jobs(jobs: &[Value], interval: &str) -> String {
    configuration(jobs, interval).to_string()
}

fn configuration(jobs: &[Value], interval: &str) -> Value {
    serde_json::json!({
        "global": {"scrape_interval": interval, "scrape_timeout": interval,
            "evaluation_interval": interval},
        "scrape_configs": jobs,
    })
}

/// `ip:port` with IPv6 addresses bracketed.
pub fn address(ip: &str, port: impl std::fmt::Display) -> String {
    match ip.contains(':') {
        true => format!("[{ip}]:{port}"),
        false => format!("{ip}:{port}"),
    }
}

/// The promtool binary, for the rule checks.
pub fn promtool() -> anyhow::Result<PathBuf> {
    tools::promtool()
}

/// Runs promtool with `args` in `dir`: its exit status and everything it printed.
pub fn run_promtool(dir: &Path, args: &[&str]) -> anyhow::Result<(bool, String)> {
    let out = Command::new(promtool()?)
        .args(args)
        .current_dir(dir)
        .output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((out.status.success(), text))
}
