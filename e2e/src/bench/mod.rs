//! The benchmarks `hack/bench` runs. Each returns rows of one table; the binary prints them.

pub mod abuse;
pub mod admission;
pub mod certs;
pub mod convert;
pub mod soak;
pub mod validation;
pub mod xds;
pub mod xds_bound;

use std::time::Duration;

/// One line of the benchmark table.
#[derive(Debug, Clone)]
pub struct Row {
    pub benchmark: String,
    pub case: String,
    pub samples: usize,
    pub result: String,
}

/// Summary statistics of a set of timings.
#[derive(Debug, Clone, Copy)]
pub struct Stats {
    pub min: Duration,
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
}

impl Stats {
    /// Nearest-rank percentiles; `None` for no samples.
    pub fn of(samples: &[Duration]) -> Option<Self> {
        let mut sorted = samples.to_vec();
        sorted.sort();
        let rank = |p: usize| sorted[((sorted.len() * p).div_ceil(100)).saturating_sub(1)];
        (!sorted.is_empty()).then(|| Self {
            min: sorted[0],
            p50: rank(50),
            p99: rank(99),
            max: sorted[sorted.len() - 1],
        })
    }
}

/// A duration with a unit that keeps three significant digits readable.
pub fn human(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 1_000.0 {
        format!("{us:.1} µs")
    } else if us < 1_000_000.0 {
        format!("{:.2} ms", us / 1e3)
    } else {
        format!("{:.2} s", us / 1e6)
    }
}

/// A `/proc/<pid>/status` field of a process, in bytes (`VmRSS`, `VmHWM`).
pub fn process_memory(pid: u32, field: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no {field} in /proc/{pid}/status"))?;
    Ok(kb * 1024)
}

/// Bytes in MiB, for the tables.
pub fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1u32 << 20))
}

/// Renders rows as a Markdown table.
pub fn table(rows: &[Row]) -> String {
    let mut out = String::from("| benchmark | case | samples | result |\n|---|---|---:|---|\n");
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {} | {} |\n",
            r.benchmark, r.case, r.samples, r.result
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_nearest_rank() {
        let ms = |n| Duration::from_millis(n);
        let samples: Vec<Duration> = (1..=100).rev().map(ms).collect();
        let s = Stats::of(&samples).unwrap();
        assert_eq!(
            (s.min, s.p50, s.p99, s.max),
            (ms(1), ms(50), ms(99), ms(100))
        );
        let one = Stats::of(&[ms(7)]).unwrap();
        assert_eq!((one.p50, one.p99), (ms(7), ms(7)));
        assert!(Stats::of(&[]).is_none());
    }

    #[test]
    fn durations_print_in_a_readable_unit() {
        assert_eq!(human(Duration::from_micros(12)), "12.0 µs");
        assert_eq!(human(Duration::from_micros(1_500)), "1.50 ms");
        assert_eq!(human(Duration::from_millis(2_500)), "2.50 s");
    }
}
