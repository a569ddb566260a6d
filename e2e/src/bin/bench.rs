//! `marin3r-bench`: runs the benchmarks and prints one Markdown table (see `hack/bench`).

use clap::Parser;

#[derive(Debug, Parser)]
#[command(about = "marin3r benchmarks; prints one Markdown table")]
struct Args {
    /// Multiply every benchmark's sample count (e.g. 0.1 for a quick run).
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
    /// Run only these benchmarks (comma separated: certs, convert, validation, admission, xds,
    /// soak, abuse); all but soak and abuse by default. abuse mounts the review's N1 and N2 attacks
    /// on the release `marin3r discovery-service` (a few minutes).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// How long the soak churns pods, updates the EnvoyConfig and injects faults (e.g.
    /// `5m`, `90s`, `300`).
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    soak_duration: std::time::Duration,
    /// When the soak fails, write the logs of the operator, the discovery pods and the
    /// sidecars into this folder.
    #[arg(long)]
    soak_logs: Option<std::path::PathBuf>,
    /// The largest number of simulated Envoys in the xDS benchmark (100, 2000 or 10000).
    #[arg(long, default_value_t = 10_000)]
    xds_max_streams: usize,
    /// The ADS flavours of the xDS benchmark (comma separated: sotw, delta).
    #[arg(long, value_delimiter = ',', default_value = "sotw,delta")]
    xds_protocols: Vec<marin3r_e2e::bench::xds::Protocol>,
    /// Internal: run the xDS bench server child with the TLS files of this folder.
    #[arg(long, hide = true)]
    xds_bench_server: Option<std::path::PathBuf>,
    /// Internal: the number of proxies the xDS bench server is set up for.
    #[arg(long, hide = true, default_value_t = 10_000)]
    xds_bench_proxies: usize,
    /// Internal: run the xDS push bound's writer child with the TLS files of this folder.
    #[arg(long, hide = true)]
    xds_bound_server: Option<std::path::PathBuf>,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,marin3r_e2e::bench::soak=info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    if let Some(dir) = &args.xds_bench_server {
        return marin3r_e2e::bench::xds::run_server(dir, args.xds_bench_proxies);
    }
    if let Some(dir) = &args.xds_bound_server {
        return marin3r_e2e::bench::xds_bound::run_server(dir);
    }
    anyhow::ensure!(args.scale > 0.0, "--scale must be positive");
    // The soak needs root and minutes, the attacks minutes: only when asked for.
    let wanted = |name: &str| {
        (args.only.is_empty() && !["soak", "abuse"].contains(&name))
            || args.only.iter().any(|o| o == name)
    };
    let mut rows = Vec::new();
    const ALL: [&str; 7] = [
        "certs",
        "convert",
        "validation",
        "admission",
        "xds",
        "soak",
        "abuse",
    ];
    if let Some(unknown) = args.only.iter().find(|o| !ALL.contains(&o.as_str())) {
        anyhow::bail!(
            "unknown benchmark {unknown:?}: expected one of {}",
            ALL.join(", ")
        );
    }
    if wanted("certs") {
        rows.extend(marin3r_e2e::bench::certs::issuance(args.scale)?);
    }
    if wanted("convert") {
        rows.extend(marin3r_e2e::bench::convert::conversion(args.scale)?);
    }
    if wanted("validation") {
        rows.extend(marin3r_e2e::bench::validation::validation(args.scale)?);
    }
    if wanted("admission") {
        rows.extend(marin3r_e2e::bench::admission::admission(args.scale)?);
    }
    if wanted("xds") {
        rows.extend(marin3r_e2e::bench::xds::convergence(
            args.scale,
            args.xds_max_streams,
            &args.xds_protocols,
        )?);
    }
    if wanted("abuse") {
        rows.extend(marin3r_e2e::bench::abuse::abuse(args.scale)?);
    }
    let mut failures = Vec::new();
    if wanted("soak") {
        let mut config = marin3r_e2e::bench::soak::SoakConfig::new(args.soak_duration);
        config.log_dir = args.soak_logs.clone();
        let outcome = marin3r_e2e::bench::soak::soak(&config)?;
        rows.extend(outcome.rows);
        failures = outcome.failures;
    }
    print!("{}", marin3r_e2e::bench::table(&rows));
    if !failures.is_empty() {
        for f in &failures {
            eprintln!("soak: LOST: {f}");
        }
        anyhow::bail!("the soak lost something: {} failure(s)", failures.len());
    }
    Ok(())
}

/// `300`, `300s`, `5m` or `1h`.
fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let (number, unit) = text
        .find(|c: char| !c.is_ascii_digit())
        .map_or((text, ""), |i| text.split_at(i));
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?}: expected a number of seconds, or with s, m or h"))?;
    let seconds = match unit {
        "" | "s" => n,
        "m" => n.saturating_mul(60),
        "h" => n.saturating_mul(3600),
        _ => return Err(format!("{text:?}: unknown unit {unit:?} (s, m or h)")),
    };
    Ok(std::time::Duration::from_secs(seconds))
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations_take_a_unit_or_seconds() {
        assert_eq!(parse_duration("300"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert!(
            parse_duration("5 minutes")
                .unwrap_err()
                .contains("unknown unit")
        );
        assert!(
            parse_duration("m")
                .unwrap_err()
                .contains("expected a number")
        );
    }
}
