//! The discovery pod's defaults for the sidecars its webhook injects: the flags the operator
//! writes from `DiscoveryService.spec.sidecar`
//! ([`marin3r_api::sidecar_defaults::SidecarDefaults::args`]).

use clap::{Args, ValueEnum};
use marin3r_webhook::InjectionConfig;
use marin3r_webhook::config::{Resources, XdsProtocol};
use tracing::{info, warn};

#[derive(Debug, Args)]
pub struct SidecarDefaultArgs {
    /// The Envoy image of injected sidecars unless a pod sets marin3r.3scale.net/envoy-image.
    #[arg(long, value_name = "IMAGE", default_value = marin3r_webhook::config::DEFAULT_ENVOY_IMAGE)]
    sidecar_envoy_image: String,
    /// Envoy's CPU request unless a pod sets marin3r.3scale.net/resources.requests.cpu.
    #[arg(long, value_name = "QUANTITY", value_parser = quantity)]
    sidecar_requests_cpu: Option<String>,
    /// Envoy's memory request unless a pod sets marin3r.3scale.net/resources.requests.memory.
    #[arg(long, value_name = "QUANTITY", value_parser = quantity)]
    sidecar_requests_memory: Option<String>,
    /// Envoy's CPU limit unless a pod sets marin3r.3scale.net/resources.limits.cpu.
    #[arg(long, value_name = "QUANTITY", value_parser = quantity)]
    sidecar_limits_cpu: Option<String>,
    /// Envoy's memory limit unless a pod sets marin3r.3scale.net/resources.limits.memory.
    #[arg(long, value_name = "QUANTITY", value_parser = quantity)]
    sidecar_limits_memory: Option<String>,
    /// A Secret added to every injected pod's imagePullSecrets (repeat for more).
    #[arg(long, value_name = "NAME")]
    sidecar_image_pull_secret: Vec<String>,
    /// Inject Envoy as a native sidecar (init container, restartPolicy Always) unless a pod
    /// sets marin3r.3scale.net/native-sidecar; auto: when the API server is 1.29 or newer.
    #[arg(long, value_name = "WHEN", default_value = "auto")]
    native_sidecars: NativeSidecars,
    /// In the classic layout, start pods' applications once Envoy is ready, unless a pod sets
    /// marin3r.3scale.net/hold-application-until-proxy-starts.
    #[arg(long)]
    hold_application_until_proxy_starts: bool,
    /// How injected Envoys speak ADS (sotw: state of the world; delta: incremental) unless a
    /// pod sets marin3r.3scale.net/xds-protocol.
    #[arg(long, value_name = "PROTOCOL", default_value = "sotw", value_parser = xds_protocol)]
    sidecar_xds_protocol: XdsProtocol,
    /// Annotate injected pods prometheus.io/scrape|port|path for Envoy's stats, unless a pod
    /// sets marin3r.3scale.net/prometheus-annotations (or has prometheus.io annotations).
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    sidecar_prometheus_annotations: bool,
}

