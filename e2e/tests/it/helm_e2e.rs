//! The Helm chart on the real cluster, with the real helm, as docs/install.md ("Helm") says:
//! `helm install` of the previous chart (the package `hack/release` made of it, kept in
//! `e2e/tests/it/fixtures/`), the demo story, `helm upgrade` to this checkout's chart with a
//! new image tag (as a new release has) and a DiscoveryService of the chart's, the operator
//! and the discovery pods rolled to that image, the demo story again, `helm test` (`marin3r
//! check` in a pod), then the uninstall: nothing of marin3r is left, the CRDs kept by helm
//! removed as the page says.
//!
//! The marin3r image is this build's, under two tags of the scenario's own (the install's
//! and the upgrade's); when the previous chart's CRDs are not this build's, this build's
//! replace them after the install. Whatever marin3r install the scenario before left is removed first
//! (as install_guide.rs does), and again when the test fails half-way; the cluster is held
//! alone throughout
//! ([`Cluster::exclusive`]) and left without marin3r, as the install guide leaves it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use marin3r_testkit::cluster::Cluster;

const RELEASE: &str = "marin3r";
const NAMESPACE: &str = "marin3r-system";
const CHART: &str = "manifests/chart";

/// The chart's previous version: what `hack/release` packaged of it, kept as it was.
pub const PREVIOUS_CHART: &str = "e2e/tests/it/fixtures/marin3r-chart-previous.tgz";

/// The version `PREVIOUS_CHART` holds (its Chart.yaml).
const PREVIOUS_VERSION: &str = "0.1.0";

/// docs/install.md's first step of an upgrade: this chart's CRDs, applied over helm's.
const APPLY_CRDS: &str = "set -o pipefail; helm show crds manifests/chart \
                          | kubectl apply --server-side --force-conflicts -f -";

/// helm's `--wait` and `--timeout` for a rollout.
const HELM_WAIT: &[&str] = &["--wait", "--timeout", "180s"];

struct Shell {
    repo: PathBuf,
    path: String,
    kubeconfig: PathBuf,
    marin3r: PathBuf,
}

