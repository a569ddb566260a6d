//! `marin3r-bench`: runs the benchmarks and prints one Markdown table (see `hack/bench`).

use clap::Parser;

#[derive(Debug, Parser)]
#[command(about = "marin3r benchmarks; prints one Markdown table")]
struct Args {
    /// Multiply every benchmark's sample count (e.g. 0.1 for a quick run).
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
    /// Run only these benchmarks (certs, convert, admission); all by default.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.scale > 0.0, "--scale must be positive");
    let mut rows = Vec::new();
    const ALL: [&str; 3] = ["certs", "convert", "admission"];
    let wanted = |name: &str| args.only.is_empty() || args.only.iter().any(|o| o == name);
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
    print!("{}", marin3r_e2e::bench::table(&rows));
    Ok(())
}
