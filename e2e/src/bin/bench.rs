//! `marin3r-bench`: runs the benchmarks and prints one Markdown table (see `hack/bench`).

use clap::Parser;

#[derive(Debug, Parser)]
#[command(about = "marin3r benchmarks; prints one Markdown table")]
struct Args {
    /// Multiply every benchmark's sample count (e.g. 0.1 for a quick run).
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
    /// Run only these benchmarks (comma separated: certs, convert, admission, xds); all by
    /// default.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// The largest number of simulated Envoys in the xDS benchmark (100, 1000 or 10000).
    #[arg(long, default_value_t = 10_000)]
    xds_max_streams: usize,
    /// Internal: run the xDS bench server child with the TLS files of this folder.
    #[arg(long, hide = true)]
    xds_bench_server: Option<std::path::PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(dir) = &args.xds_bench_server {
        return marin3r_e2e::bench::xds::run_server(dir);
    }
    anyhow::ensure!(args.scale > 0.0, "--scale must be positive");
    let wanted = |name: &str| args.only.is_empty() || args.only.iter().any(|o| o == name);
    let mut rows = Vec::new();
    const ALL: [&str; 4] = ["certs", "convert", "admission", "xds"];
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
    if wanted("admission") {
        rows.extend(marin3r_e2e::bench::admission::admission(args.scale)?);
    }
    if wanted("xds") {
        rows.extend(marin3r_e2e::bench::xds::convergence(
            args.scale,
            args.xds_max_streams,
        )?);
    }
    print!("{}", marin3r_e2e::bench::table(&rows));
    Ok(())
}