impl Shell {
    /// `program args` from the repository's root: its stdout (with stderr), or an error
    /// with both.
    fn run(&self, program: &str, args: &[&str]) -> Result<String, String> {
        let out = Command::new(program)
            .args(args)
            .current_dir(&self.repo)
            .env("PATH", &self.path)
            .env("KUBECONFIG", &self.kubeconfig)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("running {program}: {e}"))?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if out.status.success() {
            Ok(text)
        } else {
            Err(format!(
                "`{program} {}` failed ({}):\n{text}",
                args.join(" "),
                out.status
            ))
        }
    }

    fn kubectl(&self, args: &[&str]) -> Result<String, String> {
        self.run("kubectl", args)
    }

    fn helm(&self, args: &[&str]) -> Result<String, String> {
        self.run("helm", args)
    }

    /// Step `what`, timed, failing the test with its output.
    fn step(&self, what: &str, result: Result<String, String>) -> String {
        let out = result.unwrap_or_else(|e| panic!("{what}: {e}"));
        eprintln!("helm_e2e: {what}");
        out
    }

    /// What is left of marin3r: CRDs, webhook configurations, ClusterRoles and bindings (the
    /// chart's test hook's too), its namespace and the demo's, and helm releases.
    fn leftovers(&self) -> Result<Vec<String>, String> {
        let names = "jsonpath={range .items[*]}{.metadata.name}{\"\\n\"}{end}";
        let mut left = Vec::new();
        for kind in marin3r_e2e::real::INSTALLED_KINDS {
            let out = self.kubectl(&["get", kind, "-o", names])?;
            left.extend(
                out.lines()
                    .filter(|name| marin3r_e2e::real::is_marin3rs(kind, name))
                    .map(|name| format!("{kind}/{name}")),
            );
        }
        let states = ["--deployed", "--failed", "--pending", "--uninstalling"];
        let mut list = vec!["list", "--all-namespaces", "--short"];
        list.extend(states);
        let releases = self.helm(&list)?;
        left.extend(
            releases
                .lines()
                .filter(|r| *r == RELEASE)
                .map(|r| format!("helm release {r}")),
        );
        Ok(left)
    }

    /// Removes marin3r however it was installed (kustomize, install.yaml or this chart),
    /// workloads and DiscoveryServices first, while the operator runs.
    fn remove_marin3r(&self) -> Result<(), String> {
        self.kubectl(&[
            "delete",
            "namespace",
            "demo",
            "--ignore-not-found",
            "--timeout=180s",
        ])?;
        let crd = self.kubectl(&[
            "get",
            "customresourcedefinition",
            "discoveryservices.operator.marin3r.3scale.net",
            "--ignore-not-found",
            "-o",
            "name",
        ])?;
        if !crd.trim().is_empty() {
            self.kubectl(&[
                "delete",
                "discoveryservices",
                "--all",
                "-A",
                "--timeout=180s",
            ])?;
        }
        let mut uninstall = vec!["uninstall", RELEASE, "-n", NAMESPACE, "--ignore-not-found"];
        uninstall.extend(HELM_WAIT);
        self.helm(&uninstall)?;
        // The CRDs helm keeps, and whatever a kustomize install left (its namespace too).
        self.kubectl(&[
            "delete",
            "-k",
            "manifests/",
            "--ignore-not-found",
            "--timeout=180s",
        ])?;
        // Cluster-wide objects of another release's manifests that this checkout's lack.
        self.kubectl(&[
            "delete",
            "clusterroles,clusterrolebindings",
            "-l",
            "app.kubernetes.io/name=marin3r",
            "--ignore-not-found",
        ])?;
        match self.leftovers()? {
            left if left.is_empty() => Ok(()),
            left => Err(format!("still there: {}", left.join(", "))),
        }
    }

    /// The demo story on what is installed (`demo --exit --installed`), every step passed.
    fn demo_story(&self, when: &str) {
        let t = Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_demo"))
            .args(["--exit", "--installed", "--kubeconfig"])
            .arg(&self.kubeconfig)
            .arg("--marin3r")
            .arg(&self.marin3r)
            .current_dir(&self.repo)
            .env("PATH", &self.path)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("every step succeeded"),
            "the demo story {when} failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        for step in [
            "marin3r is installed already: waiting for it",
            "a request through the sidecar returns the configured body",
            "waiting for the rollback",
            "$ marin3r check",
        ] {
            assert!(
                stdout.contains(step),
                "the demo {when} never said {step:?}:\n{stdout}"
            );
        }
        eprintln!(
            "helm_e2e: the demo story {when} ({:.1} s)",
            t.elapsed().as_secs_f64()
        );
    }

    /// The image of the first container of Deployment `name`'s pod template.
    fn deployment_image(&self, name: &str) -> Result<String, String> {
        let d = format!("deployment/{name}");
        let path = "jsonpath={.spec.template.spec.containers[0].image}";
        self.kubectl(&["get", "-n", NAMESPACE, &d, "-o", path])
    }

    /// Waits until Deployment `name` runs `image` on every replica.
    fn rolled_to(&self, name: &str, image: &str) -> Result<String, String> {
        let deadline = Instant::now() + Duration::from_secs(180);
        while self.deployment_image(name)? != image {
            if Instant::now() > deadline {
                return Err(format!("deployment/{name} never asked for {image}"));
            }
            std::thread::sleep(Duration::from_secs(1));
        }
        let d = format!("deployment/{name}");
        self.kubectl(&["rollout", "status", "-n", NAMESPACE, &d, "--timeout=180s"])
    }
}

/// Removes marin3r when the test stops half-way (a panic drops it armed).
struct CleanUp<'a> {
    shell: &'a Shell,
    armed: bool,
}

