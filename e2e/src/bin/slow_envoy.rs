//! `marin3r-slow-envoy`: the judge flood's stand-in Envoy (`hack/bench --only abuse`).
//! It answers `--version` as Envoy 1.40.0 and accepts every config, as Envoy's validate mode
//! says so; a config naming `bench-slow-judge` takes 5 s first. A compiled program, not a
//! script: the judge's sandbox lets the Envoy it runs read its own binary and the system
//! libraries, not a shell.

use std::time::Duration;

const SLOW_MARKER: &str = "bench-slow-judge";
const SLOW: Duration = Duration::from_secs(5);

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--version") {
        println!("marin3r-slow-envoy  version: 0/1.40.0/Clean/RELEASE/BoringSSL");
        return std::process::ExitCode::SUCCESS;
    }
    let config = args
        .iter()
        .position(|a| a == "-c")
        .and_then(|i| args.get(i + 1));
    let Some(config) = config else {
        eprintln!("marin3r-slow-envoy: no -c CONFIG");
        return std::process::ExitCode::FAILURE;
    };
    let text = std::fs::read_to_string(config).unwrap_or_default();
    if text.contains(SLOW_MARKER) {
        std::thread::sleep(SLOW);
    }
    println!("configuration '{config}' OK");
    std::process::ExitCode::SUCCESS
}
