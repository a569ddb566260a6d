//! `marin3r-bench`: runs the benchmarks and prints one Markdown table (see `hack/bench`).

use clap::Parser;

#[derive(Debug, Parser)]
#[command(about = "marin3r benchmarks; prints one Markdown table")]
struct Args {
    /// Multiply every benchmark's sample count (e.g. 0.1 for a quick run).
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.scale > 0.0, "--scale must be positive");
    let mut rows = Vec::new();
    rows.extend(marin3r_e2e::bench::certs::issuance(args.scale)?);
    rows.extend(marin3r_e2e::bench::convert::conversion(args.scale)?);
    print!("{}", marin3r_e2e::bench::table(&rows));
    Ok(())
}