fn xds_protocol(value: &str) -> Result<XdsProtocol, String> {
    XdsProtocol::parse(value)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum NativeSidecars {
    Auto,
    True,
    False,
}

fn quantity(value: &str) -> Result<String, String> {
    marin3r_webhook::parse_quantity(value).map(|_| value.to_owned())
}

/// The first Kubernetes minor version whose kubelet runs native sidecars by default (the
/// SidecarContainers feature, beta and on since 1.29).
const NATIVE_SIDECARS_SINCE: u32 = 29;

impl SidecarDefaultArgs {
    /// Writes the defaults into the webhook's injection settings; `auto` asks the API server
    /// its version.
    pub async fn apply(&self, client: &kube::Client, injection: &mut InjectionConfig) {
        let native = match self.native_sidecars {
            NativeSidecars::True => true,
            NativeSidecars::False => false,
            NativeSidecars::Auto => match client.apiserver_version().await {
                Ok(version) => {
                    let native = supports_native_sidecars(&version.major, &version.minor);
                    info!(
                        version = %version.git_version,
                        native,
                        "sidecar layout chosen by the API server's version"
                    );
                    native
                }
                Err(e) => {
                    warn!("the API server's version is unknown ({e}): classic sidecars");
                    false
                }
            },
        };
        self.configure(injection, native);
    }

    fn configure(&self, injection: &mut InjectionConfig, native: bool) {
        injection.envoy_image = self.sidecar_envoy_image.clone();
        injection.resources = Resources {
            requests_cpu: self.sidecar_requests_cpu.clone(),
            requests_memory: self.sidecar_requests_memory.clone(),
            limits_cpu: self.sidecar_limits_cpu.clone(),
            limits_memory: self.sidecar_limits_memory.clone(),
        };
        injection.image_pull_secrets = self.sidecar_image_pull_secret.clone();
        injection.hold_application = self.hold_application_until_proxy_starts;
        injection.prometheus_annotations = self.sidecar_prometheus_annotations;
        injection.native_sidecars = native;
        injection.xds_protocol = self.sidecar_xds_protocol;
    }
}

/// Whether a Kubernetes `major`.`minor` (as `/version` gives them: `"1"`, `"29+"`) runs
/// native sidecars.
fn supports_native_sidecars(major: &str, minor: &str) -> bool {
    let number = |s: &str| {
        s.trim_end_matches(|c: char| !c.is_ascii_digit())
            .parse::<u32>()
            .ok()
    };
    match (number(major), number(minor)) {
        (Some(1), Some(minor)) => minor >= NATIVE_SIDECARS_SINCE,
        (Some(major), _) => major > 1,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use marin3r_api::sidecar_defaults::SidecarDefaults;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: SidecarDefaultArgs,
    }

    /// The operator's flags for a DiscoveryService's `spec.sidecar` are flags the discovery
    /// pod takes, and they land in the webhook's settings.
    #[test]
    fn the_operators_flags_reach_the_injection_settings() {
        let spec: SidecarDefaults = serde_json::from_value(serde_json::json!({
            "image": "mirror.local/envoy:v1.40.0",
            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "256Mi"}},
            "imagePullSecrets": [{"name": "mirror"}, {"name": "other"}],
            "nativeSidecars": false,
            "holdApplicationUntilProxyStarts": true,
            "xdsProtocol": "delta",
            "prometheusAnnotations": false,
        }))
        .unwrap();
        let mut argv = vec!["discovery-service".to_owned()];
        argv.extend(spec.args().unwrap());
        let cli = <Cli as clap::Parser>::try_parse_from(argv).unwrap();
        assert_eq!(cli.args.native_sidecars, NativeSidecars::False);
        let mut injection = InjectionConfig::default();
        cli.args.configure(&mut injection, false);
        assert_eq!(injection.envoy_image, "mirror.local/envoy:v1.40.0");
        assert_eq!(
            injection.resources,
            Resources {
                requests_cpu: Some("100m".into()),
                requests_memory: Some("64Mi".into()),
                limits_cpu: Some("1".into()),
                limits_memory: Some("256Mi".into()),
            }
        );
        assert_eq!(injection.image_pull_secrets, ["mirror", "other"]);
        assert!(injection.hold_application && !injection.native_sidecars);
        assert_eq!(injection.xds_protocol, XdsProtocol::Delta);
        assert!(!injection.prometheus_annotations);
        // Nothing set: the webhook's own defaults, and the layout left to the API server.
        let cli = <Cli as clap::Parser>::try_parse_from(["discovery-service"]).unwrap();
        assert_eq!(cli.args.native_sidecars, NativeSidecars::Auto);
        let mut injection = InjectionConfig::default();
        cli.args.configure(&mut injection, true);
        let expected = InjectionConfig {
            native_sidecars: true,
            ..InjectionConfig::default()
        };
        assert_eq!(injection, expected);
    }

    #[test]
    fn native_from_1_29() {
        assert!(!supports_native_sidecars("1", "28"));
        assert!(supports_native_sidecars("1", "29"));
        assert!(supports_native_sidecars("1", "29+"));
        assert!(supports_native_sidecars("1", "37"));
        assert!(!supports_native_sidecars("", ""));
    }
}