impl Drop for CleanUp<'_> {
    fn drop(&mut self) {
        if self.armed
            && let Err(e) = self.shell.remove_marin3r()
        {
            eprintln!("helm_e2e: cleaning up after the failure failed: {e}");
        }
    }
}

/// The marin3r image of this build under a tag of this scenario's, loaded; the tag. The
/// install and the upgrade each have one (as two releases have), so the upgrade rolls every
/// marin3r pod, and `marin3r:v<version>`, which the other scenarios share, is left alone.
fn load_tagged_image(cluster: &Cluster, marin3r: &Path, what: &str) -> String {
    let tag = format!("v{}-helm-{what}", env!("CARGO_PKG_VERSION"));
    let name = format!("marin3r:{tag}");
    let out = Command::new(marin3r_testkit::tools::repo_root().join("hack/image"))
        .args(["marin3r", "--tag", &name, "--marin3r"])
        .arg(marin3r)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "hack/image --tag {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for archive in String::from_utf8_lossy(&out.stdout).lines() {
        cluster.load(Path::new(archive)).unwrap();
    }
    tag
}

#[test]
fn helm_installs_upgrades_tests_and_uninstalls_marin3r() {
    let repo = marin3r_testkit::tools::repo_root();
    assert!(
        repo.join(PREVIOUS_CHART).is_file(),
        "no {PREVIOUS_CHART}: the previous chart's package (hack/release)"
    );
    let cluster = Cluster::start_or_attach().unwrap();
    if !cluster.is_local() {
        eprintln!("helm_e2e: its images are loaded with hack/cluster, not on an attached cluster");
        return;
    }
    let marin3r = marin3r_testkit::image::marin3r_bin().expect("a built marin3r");
    // The images are written and loaded beside the other scenarios: new tags, which no pod
    // runs yet, disturb none of them, and the cluster is held alone only once they are in.
    let (install_tag, upgrade_tag) = {
        let _shared = cluster.shared().unwrap();
        marin3r_testkit::image::load_images(&cluster, &["envoy"]).unwrap();
        (
            load_tagged_image(&cluster, &marin3r, "install"),
            load_tagged_image(&cluster, &marin3r, "upgrade"),
        )
    };
    let _held = cluster.exclusive().unwrap();
    let shell = Shell {
        path: format!(
            "{}:{}",
            repo.join(".tools/bin").display(),
            std::env::var("PATH").unwrap_or_default()
        ),
        repo,
        kubeconfig: cluster.kubeconfig().to_path_buf(),
        marin3r,
    };
    shell
        .remove_marin3r()
        .unwrap_or_else(|e| panic!("removing what the scenario before left: {e}"));
    let mut clean_up = CleanUp {
        shell: &shell,
        armed: true,
    };

    // The previous chart, as a user installed it.
    let install_tag_value = format!("image.tag={install_tag}");
    let mut install = vec![
        "install",
        RELEASE,
        PREVIOUS_CHART,
        "-n",
        NAMESPACE,
        "--create-namespace",
        "--set",
        &install_tag_value,
    ];
    install.extend(HELM_WAIT);
    shell.step("helm install of the previous chart", shell.helm(&install));
    // Both releases run this build's image (no build of the previous release is at hand), and
    // `marin3r check` in the story wants the CRDs of the binary: when the previous chart's
    // differ, this build's replace them now, as the upgrade below would.
    let same_crds = format!(
        "cmp -s <(helm show crds {PREVIOUS_CHART} 2>/dev/null) <(helm show crds {CHART} 2>/dev/null)"
    );
    if shell.run("bash", &["-c", &same_crds]).is_err() {
        shell.step(
            "the previous chart's CRDs differ from this build's: this build's applied",
            shell.run("bash", &["-c", APPLY_CRDS]),
        );
    }
    shell.step(
        "the namespace labelled for the restricted Pod Security level",
        shell.kubectl(&[
            "label",
            "namespace",
            NAMESPACE,
            "pod-security.kubernetes.io/enforce=restricted",
        ]),
    );
    let listed = shell.step("helm list", shell.helm(&["list", "-n", NAMESPACE]));
    assert!(
        listed.contains(&format!("marin3r-{PREVIOUS_VERSION}")),
        "{listed}"
    );
    shell.demo_story("after helm install");

    // This checkout's chart, with a new release's image and a DiscoveryService of its own.
    let ds = format!("helm-{}", std::process::id() % 100_000);
    let upgrade_image = format!("marin3r:{upgrade_tag}");
    let ds_name = format!("discoveryService.name={ds}");
    let tag_value = format!("image.tag={upgrade_tag}");
    let mut upgrade = vec![
        "upgrade",
        RELEASE,
        CHART,
        "-n",
        NAMESPACE,
        "--set",
        &tag_value,
        "--set",
        "discoveryService.create=true",
        "--set",
        &ds_name,
    ];
    upgrade.extend(HELM_WAIT);
    shell.step(
        "this chart's CRDs applied first, as the page says",
        shell.run("bash", &["-c", APPLY_CRDS]),
    );
    shell.step(
        "helm upgrade to this checkout's chart",
        shell.helm(&upgrade),
    );
    let history = shell.helm(&["history", RELEASE, "-n", NAMESPACE]).unwrap();
    assert!(
        history
            .lines()
            .any(|l| l.starts_with('2') && l.contains("deployed")),
        "{history}"
    );
    shell.step(
        "the operator runs the new image",
        shell.rolled_to("marin3r-operator", &upgrade_image),
    );
    shell.step(
        "the demo's discovery pods roll to it",
        shell.rolled_to("marin3r-instance", &upgrade_image),
    );
    let ready = format!("discoveryservice/{ds}");
    shell.step(
        "the chart's DiscoveryService is Ready",
        shell.kubectl(&[
            "wait",
            "-n",
            NAMESPACE,
            "--for=condition=Ready",
            &ready,
            "--timeout=180s",
        ]),
    );
    shell.demo_story("after helm upgrade");

    let tested = shell.step(
        "helm test",
        shell.helm(&["test", RELEASE, "-n", NAMESPACE, "--timeout", "180s"]),
    );
    assert!(tested.contains("Succeeded"), "{tested}");
    assert!(
        tested.contains(&format!("DiscoveryService {NAMESPACE}/{ds}")),
        "{tested}"
    );

    // The uninstall, in the page's order.
    shell.step(
        "the demo's namespace deleted",
        shell.kubectl(&["delete", "namespace", "demo", "--timeout=180s"]),
    );
    shell.step(
        "the DiscoveryServices deleted while the operator runs",
        shell.kubectl(&[
            "delete",
            "discoveryservices",
            "--all",
            "-A",
            "--wait",
            "--timeout=180s",
        ]),
    );
    let mut uninstall = vec!["uninstall", RELEASE, "-n", NAMESPACE];
    uninstall.extend(HELM_WAIT);
    shell.step("helm uninstall", shell.helm(&uninstall));
    let kept = shell.leftovers().unwrap();
    assert!(
        kept.iter()
            .any(|l| l == "customresourcedefinitions/envoyconfigs.marin3r.3scale.net"),
        "helm no longer keeps the CRDs: {kept:?}"
    );
    shell.step(
        "the CRDs removed (helm show crds | kubectl delete -f -)",
        shell.run(
            "bash",
            &[
                "-c",
                "set -o pipefail; helm show crds manifests/chart | kubectl delete -f -",
            ],
        ),
    );
    shell.step(
        "the release's namespace removed",
        shell.kubectl(&["delete", "namespace", NAMESPACE, "--timeout=180s"]),
    );
    let left = shell.leftovers().unwrap();
    assert!(left.is_empty(), "the uninstall left: {}", left.join(", "));
    clean_up.armed = false;
}
